"""Benchmark cells with the pristine `vllm bench serve` client and parse its --save-result JSON.

"Prefill" throughput is measured, not derived: a cell with output length 1 is a prefill-only run,
and its throughput is input tokens / wall time of that run (reported as `prefill_tok_s`).

Every run saves its requests' generated texts (`--save-detailed`): harness/workload.py compares them
between the two builds of an A/B, request by request. With `benchmark.dataset: copy-task` the harness
writes each (cell, repeat)'s prompts itself (harness/datasets.py), so it knows what every request asked.
The client's reported duration is checked against the harness's own clock around the run.

Every request is greedy (`benchmark.temperature` 0: the client no longer asks for it by default, and the server's
default is 1.0, which sampled the benchmark's outputs at random; dummy-weight specs keep the server's default).
Text requests also ask for top-k logprobs with token ids (`benchmark.logprobs`); the driver keeps them per request
(harness/bench_driver.py) and a run whose server returns fewer logprob positions than tokens it was asked for fails
its checks: a build cannot opt out of being compared.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.bench_driver import MEASURED_LINE, TOKENS_SUFFIX
from harness.config import BenchmarkConfig, Cell
from harness.datasets import write_copy_task, write_read_task
from harness.errors import BenchmarkFailed, HarnessError, MalformedBenchResult

__all__ = ["TIMINGS_FILE", "BenchJob", "BenchResult", "CellRun", "RequestTokens", "run_jobs", "job_argv",
           "read_tokens"]


class BenchResult(BaseModel):
    """The fields of vLLM's --save-result JSON the harness relies on (others are kept as raw)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    duration: float
    completed: int
    failed: int = 0
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    p99_e2el_ms: float

    @property
    def prefill_tok_s(self) -> float:
        return self.total_input_tokens / self.duration


SUMMARY_FIELDS = (
    "total_token_throughput", "output_throughput", "request_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
)


@dataclass(frozen=True)
class BenchJob:
    cell: Cell
    base_url: str
    model_name: str
    tokenizer: Path
    tag: str               # which build ("A", "B", "baseline"...), for the record
    repeat: int
    first_of_cell: bool = True   # this server's first run of this cell (BenchmarkConfig.warm_up)


@dataclass(frozen=True)
class RequestTokens:
    """One benchmark request's generated tokens as its server streamed them, with their logprobs."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]                          # each generated token's own
    top: tuple[tuple[tuple[int, float], ...], ...]       # per position: the top-k (id, logprob), best first

    def margin(self, position: int) -> float | None:
        top = self.top[position] if position < len(self.top) else ()
        return top[0][1] - top[1][1] if len(top) >= 2 else None


@dataclass(frozen=True)
class CellRun:
    job: BenchJob
    result: BenchResult
    wall_s: float
    prompts: tuple[str, ...] = ()       # copy-task: the prompt of each request, in order; random: unknown
    answers: tuple[tuple[str, ...], ...] = ()   # read-task: each request's right output (its picture says it)
    tokens: tuple[RequestTokens, ...] = ()       # benchmark.logprobs: each request's tokens and logprobs, in order

    @property
    def texts(self) -> tuple[str, ...]:
        """Each request's generated text, in request order (the client keeps it)."""
        return tuple(str(t) for t in (self.result.model_extra or {}).get("generated_texts") or ())

    def metrics(self) -> dict[str, float]:
        out = {k: float(getattr(self.result, k)) for k in SUMMARY_FIELDS}
        out["prefill_tok_s"] = self.result.prefill_tok_s
        if self.job.cell.has_images:
            # The chat endpoint reports each request's prompt tokens as the model saw them (image tokens included):
            # the client's input count is text + image tokens, and prefill throughput counts both.
            per_request = self.result.total_input_tokens / max(1, self.result.completed)
            out["input_tokens_per_request"] = per_request
            out["image_tokens_per_request"] = per_request - self.job.cell.input_len
        return out


def dataset_path(job: BenchJob, result_dir: Path) -> Path:
    """One prompt file per (cell, repeat): both builds of an A/B read the same requests."""
    cell = job.cell
    media = f"-img{cell.images}x{cell.image_size}" if cell.has_images else ""
    return result_dir / f"prompts-in{cell.input_len}-out{cell.output_len}{media}-r{job.repeat}.jsonl"


def _image_dataset_argv(job: BenchJob, config: BenchmarkConfig, result_dir: Path) -> list[str]:
    """Image cells go through the chat endpoint (the server's chat template places the pictures)."""
    assert config.images is not None
    cell = job.cell
    chat = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"]
    if config.images.dataset == "read-task":
        # The client inlines each picture (base64): the server never reads a file or fetches a URL.
        return [*chat, "--dataset-name", "custom_image", "--dataset-path", str(dataset_path(job, result_dir)),
                "--custom-output-len", str(cell.output_len), "--disable-shuffle", "--custom-ensure-client-side-data"]
    return [*chat, "--dataset-name", "random-mm", "--random-input-len", str(cell.input_len),
            "--random-output-len", str(cell.output_len), "--random-range-ratio", "0",
            "--random-mm-base-items-per-request", str(cell.images), "--random-mm-num-mm-items-range-ratio", "0",
            "--random-mm-limit-mm-per-prompt", json.dumps({"image": cell.images, "video": 0}),
            "--random-mm-bucket-config", f"{{({cell.image_size}, {cell.image_size}, 1): 1.0}}"]


def warmups(job: BenchJob, config: BenchmarkConfig) -> int:
    return config.num_warmups if config.warm_up == "every_run" or job.first_of_cell else 0


def captures_tokens(job: BenchJob, config: BenchmarkConfig) -> bool:
    """Text requests go to the completions endpoint, whose logprobs name token ids; image cells are scored
    against their pictures' answers instead."""
    return config.logprobs is not None and not job.cell.has_images


def job_argv(job: BenchJob, config: BenchmarkConfig, result_dir: Path, filename: str) -> list[str]:
    logprobs = (["--logprobs", str(config.logprobs), "--extra-body", json.dumps({"return_tokens_as_token_ids": True})]
                if captures_tokens(job, config) else [])
    temperature = ["--temperature", f"{config.temperature:g}"] if config.temperature is not None else []
    if job.cell.has_images:
        dataset = _image_dataset_argv(job, config, result_dir)
    elif config.dataset == "copy-task":
        dataset = ["--backend", "vllm", "--dataset-name", "custom", "--dataset-path",
                   str(dataset_path(job, result_dir)), "--custom-output-len", str(job.cell.output_len),
                   "--skip-chat-template", "--disable-shuffle"]
    else:
        dataset = ["--backend", "vllm", "--dataset-name", "random", "--random-input-len", str(job.cell.input_len),
                   "--random-output-len", str(job.cell.output_len), "--random-range-ratio", "0"]
    return [
        "--base-url", job.base_url, "--model", job.model_name,
        "--tokenizer", str(job.tokenizer), *dataset, "--num-prompts", str(config.prompts_for(job.cell)),
        "--max-concurrency", str(config.max_concurrency), "--num-warmups", str(warmups(job, config)),
        "--ignore-eos", *temperature, *logprobs, "--seed", str(config.seed + job.repeat), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", filename,
    ]


def _write_datasets(jobs: Sequence[BenchJob], config: BenchmarkConfig, work_dir: Path
                    ) -> dict[Path, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]:
    """The prompt files the harness writes: per path, each request's prompt and (read-task) right answer."""
    out: dict[Path, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {}
    for job in jobs:
        path = dataset_path(job, work_dir)
        if path in out:
            continue
        count = config.prompts_for(job.cell)
        if job.cell.has_images:
            if config.images is not None and config.images.dataset == "read-task":
                reqs = write_read_task(path, job.cell, count, seed=config.seed, repeat=job.repeat)
                out[path] = (tuple(r.text for r in reqs), tuple(tuple(r.answer(job.cell.output_len)) for r in reqs))
        elif config.dataset == "copy-task":
            out[path] = (tuple(write_copy_task(path, job.cell, count, seed=config.seed, repeat=job.repeat)), ())
    return out


# The client's own duration must fit inside the harness's clock from the run's first measured request (the driver's
# MEASURED_LINE; "go" for a client that does not say it) to "done" (plus scheduling slack), and may not be
# implausibly shorter: the client's start-up and its warm-ups happen before, so what remains is the run.
DURATION_SLACK_S = 2.0
TIMINGS_FILE = "timings.jsonl"


def check_duration(run: CellRun) -> None:
    """A client that reports a shorter run than the harness timed (a patched client, a clock trick) fails."""
    reported = run.result.duration
    if reported > run.wall_s + DURATION_SLACK_S or reported < 0.5 * run.wall_s - 5 * DURATION_SLACK_S:
        raise BenchmarkFailed(
            f"{run.job.tag} {run.job.cell.label} repeat {run.job.repeat}: the client reported {reported:.2f} s, "
            f"the harness timed {run.wall_s:.2f} s from its first measured request to done: the measurement is not "
            "trustworthy")


def parse_result(path: Path, job: BenchJob, num_prompts: int) -> BenchResult:
    try:
        raw = json.loads(path.read_text())
        result = BenchResult.model_validate(raw)
    except FileNotFoundError as exc:
        raise MalformedBenchResult(f"benchmark wrote no result at {path}; see the client log beside it") from exc
    except json.JSONDecodeError as exc:
        raise MalformedBenchResult(f"{path} is not JSON ({exc}); the client was probably killed mid-write") from exc
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise MalformedBenchResult(f"{path} is not a vllm bench result: {problems}") from exc
    if result.failed or result.completed != num_prompts:
        raise BenchmarkFailed(
            f"{job.tag} {job.cell.label}: {result.failed} of {num_prompts} requests failed "
            f"({result.completed} completed); read the server log"
        )
    # The client counts throughput with the token counts the server under test reports (its usage block): code
    # a candidate ships could inflate them. Output lengths are fixed by the request (EOS ignored), so exact.
    expected = num_prompts * job.cell.output_len
    if result.total_output_tokens != expected:
        raise BenchmarkFailed(
            f"{job.tag} {job.cell.label}: the server reported {result.total_output_tokens} output tokens for "
            f"{num_prompts} requests of exactly {job.cell.output_len} (EOS ignored), not {expected}: throughput "
            "counted from wrong token counts is not measured")
    return result


def read_tokens(path: Path, job: BenchJob, num_prompts: int, top_k: int) -> tuple[RequestTokens, ...]:
    """The run's captured requests (harness/bench_driver.py), checked complete: every request, every generated
    position with its logprob and top-k. The server under test writes what the client captured, so a build that
    leaves logprobs out (or streams fewer than it generated) fails the run rather than escaping the comparison."""
    where = f"{job.tag} {job.cell.label} repeat {job.repeat}"
    try:
        requests = json.loads(path.read_text())["requests"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MalformedBenchResult(f"{where}: no readable token capture at {path} ({exc})") from exc
    out = []
    for index in range(num_prompts):
        entry = requests[index] if index < len(requests) else None
        if not isinstance(entry, dict):
            raise BenchmarkFailed(f"{where}: request {index}'s tokens and logprobs were not streamed")
        try:
            ids = tuple(int(t) for t in entry["token_ids"])
            logprobs = tuple(float(v) for v in entry["logprobs"])
            top = tuple(tuple((int(i), float(v)) for i, v in pos) for pos in entry["top_logprobs"])
        except (KeyError, TypeError, ValueError):
            raise BenchmarkFailed(f"{where}: request {index}'s tokens and logprobs were not streamed") from None
        want = job.cell.output_len
        if not (len(ids) == len(logprobs) == len(top) == want) or any(len(pos) < 2 for pos in top):
            raise BenchmarkFailed(
                f"{where}: request {index} streamed {len(ids)} token ids, {len(logprobs)} logprobs and {len(top)} "
                f"top-{top_k} lists for {want} generated tokens: its outputs cannot be compared, so it is not measured")
        out.append(RequestTokens(token_ids=ids, logprobs=logprobs, top=top))
    return tuple(out)


def mismatched_inputs(runs: Sequence[CellRun], reference: str) -> dict[str, BenchmarkFailed]:
    """Builds whose server reported other prompt-token totals than the `reference` build's for the same cell and
    repeat. Every build of a comparison is sent the same prompts and serves the same tokenizer, so the totals
    must agree; the server's count is what prefill and total throughput divide (a tokenizer's special tokens
    and a random prompt's re-encoding make the absolute count uncheckable, the agreement is not)."""
    sent = {(run.job.cell, run.job.repeat): run.result.total_input_tokens for run in runs if run.job.tag == reference}
    failed: dict[str, BenchmarkFailed] = {}
    for run in runs:
        want = sent.get((run.job.cell, run.job.repeat))
        if run.job.tag in failed or want is None or run.result.total_input_tokens == want:
            continue
        failed[run.job.tag] = BenchmarkFailed(
            f"{run.job.tag} {run.job.cell.label} repeat {run.job.repeat}: the server reported "
            f"{run.result.total_input_tokens} prompt tokens for the prompts {reference}'s server counted as {want}: "
            "throughput counted from wrong token counts is not measured")
    return failed


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _finished_run(job: BenchJob, config: BenchmarkConfig, path: Path, *, started: float,
                  written: tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]) -> CellRun:
    """A run the client reported done, read back and checked: its result and counts, its token capture, its clock."""
    result = parse_result(path, job, config.prompts_for(job.cell))
    tokens = read_tokens(path.with_name(path.name + TOKENS_SUFFIX), job, config.prompts_for(job.cell),
                         config.logprobs or 0) if captures_tokens(job, config) else ()
    run = CellRun(job=job, result=result, wall_s=time.monotonic() - started, prompts=written[0], answers=written[1],
                  tokens=tokens)
    check_duration(run)
    return run


def run_jobs(jobs: Sequence[BenchJob], config: BenchmarkConfig, *, work_dir: Path,
             python: str = sys.executable, on_done: Callable[[CellRun], None] | None = None,
             check_alive: Callable[[BenchJob], None] | None = None,
             before_job: Callable[[BenchJob], None] | None = None,
             failed: dict[str, HarnessError] | None = None, reference: str | None = None) -> list[CellRun]:
    """Run jobs in the given order (the caller interleaves A/B) in one pristine client process.
    `before_job` runs before each job is let go (the caller freezes the servers it does not measure).

    A run that fails (its server died, the client failed on it) or fails its checks (failed requests, token
    counts, duration) raises; with `failed` given, it is that run's build's failure instead (a comparison of
    several candidates: one that crashes or miscounts must not cost the others their measurement): recorded in
    `failed` by tag, and the build's later jobs are skipped. The `reference` build's failure is raised at once:
    the others are judged against its runs."""
    work_dir.mkdir(parents=True, exist_ok=True)
    files = [f"job{index:04d}.json" for index in range(len(jobs))]
    for name in files:
        (work_dir / name).unlink(missing_ok=True)
        (work_dir / (name + TOKENS_SUFFIX)).unlink(missing_ok=True)
    argvs = [job_argv(job, config, work_dir, name) for job, name in zip(jobs, files, strict=True)]
    prompts = _write_datasets(jobs, config, work_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=work_dir, delete=False) as f:
        json.dump(argvs, f)
    log_path = work_dir / "client.log"
    timeout = config.run_timeout_s * len(jobs) + 60
    runs: list[CellRun] = []
    settled = 0     # jobs done, failed or skipped

    def charge(job: BenchJob, exc: HarnessError) -> None:
        """A run that failed: raised, or (`failed` given, not the reference) its build's failure."""
        if failed is None or job.tag == reference:
            raise exc
        failed[job.tag] = exc

    # Where a run's time goes besides the measurement (the other servers' freeze, the client's set-up and
    # warm-ups, reading its result): one line per job, for the campaign's cost table (experiments/campaign_time.py).
    timings = work_dir / TIMINGS_FILE
    ready = go = time.monotonic()
    with open(log_path, "ab") as log, open(timings, "a") as timing_log:
        proc = subprocess.Popen([python, "-I", "-m", "harness.bench_driver", f.name], stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE, stderr=log, start_new_session=True)
        # The client can hang without printing: a watchdog kills its process group at the deadline.
        fired = threading.Event()
        watchdog = threading.Timer(timeout, lambda: (fired.set(), _kill_group(proc.pid)))
        watchdog.start()
        started = measured = time.monotonic()
        try:
            assert proc.stdout is not None and proc.stdin is not None
            for raw_line in proc.stdout:
                line = raw_line.decode(errors="replace").strip()
                log.write(raw_line)
                if line.startswith("RATCHET_JOB_READY"):
                    index = int(line.split()[1])
                    if failed is not None and jobs[index].tag in failed:
                        proc.stdin.write(f"skip {index}\n".encode())
                        proc.stdin.flush()
                        continue
                    ready = time.monotonic()
                    if before_job:
                        before_job(jobs[index])
                    go = time.monotonic()
                    proc.stdin.write(f"go {index}\n".encode())
                    proc.stdin.flush()
                elif line.startswith("RATCHET_JOB_START"):
                    started = measured = time.monotonic()
                elif line.startswith(MEASURED_LINE):
                    measured = time.monotonic()      # after the warm-ups: where the client's own clock starts
                elif line.startswith("RATCHET_JOB_SKIPPED"):
                    settled += 1
                elif line.startswith("RATCHET_JOB_FAILED"):
                    job = jobs[int(line.split()[1])]
                    settled += 1
                    try:
                        if check_alive:
                            check_alive(job)     # a dead server is named as such
                    except HarnessError as exc:
                        charge(job, exc)
                        continue
                    charge(job, BenchmarkFailed(f"{job.tag} {job.cell.label} repeat {job.repeat}: the benchmark "
                                                f"client failed on this run; see {log_path}"))
                elif line.startswith("RATCHET_JOB_DONE"):
                    done = time.monotonic()
                    index = int(line.split()[1])
                    job = jobs[index]
                    settled += 1
                    try:
                        if check_alive:
                            check_alive(job)
                        run = _finished_run(job, config, work_dir / files[index], started=measured,
                                            written=prompts.get(dataset_path(job, work_dir), ((), ())))
                    except HarnessError as exc:
                        charge(job, exc)
                        continue
                    timing_log.write(json.dumps({
                        "job": files[index], "tag": job.tag, "cell": job.cell.label, "repeat": job.repeat,
                        "freeze_s": round(go - ready, 3), "client_s": round(done - started, 3),
                        "measured_s": round(float(run.result.duration), 3),
                        "checks_s": round(time.monotonic() - done, 3)}) + "\n")
                    timing_log.flush()
                    runs.append(run)
                    if on_done:
                        on_done(run)
            code = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.wait()
    if fired.is_set():
        raise BenchmarkFailed(f"benchmark client exceeded {timeout:.0f} s and was killed; see {log_path}")
    if code != 0 or settled != len(jobs):
        for job in jobs[settled:settled + 1]:
            if check_alive:
                check_alive(job)
        raise BenchmarkFailed(f"benchmark client exited with code {code} after {settled}/{len(jobs)} runs; "
                              f"see {log_path}")
    return runs
