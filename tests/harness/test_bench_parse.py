from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench import BenchJob, parse_result
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
