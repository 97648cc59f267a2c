"""A fake of agent/measurements.py's seam: whole campaigns, resumes and replays in seconds, without vLLM.

What it measures is read off the build, so a patch changes it the way a real one would:
- speed: `SPEED[max_num_seqs]` of the build's serving config, times x when the tree's gemma4.py has a line
  `SPEED = x` (a "kernel" change), with a deterministic ±1 % jitter per run; image cells (requests with
  pictures) are further times y when it has a line `IMAGE_SPEED = y` (a change to the image path);
- parity: each held prompt "generates" its own first `max_tokens` ids; a gemma4.py that mentions
  BREAKS_PARITY flips one token of every third prompt (a real divergence, judged by harness.parity.compare).
Like the harness, it leaves a step's files for a reviewer where the harness would (a server log per build; under
bench/ for an A/B, bench-<tag>/ for a grid: job*.json raw results, prompt files, client.log, timings.jsonl), so the
campaign binds them as evidence (agent/evidence.py) and a test can edit them.
Each "server" is a real process (`sleep`) in the server folder the harness would make for that log
(sandbox.local.server_cwd), so a campaign killed mid-measurement leaves something for `resume` to reap.
It is plain data, so a Ray task carries it to a worker (agent/executor.py), whose "servers" are then processes
on that worker's host; `hold_s` keeps each step's servers up that long, for a test that kills a worker mid-A/B.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.bench import TIMINGS_FILE, BenchJob, BenchResult, CellRun, dataset_path
from harness.ceilings import Ceilings
from harness.config import BenchmarkConfig, Cell, ParityConfig
from harness.errors import CeilingsUnavailable
from harness.integrity import MeasurementDigest
from harness.measure import ABResult, Build, GridResult, grid_ratios, split_headlines
from harness.parity import Generation, compare, load_prompts
from harness.profiling import OpTime, Profile
from sandbox.local import server_cwd

SPEED = {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0, 16: 1.9, 32: 1.0}


GEMMA4 = Path("vllm") / "model_executor" / "models" / "gemma4.py"


def _gemma4(build: Build) -> str:
    path = build.tree / GEMMA4
    return path.read_text() if path.is_file() else ""


def speed_of(build: Build) -> float:
    factor = SPEED.get(int(build.engine_args.get("max_num_seqs", 1)), 1.0)   # type: ignore[call-overload]
    code = re.search(r"^SPEED = ([0-9.]+)$", _gemma4(build), re.M)     # a "kernel" change
    return factor * (float(code.group(1)) if code else 1.0)


def generations(build: Build, parity: ParityConfig) -> list[Generation]:
    broken = "BREAKS_PARITY" in _gemma4(build)
    out = []
    for k, prompt in enumerate(load_prompts(parity.prompts)):
        ids = list(prompt.token_ids[: parity.max_tokens]) or [5]
        if broken and k % 3 == 0:
            ids[-1] = (ids[-1] + 1) % 256
        top = tuple(((t, -0.01), ((t + 7) % 256, -9.0)) for t in ids)
        out.append(Generation(prompt_id=prompt.id, token_ids=tuple(ids), top_logprobs=top))
    return out


def image_speed_of(build: Build) -> float:
    code = re.search(r"^IMAGE_SPEED = ([0-9.]+)$", _gemma4(build), re.M)
    return float(code.group(1)) if code else 1.0


def _result(cell: Cell, tok_s: float, prompts: int) -> BenchResult:
    duration = prompts * (cell.input_len + cell.output_len) / tok_s
    ms = 1000.0 / tok_s
    return BenchResult(duration=duration, completed=prompts, total_input_tokens=prompts * cell.input_len,
                       total_output_tokens=prompts * cell.output_len, request_throughput=prompts / duration,
                       output_throughput=prompts * cell.output_len / duration, total_token_throughput=tok_s,
                       mean_ttft_ms=ms, median_ttft_ms=ms, p99_ttft_ms=ms, mean_tpot_ms=ms, median_tpot_ms=ms,
                       p99_tpot_ms=ms, mean_itl_ms=ms, median_itl_ms=ms, p99_itl_ms=ms, mean_e2el_ms=ms,
                       median_e2el_ms=ms, p99_e2el_ms=ms)


def _seed(work_dir: Path) -> str:
    """The jitter's seed: the step's folder below the campaign's `runs/` (or its last two parts), never the
    campaign id or pytest's tmp folder, so a test sees the same draws on every run. Seeded by the full path, a
    no-op A/B's 95 % interval cleared 1.0 on some runs (CI once: 1.005x [1.002, 1.008]) and the test flaked."""
    parts = work_dir.parts
    tail = parts[len(parts) - parts[::-1].index("runs"):] if "runs" in parts else parts[-2:]
    return "/".join(tail)


def _runs(build: Build, cells: list[Cell], bench: BenchmarkConfig, work_dir: Path,
          run_s: float = 0.01) -> list[CellRun]:
    rng = random.Random(f"{_seed(work_dir)}:{build.tag}")
    runs = []
    for cell in cells:
        for repeat in range(bench.repeats):
            tok_s = 1000.0 * speed_of(build) * (1.0 + rng.uniform(-0.01, 0.01))
            tok_s *= image_speed_of(build) if cell.has_images else 1.0
            job = BenchJob(cell=cell, base_url="http://fake", model_name="fake", tokenizer=Path("fake"),
                           tag=build.tag, repeat=repeat)
            runs.append(CellRun(job=job, result=_result(cell, tok_s, bench.num_prompts), wall_s=run_s))
    return runs


def _write_bench(folder: Path, runs: list[CellRun]) -> None:
    """What the harness's client leaves for a reviewer (harness.bench.run_jobs): one raw result per run
    (job0000.json, ...), the prompt file of each cell and repeat, the client's log and its timings."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "client.log", "a") as log, open(folder / TIMINGS_FILE, "a") as timings:
        for index, run in enumerate(runs):
            name = f"job{index:04d}.json"
            (folder / name).write_text(run.result.model_dump_json())
            dataset_path(run.job, folder).write_text(json.dumps({"prompt": f"fake {run.job.cell.label}"}) + "\n")
            log.write(f"RATCHET_JOB_DONE {index}\n")
            timings.write(json.dumps({"job": name, "tag": run.job.tag, "cell": run.job.cell.label,
                                      "repeat": run.job.repeat}) + "\n")


# Ceilings under which the fake's 1,000 tok/s of the tiny model (~2 MFLOP per token) sit at ~20 % of the roofline.
FAKE_CEILINGS = Ceilings(flop_s=1e10, bytes_s=1e10, flop_s_best=1e10, bytes_s_best=1e10, cache_bytes=0.0,
                         dtype="float32", source="fake")


class FakeMeasurements:
    def __init__(self, hold_s: float = 0.0, startup_s: float = 0.1, run_s: float = 0.01,
                 ceilings: Ceilings | None = FAKE_CEILINGS) -> None:
        self.calls: list[str] = []
        self.ports: list[dict[str, int] | None] = []   # the ports each A/B was given, in order
        self.hold_s = hold_s
        self.startup_s, self.run_s = startup_s, run_s   # what the baseline reports (the loop plans rounds with it)
        self._ceilings = ceilings                         # None: as a host that cannot measure them

    def ceilings(self, server: Any, *, hardware: str) -> Ceilings:
        self.calls.append("ceilings")
        if self._ceilings is None:
            raise CeilingsUnavailable("the fake host measures no ceilings")
        return self._ceilings

    def digest(self) -> MeasurementDigest:
        return MeasurementDigest(sha256="fake-measurement-path", files={})

    def _started(self, step: str) -> None:
        """The servers of one step are up (the crash tests kill here: mid-benchmark)."""

    @contextmanager
    def _servers(self, work_dir: Path, builds: tuple[Build, ...], step: str) -> Iterator[None]:
        # no inherited pipes: a killed campaign's leftover "servers" must not hold its caller's stdout open
        for b in builds:   # what a server writes to its log (the harness binds it as evidence)
            (work_dir / f"server-{b.tag}.log").write_text(f"fake server {b.tag} of {b.ref}\n")
        procs = [subprocess.Popen(["sleep", "600"], cwd=server_cwd(work_dir / f"server-{b.tag}.log"),
                                  start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for b in builds]
        try:
            self._started(step)
            time.sleep(self.hold_s)   # a measurement that lasts, so a worker can be killed in the middle of it
            yield
        finally:
            for proc in procs:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def grid(self, backend: Any, build: Build, *, bench: BenchmarkConfig, work_dir: Path,
             parity: ParityConfig | None = None, **kw: Any) -> GridResult:
        self.calls.append("grid")
        work_dir.mkdir(parents=True, exist_ok=True)
        with self._servers(work_dir, (build,), "grid"):
            runs = _runs(build, bench.cells(), bench, work_dir, self.run_s)
            _write_bench(work_dir / f"bench-{build.tag}", runs)
            return GridResult(build=build, startup_s=self.startup_s, evidence={"fake": True}, runs=runs,
                              generations=generations(build, parity) if parity else [])

    def ab(self, backend: Any, a: Build, b: Build, **kw: Any) -> ABResult:
        self.calls.append("ab")
        self.ports.append(kw.get("ports"))
        return self._compare(a, [b], **kw)[0]

    def arms(self, backend: Any, a: Build, bs: list[Build], **kw: Any) -> list[ABResult]:
        """Several candidates against one A (one start-up, A's runs shared), as harness.measure.compare_arms."""
        self.calls.append(f"arms{len(bs)}")
        self.ports.append(kw.get("ports"))
        return self._compare(a, bs, **kw)

    def _compare(self, a: Build, bs: list[Build], *, bench: BenchmarkConfig, stats_cfg: Any,
                 parity: ParityConfig | None, work_dir: Path, reference: list[Generation] | None = None,
                 stop_on_parity_failure: bool = False, cells: list[Cell] | None = None, **kw: Any
                 ) -> list[ABResult]:
        work_dir.mkdir(parents=True, exist_ok=True)
        cells = cells or bench.cells()
        reports = {b.tag: compare(reference or generations(a, parity), generations(b, parity),
                                  logprob_tolerance=parity.logprob_tolerance, prompts=load_prompts(parity.prompts))
                   for b in bs} if parity is not None else {}
        ga = GridResult(build=a, startup_s=0.1, evidence={"fake": True})
        measured = [b for b in bs if not (stop_on_parity_failure and b.tag in reports and not reports[b.tag].ok)]
        out: dict[str, ABResult] = {b.tag: ABResult(a=ga, b=GridResult(build=b, startup_s=0.1, evidence={"fake": True}),
                                                    parity=reports.get(b.tag), cells={}, overall=None)
                                    for b in bs if b not in measured}
        if measured:
            with self._servers(work_dir, (a, *measured), "ab"):
                ga.runs = _runs(a, cells, bench, work_dir)
                for b in measured:
                    gb = GridResult(build=b, startup_s=0.1, evidence={"fake": True},
                                    runs=_runs(b, cells, bench, work_dir))
                    cell_cis, _ = grid_ratios(ga, gb, cells, stats_cfg)
                    overall, images = split_headlines(ga, gb, cells, stats_cfg)
                    out[b.tag] = ABResult(a=ga, b=gb, parity=reports.get(b.tag), cells=cell_cis, overall=overall,
                                          images=images)
                _write_bench(work_dir / "bench", [*ga.runs, *(run for b in measured for run in out[b.tag].b.runs)])
        return [out[b.tag] for b in bs]

    def profile(self, backend: Any, *, engine_args: Mapping[str, object], cell: Cell, work_dir: Path,
                **kw: Any) -> list[Profile]:
        self.calls.append("profile")
        work_dir.mkdir(parents=True, exist_ok=True)
        op = OpTime(name=f"fake-op-at-{engine_args.get('max_num_seqs')}", category="cpu_op", self_ms=1.0, calls=1,
                    share=1.0)
        return [Profile(phase="end-to-end", cell=cell, ops=(op,), trace_files=())]

    def engine_defaults(self, model: Path, serving: Mapping[str, object], *, env: Mapping[str, str]
                        ) -> dict[str, object]:
        self.calls.append("engine_defaults")
        # as vLLM on CPU: max_num_seqs defaults to 1 here, and async scheduling is forced off whatever is asked
        return {"max_num_seqs": 1, **serving, "async_scheduling": False}
