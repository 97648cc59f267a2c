"""The client driver's protocol and bookkeeping, without vLLM: a stand-in client speaks the driver's lines."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from harness.bench import TIMINGS_FILE, BenchJob, read_tokens, run_jobs
from harness.bench_driver import capture_streams, parse_stream, reuse_tokenizers, write_tokens
from harness.config import BenchmarkConfig, Cell
from harness.errors import BenchmarkFailed, HarnessError, MalformedBenchResult, ServerCrashed


def test_each_tokenizer_is_loaded_once_per_client_process() -> None:
    loads: list[tuple[object, dict[str, object]]] = []
    serve = ModuleType("serve")
    serve.get_tokenizer = lambda name, **kw: loads.append((name, kw)) or object()  # type: ignore[attr-defined]
    reuse_tokenizers(serve)
    first = serve.get_tokenizer("/m/e2b", tokenizer_mode="auto", trust_remote_code=False)
    again = serve.get_tokenizer("/m/e2b", tokenizer_mode="auto", trust_remote_code=False)
    other_mode = serve.get_tokenizer("/m/e2b", tokenizer_mode="slow", trust_remote_code=False)
    other_model = serve.get_tokenizer("/m/tiny", tokenizer_mode="auto", trust_remote_code=False)
    assert first is again and other_mode is not first and other_model is not first
    assert [name for name, _ in loads] == ["/m/e2b", "/m/e2b", "/m/tiny"]    # one load per (name, options)


# Reads the job list as the real driver does, and per job: READY, waits for "go i" (or "skip i"), START, sleeps,
# writes a result the harness accepts, DONE. A server on port 666 reports twice the output tokens it served; one
# on port 667 has died (the job fails).
STAND_IN = textwrap.dedent("""
    import json, sys, time
    jobs = json.load(open(sys.argv[-1]))
    for i, argv in enumerate(jobs):
        opt = {argv[k]: argv[k + 1] for k in range(len(argv) - 1) if argv[k].startswith("--")}
        print(f"RATCHET_JOB_READY {i}", flush=True)
        answer = sys.stdin.readline().strip()
        if answer == f"skip {i}":
            print(f"RATCHET_JOB_SKIPPED {i}", flush=True)
            continue
        assert answer == f"go {i}"
        print(f"RATCHET_JOB_START {i}", flush=True)
        time.sleep(0.3)
        if opt["--base-url"].endswith(":667"):      # its server is gone: the real driver's bench_main raises
            print(f"RATCHET_JOB_FAILED {i}", flush=True)
            continue
        n, out = int(opt["--num-prompts"]), int(opt.get("--random-output-len") or opt["--custom-output-len"])
        out *= 2 if opt["--base-url"].endswith(":666") else 1
        result = {"duration": 0.25, "completed": n, "total_input_tokens": 32 * n, "total_output_tokens": n * out}
        result |= {k: 1.0 for k in ("request_throughput", "output_throughput", "total_token_throughput",
                   "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                   "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms")}
        with open(opt["--result-dir"] + "/" + opt["--result-filename"], "w") as f:
            json.dump(result, f)
        if "--logprobs" in opt:     # what the real driver captures: each request's tokens, logprobs and top-k
            one = {"token_ids": [5] * out, "logprobs": [-0.1] * out, "top_logprobs": [[[5, -0.1], [6, -3.0]]] * out}
            with open(opt["--result-dir"] + "/" + opt["--result-filename"] + ".tokens.json", "w") as f:
                json.dump({"requests": [one] * n}, f)
        print(f"RATCHET_JOB_DONE {i}", flush=True)
""")


def _stand_in_python(folder: Path) -> Path:
    """An interpreter that runs the stand-in client whatever module it is asked for (run_jobs's `python`)."""
    script = folder / "client.py"
    script.write_text(STAND_IN)
    python = folder / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_a_job_list_leaves_one_timing_line_per_run_splitting_freeze_client_and_checks(tmp_path: Path) -> None:
    python = _stand_in_python(tmp_path)
    config = BenchmarkConfig(input_lens=[32], output_lens=[4], num_prompts=4, max_concurrency=4, repeats=4)
    cell = Cell(input_len=32, output_len=4)
    jobs = [BenchJob(cell=cell, base_url="http://127.0.0.1:1", model_name="m", tokenizer=tmp_path, tag=tag,
                     repeat=r) for r in range(2) for tag in ("A", "B")]
    frozen: list[str] = []

    def freeze(job: BenchJob) -> None:
        frozen.append(job.tag)
        __import__("time").sleep(0.1)

    runs = run_jobs(jobs, config, work_dir=tmp_path / "bench", python=str(python), before_job=freeze)
    assert [r.job.tag for r in runs] == ["A", "B", "A", "B"] and frozen == ["A", "B", "A", "B"]
    lines = [json.loads(line) for line in (tmp_path / "bench" / TIMINGS_FILE).read_text().splitlines()]
    assert [(t["job"], t["tag"], t["repeat"]) for t in lines] == [
        ("job0000.json", "A", 0), ("job0001.json", "B", 0), ("job0002.json", "A", 1), ("job0003.json", "B", 1)]
    for t in lines:
        assert t["cell"] == cell.label and t["measured_s"] == 0.25
        assert 0.1 <= t["freeze_s"] < 1.0           # the harness's freezing of the other servers
        assert 0.3 <= t["client_s"] < 2.0           # go to done, as the harness's clock saw it
        assert 0.0 <= t["checks_s"] < 1.0


def test_the_duration_check_starts_at_the_runs_first_measured_request_not_before_its_warm_ups(tmp_path: Path) -> None:
    """A cold server's warm-ups (about 20 s on a 2-core host) happen after "go" and outside the client's own duration:
    the harness's clock for the check starts when the driver says the first measured request went out."""
    python = _stand_in_python(tmp_path)
    (tmp_path / "client.py").write_text(STAND_IN.replace(
        '    print(f"RATCHET_JOB_START {i}", flush=True)\n',
        '    print(f"RATCHET_JOB_START {i}", flush=True)\n    time.sleep(3.0)\n'
        '    print("RATCHET_RUN_MEASURED", flush=True)\n'))
    config = BenchmarkConfig(input_lens=[32], output_lens=[4], num_prompts=4, max_concurrency=4, repeats=4)
    job = BenchJob(cell=Cell(input_len=32, output_len=4), base_url="http://127.0.0.1:1", model_name="m",
                   tokenizer=tmp_path, tag="A", repeat=0)
    [run] = run_jobs([job], config, work_dir=tmp_path / "bench", python=str(python))
    timing = json.loads((tmp_path / "bench" / TIMINGS_FILE).read_text())
    assert timing["client_s"] >= 3.0 and 0.2 <= run.wall_s < 2.5    # the warm-up is the client's, not the run's


def test_a_build_whose_runs_fail_their_checks_is_failed_alone_and_its_later_runs_skipped(tmp_path: Path) -> None:
    """In a comparison of several candidates, one whose server miscounts the tokens it served fails by itself:
    the incumbent and the other candidates are measured to the end; its own later runs are not sent."""
    python = _stand_in_python(tmp_path)
    config = BenchmarkConfig(input_lens=[32], output_lens=[4], num_prompts=4, max_concurrency=4, repeats=3)
    cell = Cell(input_len=32, output_len=4)
    urls = {"A": "http://127.0.0.1:1", "B1": "http://127.0.0.1:666", "B2": "http://127.0.0.1:3",
            "B3": "http://127.0.0.1:667"}
    jobs = [BenchJob(cell=cell, base_url=url, model_name="m", tokenizer=tmp_path, tag=tag, repeat=r)
            for r in range(3) for tag, url in urls.items()]
    let_go: list[str] = []

    def check_alive(job: BenchJob) -> None:
        if job.tag == "B3":
            raise ServerCrashed("B3: server exited with code -9 (killed)")

    failed: dict[str, HarnessError] = {}
    runs = run_jobs(jobs, config, work_dir=tmp_path / "bench", python=str(python), check_alive=check_alive,
                    before_job=lambda job: let_go.append(job.tag), failed=failed)
    assert [r.job.tag for r in runs] == ["A", "B2", "A", "B2", "A", "B2"]
    assert sorted(failed) == ["B1", "B3"]
    assert "reported 32 output tokens for 4 requests of exactly 4" in str(failed["B1"])
    assert isinstance(failed["B3"], ServerCrashed)                  # a dead server is named as such
    assert let_go == ["A", "B1", "B2", "B3", "A", "B2", "A", "B2"]  # B1 and B3 ran once, then were passed over

    # without `failed` (one build measured alone, or a caller that cannot drop one): the run's failure is raised
    with pytest.raises(BenchmarkFailed, match="reported 32 output tokens"):
        run_jobs(jobs, config, work_dir=tmp_path / "bench2", python=str(python))
    # the reference build's failure is raised at once: every other build is judged against its runs
    with pytest.raises(ServerCrashed, match="B3: server exited"):
        run_jobs(jobs, config, work_dir=tmp_path / "bench3", python=str(python), check_alive=check_alive,
                 failed={}, reference="B3")


def test_the_campaign_cost_script_splits_a_runs_time_from_the_timings(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[2] / "experiments"))
    from campaign_time import run_costs

    assert run_costs(tmp_path) == {}               # a log from before the timings: no `runs` section
    bench = tmp_path / "runs" / "it001" / "bench"
    bench.mkdir(parents=True)
    rows = [{"job": "job0000.json", "tag": "A", "cell": "in512/out256", "repeat": 0, "freeze_s": 0.2,
             "client_s": 7.0, "measured_s": 5.0, "checks_s": 0.1},
            {"job": "job0001.json", "tag": "B", "cell": "in512/out256", "repeat": 0, "freeze_s": 0.4,
             "client_s": 6.0, "measured_s": 5.0, "checks_s": 0.3}]
    (bench / TIMINGS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_costs(tmp_path) == {"runs": {"count": 2, "mean_freeze_s": 0.3, "mean_client_s": 6.5,
                                            "mean_measured_s": 5.0, "mean_client_setup_s": 1.5,
                                            "mean_checks_s": 0.2}}


# --- the benchmark's own logprobs, kept per request by the driver -----------------------------------------------

def _sse(ids: list[int], logprobs: list[float]) -> str:
    """One streamed completions message carrying `ids` (return_tokens_as_token_ids) with top-2 logprobs."""
    tops = [{f"token_id:{t}": lp, f"token_id:{t + 1}": lp - 7.0} for t, lp in zip(ids, logprobs, strict=True)]
    body = {"choices": [{"text": "x", "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                                   "token_logprobs": logprobs, "top_logprobs": tops}}]}
    return "data: " + json.dumps(body)


def test_a_stream_becomes_each_tokens_id_logprob_and_ranked_top_k() -> None:
    usage = 'data: {"choices": [], "usage": {"completion_tokens": 3}}'
    parsed = parse_stream([_sse([7], [-0.5]), _sse([8, 9], [-0.25, -0.125]), usage, "data: [DONE]"])
    assert parsed["token_ids"] == [7, 8, 9] and parsed["logprobs"] == [-0.5, -0.25, -0.125]
    assert parsed["top_logprobs"][1] == [[8.0, -0.25], [9.0, -7.25]]      # best first


def test_only_identified_requests_are_kept_and_written_in_request_order(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The client's warm-ups and first test request carry no id (not measured, not kept); the dataset numbers
    the measured ones prefix + index, and they finish in any order."""
    class Handler:
        def add_chunk(self, chunk: bytes) -> list[str]:
            return [chunk.decode()]

    async def request(request_func_input: Any, session: Any, pbar: Any = None) -> str:
        handler = Handler()
        for message in request_func_input.messages:
            await asyncio.sleep(0.001 * request_func_input.delay)
            handler.add_chunk(message.encode())
        return "output"

    lib = ModuleType("lib")
    lib.StreamedResponseHandler = Handler  # type: ignore[attr-defined]
    funcs: dict[str, Any] = {"vllm": request, "openai": request, "openai-chat": request}
    capture = capture_streams(lib, funcs)

    async def run() -> None:
        asks = [SimpleNamespace(request_id="bench-1-1", messages=[_sse([5], [-0.1])], delay=1),
                SimpleNamespace(request_id="bench-1-0", messages=[_sse([4], [-0.2]), _sse([6], [-0.3])], delay=3),
                SimpleNamespace(request_id=None, messages=[_sse([9], [-0.9])], delay=0)]
        assert await asyncio.gather(*(funcs["vllm"](ask, None) for ask in asks)) == ["output"] * 3

    asyncio.run(run())
    assert sorted(capture.streams) == ["bench-1-0", "bench-1-1"]
    write_tokens(capture.streams, "bench-1-", str(tmp_path / "job.json.tokens.json"))
    written = json.loads((tmp_path / "job.json.tokens.json").read_text())["requests"]
    assert [r["token_ids"] for r in written] == [[4, 6], [5]]
    # chat requests (pictures) are scored against their answers, not captured: only their first says the run began
    assert funcs["openai-chat"] is not request and capture.measured
    capture.reset()
    asyncio.run(funcs["openai-chat"](SimpleNamespace(request_id="bench-2-0", messages=[_sse([7], [-0.1])], delay=0),
                                     None))
    assert capture.streams == {} and capture.measured
    assert capsys.readouterr().out.count("RATCHET_RUN_MEASURED") == 2     # once per run


def test_a_run_whose_server_streamed_fewer_logprobs_than_tokens_fails_naming_the_request(tmp_path: Path) -> None:
    cell = Cell(input_len=32, output_len=2)
    job = BenchJob(cell=cell, base_url="http://x", model_name="m", tokenizer=tmp_path, tag="B", repeat=1)
    whole = {"token_ids": [4, 5], "logprobs": [-0.1, -0.2], "top_logprobs": [[[4, -0.1], [3, -5.0]]] * 2}
    short = {**whole, "logprobs": [-0.1]}
    path = tmp_path / "job.json.tokens.json"
    path.write_text(json.dumps({"requests": [whole, short]}))
    with pytest.raises(BenchmarkFailed, match="request 1 streamed 2 token ids, 1 logprobs"):
        read_tokens(path, job, 2, 2)
    path.write_text(json.dumps({"requests": [whole]}))
    with pytest.raises(BenchmarkFailed, match="request 1's tokens and logprobs were not streamed"):
        read_tokens(path, job, 2, 2)
    with pytest.raises(MalformedBenchResult, match="no readable token capture"):
        read_tokens(tmp_path / "absent.json", job, 2, 2)
    path.write_text(json.dumps({"requests": [whole, whole]}))
    assert [t.token_ids for t in read_tokens(path, job, 2, 2)] == [(4, 5), (4, 5)]
