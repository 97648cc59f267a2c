from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench import BenchJob, BenchResult, CellRun, mismatched_inputs, parse_result
from harness.config import Cell
from harness.errors import BenchmarkFailed, MalformedBenchResult

JOB = BenchJob(cell=Cell(input_len=8, output_len=4), base_url="http://x", model_name="m", tokenizer=Path("."),
               tag="A", repeat=0)
GOOD = {
    "duration": 2.0, "completed": 4, "failed": 0, "total_input_tokens": 32, "total_output_tokens": 16,
    "request_throughput": 2.0, "output_throughput": 8.0, "total_token_throughput": 24.0,
    **{f"{s}_{m}_ms": 1.0 for s in ("mean", "median", "p99") for m in ("ttft", "tpot", "itl", "e2el")},
}


def test_a_complete_result_parses_and_derives_prefill_throughput(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    result = parse_result(path, JOB, num_prompts=4)
    assert result.prefill_tok_s == 16.0 and result.total_token_throughput == 24.0


def test_a_missing_file_says_where_to_look(tmp_path: Path) -> None:
    with pytest.raises(MalformedBenchResult, match="wrote no result"):
        parse_result(tmp_path / "absent.json", JOB, num_prompts=4)


def test_truncated_json_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(GOOD)[:40])
    with pytest.raises(MalformedBenchResult):
        parse_result(path, JOB, num_prompts=4)


def test_a_result_missing_a_metric_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "p99_e2el_ms"}))
    with pytest.raises(MalformedBenchResult, match="p99_e2el_ms"):
        parse_result(path, JOB, num_prompts=4)


def test_failed_requests_fail_the_run(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**GOOD, "completed": 3, "failed": 1}))
    with pytest.raises(BenchmarkFailed, match="1 of 4 requests failed"):
        parse_result(path, JOB, num_prompts=4)


def test_output_tokens_the_request_did_not_ask_for_fail_the_run(tmp_path: Path) -> None:
    """The client counts throughput with the server's own usage counts; with EOS ignored each request returns
    exactly its output length, so a server (or a candidate's code inside it) that reports more, or fewer, fails."""
    for reported in (17, 32, 15):
        path = tmp_path / "r.json"
        path.write_text(json.dumps({**GOOD, "total_output_tokens": reported}))
        with pytest.raises(BenchmarkFailed, match=f"reported {reported} output tokens for 4 requests of exactly 4"):
            parse_result(path, JOB, num_prompts=4)


def _run(tag: str, repeat: int, input_tokens: int, cell: Cell = JOB.cell) -> CellRun:
    job = BenchJob(cell=cell, base_url="http://x", model_name="m", tokenizer=Path("."), tag=tag, repeat=repeat)
    return CellRun(job=job, result=BenchResult.model_validate({**GOOD, "total_input_tokens": input_tokens}), wall_s=2.0)


def test_a_build_whose_server_counts_other_prompt_tokens_than_the_reference_is_named() -> None:
    other = Cell(input_len=16, output_len=4)
    runs = [_run("A", 0, 32), _run("B1", 0, 32), _run("B2", 0, 32),
            _run("A", 1, 33), _run("B1", 1, 33), _run("B2", 1, 66),          # B2 doubles its prompt count
            _run("A", 0, 64, other), _run("B1", 0, 64, other), _run("B2", 0, 64, other)]
    failed = mismatched_inputs(runs, reference="A")
    assert list(failed) == ["B2"]
    assert "66 prompt tokens for the prompts A's server counted as 33" in str(failed["B2"])
    assert mismatched_inputs([r for r in runs if r.job.tag != "B2"], reference="A") == {}


def test_a_candidate_with_an_error_gets_no_ratios_even_when_its_runs_were_measured() -> None:
    """A comparison that names a candidate's miscounted tokens keeps its error: the ratios its runs would give
    (here twice A's throughput, from twice the prompt tokens) are never a verdict's input."""
    from harness.config import StatsConfig
    from harness.measure import Build, GridResult, _arm_result

    def grid(tag: str, input_tokens: int) -> GridResult:
        return GridResult(build=Build(tag=tag, tree=Path("."), engine_args={}), startup_s=1.0, evidence={},
                          runs=[_run(tag, r, input_tokens) for r in range(4)])

    a, b = grid("A", 32), grid("B", 64)
    error = mismatched_inputs([*a.runs, *b.runs], reference="A")["B"]
    judged = _arm_result(a, b, None, [JOB.cell], StatsConfig(), error=error)
    assert judged.error is error and judged.overall is None and judged.cells == {}
    assert _arm_result(a, b, None, [JOB.cell], StatsConfig()).overall is not None    # without the error: ratios
