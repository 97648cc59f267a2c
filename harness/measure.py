"""Measurement procedures: one build's grid, and an interleaved A/B comparison of two builds.

Each procedure starts fresh servers (never reused across procedures), records start-up time and the
evidence of what each server imported, and runs the pristine benchmark client host-side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.bench import BenchJob, CellRun, run_jobs
from harness.config import BenchmarkConfig, Cell, ParityConfig, ServerConfig, StatsConfig
from harness.datasets import copy_task_answer
from harness.integrity import MeasurementDigest, check_unchanged, digest_roots, measurement_roots
from harness.parity import Generation, ParityReport, compare, held_generations, load_prompts
from harness.server import Server, serve
from harness.stats import SpeedupCI, cv, overall_ci, speedup_ci
from harness.workload import compare_workload
from sandbox.base import Backend

__all__ = ["Build", "GridResult", "ABResult", "measure_grid", "ab_compare", "headline_metric", "parity_server",
           "cache_dir_for", "split_headlines"]

# What "faster" means per metric: throughput up, latency down (ratios are oriented so >1 is better).
HIGHER_IS_BETTER = {"total_token_throughput": True, "output_throughput": True, "request_throughput": True,
                    "prefill_tok_s": True, "mean_ttft_ms": False, "median_ttft_ms": False,
                    "mean_tpot_ms": False, "median_tpot_ms": False, "mean_e2el_ms": False}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Build:
    tag: str                       # "A"/"B", "baseline", "candidate"
    tree: Path                     # directory holding vllm/ (the PYTHONPATH overlay)
    engine_args: dict[str, object]
    ref: str = ""                  # git commit of the tree, for the record
    # What the server's compiled artefacts depend on: the tree's content, serving.yaml included (its git
    # tree hash). Builds with the same key share one cache folder (torch.compile and JIT caches: an E2B
    # start on the H200 took 57 s warm vs 169 s cold); builds without one get a folder per tag. Parallel
    # evaluations of one round share their incumbent's folder, as they shared the per-tag one before.
    cache_key: str = ""


def cache_dir_for(build: Build, root: Path, *, taken: tuple[Path, ...] = ()) -> Path:
    """Where `build`'s server keeps its caches (HOME, VLLM_CACHE_ROOT): one folder per content, so a
    candidate never reads artefacts compiled from other code, and an unchanged incumbent finds its own.
    Two servers alive at once never share one (`taken`): their start-ups would write it concurrently."""
    path = root / (build.cache_key or build.tag)
    return path.with_name(f"{path.name}-{build.tag}") if path in taken else path


def headline_metric(cell: Cell) -> str:
    """Prefill cells are judged on prefill throughput, the others on end-to-end total throughput."""
    return "prefill_tok_s" if cell.is_prefill else "total_token_throughput"


@dataclass
class GridResult:
    build: Build
    startup_s: float
    evidence: dict[str, object]
    runs: list[CellRun] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)   # parity prompts, when asked for

    def cell_metrics(self, cell: Cell) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for run in self.runs:
            if run.job.cell == cell:
                for key, value in run.metrics().items():
                    out.setdefault(key, []).append(value)
        return out

    def table(self, cells: list[Cell]) -> list[dict[str, object]]:
        rows = []
        for cell in cells:
            metrics = self.cell_metrics(cell)
            row: dict[str, object] = {"cell": cell.label, "input_len": cell.input_len, "output_len": cell.output_len,
                                      "repeats": len(metrics.get("total_token_throughput", []))}
            for key, values in metrics.items():
                row[key] = statistics.median(values)
            row["cv_headline"] = cv(metrics.get(headline_metric(cell), []))
            rows.append(row)
        return rows


@dataclass
class ABResult:
    a: GridResult
    b: GridResult
    parity: ParityReport | None
    cells: dict[str, dict[str, SpeedupCI]]       # cell label -> metric -> ratio (>1: B better)
    overall: SpeedupCI | None                    # None when the benchmark was skipped (parity broken)
    # The image cells' own headline (geometric mean over them), when the grid has both kinds: `overall` is
    # then the text cells' alone, and a verdict guards this one (harness/stats.py decide).
    images: SpeedupCI | None = None

    def headline(self) -> dict[str, SpeedupCI]:
        return {label: metrics["headline"] for label, metrics in self.cells.items()}


def _jobs(cells: list[Cell], servers: list[tuple[str, Server]], tokenizer: Path, repeats: int,
          *, flip: bool = False) -> list[BenchJob]:
    """ABBA-style interleaving: the order of builds alternates per (repeat, cell) so neither side
    always runs first or right after the other's warm caches. `flip` starts with the second build."""
    jobs = []
    for rep in range(repeats):
        for index, cell in enumerate(cells):
            order = servers if (rep + index + flip) % 2 == 0 else list(reversed(servers))
            for tag, server in order:
                jobs.append(BenchJob(cell=cell, base_url=server.base_url, model_name=server.model_name,
                                     tokenizer=tokenizer, tag=tag, repeat=rep))
    return jobs


def _alive_check(servers: dict[str, Server]) -> Callable[[BenchJob], None]:
    def check(job: BenchJob) -> None:
        servers[job.tag].check_alive()
    return check


def _measure_only(servers: dict[str, Server]) -> Callable[[BenchJob], None]:
    """Before each job: every other server frozen, the measured one thawed. An idle vLLM is not idle (its
    engine polls its queues; on 2 shared cores the run right after the other server's ran at half speed),
    and a candidate's server could burn the cores while the incumbent is measured."""
    def switch(job: BenchJob) -> None:
        for tag, server in servers.items():
            if tag != job.tag:
                server.running.freeze()
        servers[job.tag].running.thaw()
    return switch


@contextlib.contextmanager
def _all_thawed(servers: dict[str, Server]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers.values():
            server.running.thaw()


def parity_server(backend: Backend, build: Build, *, server: ServerConfig, parity: ParityConfig, work_dir: Path,
                  cache_dir: Path) -> contextlib.AbstractContextManager[Server]:
    """A server of `build` on `parity.model` (a real checkpoint): its tree and engine args, with only
    the overrides that checkpoint needs. For specs whose speed model has dummy weights."""
    assert parity.model is not None
    return serve(backend, tree=build.tree, config=server.model_copy(update={"model": parity.model}),
                 engine_args={**build.engine_args, **parity.engine_args},
                 log_path=work_dir / f"server-{build.tag}-parity.log", cache_dir=cache_dir)


def _generate_on_parity_model(backend: Backend, build: Build, *, server: ServerConfig, parity: ParityConfig,
                              work_dir: Path, cache_dir: Path, progress: Progress,
                              concurrency: int) -> list[Generation]:
    progress(f"parity: starting a {build.tag} server on {parity.model}")
    with parity_server(backend, build, server=server, parity=parity, work_dir=work_dir, cache_dir=cache_dir) as srv:
        progress(f"parity server {build.tag} ready in {srv.startup_s:.1f} s; generating")
        return held_generations(srv.base_url, srv.model_name, load_prompts(parity.prompts), parity,
                                concurrency=concurrency)


def measure_grid(backend: Backend, build: Build, *, server: ServerConfig, bench: BenchmarkConfig,
                 work_dir: Path, cache_dir: Path, progress: Progress = lambda _: None,
                 on_run: Callable[[CellRun], None] | None = None, parity: ParityConfig | None = None) -> GridResult:
    cells = bench.cells()
    generations: list[Generation] = []
    if parity is not None and parity.model is not None:
        generations = _generate_on_parity_model(backend, build, server=server, parity=parity, work_dir=work_dir,
                                                cache_dir=cache_dir_for(build, cache_dir / "parity"),
                                                progress=progress, concurrency=bench.max_concurrency)
    progress(f"starting server for {build.tag}")
    with serve(backend, tree=build.tree, config=server, engine_args=build.engine_args,
               log_path=work_dir / f"server-{build.tag}.log",
               cache_dir=cache_dir_for(build, cache_dir) if build.cache_key else cache_dir) as srv:
        progress(f"server {build.tag} ready in {srv.startup_s:.1f} s; benchmarking {len(cells)} cells")
        result = GridResult(build=build, startup_s=srv.startup_s, evidence=srv.evidence, generations=generations)
        if parity is not None and parity.model is None:
            progress("parity: generating the reference")
            result.generations = held_generations(srv.base_url, srv.model_name, load_prompts(parity.prompts), parity,
                                                  concurrency=bench.max_concurrency)
        jobs = _jobs(cells, [(build.tag, srv)], server.model, bench.repeats)
        result.runs = run_jobs(jobs, bench, work_dir=work_dir / f"bench-{build.tag}", on_done=on_run,
                               check_alive=_alive_check({build.tag: srv}))
    return result


def split_headlines(a: GridResult, b: GridResult, cells: list[Cell], stats_cfg: StatsConfig
                    ) -> tuple[SpeedupCI, SpeedupCI | None]:
    """The headline over the text cells and, apart, over the image cells (None without both kinds): a change
    that speeds up text but slows the vision path must not hide the one in the other's average."""
    text = [c for c in cells if not c.has_images]
    media = [c for c in cells if c.has_images]

    def overall(group: list[Cell]) -> SpeedupCI:
        head_a = {c.label: a.cell_metrics(c)[headline_metric(c)] for c in group}
        head_b = {c.label: b.cell_metrics(c)[headline_metric(c)] for c in group}
        return overall_ci(head_a, head_b, stats_cfg)

    if text and media:
        return overall(text), overall(media)
    return overall(cells), None


def grid_ratios(a: GridResult, b: GridResult, cells: list[Cell], stats_cfg: StatsConfig
            ) -> tuple[dict[str, dict[str, SpeedupCI]], SpeedupCI]:
    out: dict[str, dict[str, SpeedupCI]] = {}
    head_a: dict[str, list[float]] = {}
    head_b: dict[str, list[float]] = {}
    for cell in cells:
        ma, mb = a.cell_metrics(cell), b.cell_metrics(cell)
        per: dict[str, SpeedupCI] = {}
        for metric, higher in HIGHER_IS_BETTER.items():
            xa, xb = ma.get(metric, []), mb.get(metric, [])
            # Prefill cells have no TPOT (0 ms): a ratio of zeros means nothing, skip it.
            if not xa or not xb or min(xa) <= 0 or min(xb) <= 0:
                continue
            # For latencies, the ratio A/B is the speedup (lower is better).
            per[metric] = speedup_ci(xa, xb, stats_cfg) if higher else speedup_ci(xb, xa, stats_cfg)
        per["headline"] = per[headline_metric(cell)]
        head_a[cell.label], head_b[cell.label] = ma[headline_metric(cell)], mb[headline_metric(cell)]
        out[cell.label] = per
    return out, overall_ci(head_a, head_b, stats_cfg)


def ab_compare(backend: Backend, a: Build, b: Build, *, server: ServerConfig, bench: BenchmarkConfig,
               stats_cfg: StatsConfig, parity: ParityConfig | None, work_dir: Path, cache_dir: Path,
               progress: Progress = lambda _: None, on_run: Callable[[CellRun], None] | None = None,
               reference: list[Generation] | None = None, stop_on_parity_failure: bool = False,
               ports: dict[str, int] | None = None, b_first: bool = False,
               measurement: MeasurementDigest | None = None, cells: list[Cell] | None = None) -> ABResult:
    """Both servers up at once, runs interleaved. Parity first (fail fast): B against `reference` when
    given (the campaign's baseline), else against A generated now. `b_first`: the interleaving starts
    with B (a confirmation's own order). The measurement path must be `measurement` (the campaign's, or
    one taken when this comparison starts) before the first server starts and after the last run. `cells`:
    a subset of the grid (a trial's), default all of it."""
    cells = cells or bench.cells()
    roots = measurement_roots()
    if measurement is not None:   # the campaign's digest: nothing may have changed since it began
        check_unchanged(measurement, roots, when="before this comparison started (since the campaign began)")
    expected = measurement or digest_roots(roots)   # without one, this comparison's own start is the reference
    report = None
    if parity is not None and parity.model is not None:
        # A separate (cheap) server per build on the real checkpoint, before the speed servers: fail fast.
        gens = {build.tag: _generate_on_parity_model(
                    backend, build, server=server.model_copy(update={"port": ports[build.tag]}) if ports else server,
                    parity=parity, work_dir=work_dir, cache_dir=cache_dir_for(build, cache_dir / "parity"),
                    progress=progress, concurrency=bench.max_concurrency)
                for build in ((b,) if reference else (a, b))}
        report = compare(reference or gens[a.tag], gens[b.tag], logprob_tolerance=parity.logprob_tolerance,
                         prompts=load_prompts(parity.prompts))
        progress(report.summary())
        if not report.ok and stop_on_parity_failure:
            return ABResult(a=GridResult(build=a, startup_s=0.0, evidence={}),
                            b=GridResult(build=b, startup_s=0.0, evidence={}), parity=report, cells={}, overall=None)
    with contextlib.ExitStack() as stack:
        servers: dict[str, Server] = {}
        caches: tuple[Path, ...] = ()
        for build in (a, b):
            progress(f"starting server for {build.tag}")
            config = server.model_copy(update={"port": ports[build.tag]}) if ports else server
            caches += (cache_dir_for(build, cache_dir, taken=caches),)
            servers[build.tag] = stack.enter_context(serve(
                backend, tree=build.tree, config=config, engine_args=build.engine_args,
                log_path=work_dir / f"server-{build.tag}.log", cache_dir=caches[-1]))
            progress(f"server {build.tag} ready in {servers[build.tag].startup_s:.1f} s")
        if parity is not None and parity.model is None:
            progress("parity: generating on B" + ("" if reference else " and A"))
            prompts = load_prompts(parity.prompts)
            ref = reference or held_generations(servers[a.tag].base_url, server.served_model_name, prompts, parity,
                                                concurrency=bench.max_concurrency)
            cand = held_generations(servers[b.tag].base_url, server.served_model_name, prompts, parity,
                                    concurrency=bench.max_concurrency)
            report = compare(ref, cand, logprob_tolerance=parity.logprob_tolerance, prompts=prompts)
            progress(report.summary())
        ga = GridResult(build=a, startup_s=servers[a.tag].startup_s, evidence=servers[a.tag].evidence)
        gb = GridResult(build=b, startup_s=servers[b.tag].startup_s, evidence=servers[b.tag].evidence)
        if report is not None and not report.ok and stop_on_parity_failure:
            return ABResult(a=ga, b=gb, parity=report, cells={}, overall=None)
        jobs = _jobs(cells, [(a.tag, servers[a.tag]), (b.tag, servers[b.tag])], server.model, bench.repeats,
                     flip=b_first)
        progress(f"benchmark: {len(jobs)} runs interleaved, the other server frozen during each")
        with _all_thawed(servers):
            runs = run_jobs(jobs, bench, work_dir=work_dir / "bench", on_done=on_run,
                            check_alive=_alive_check(servers), before_job=_measure_only(servers))
        check_unchanged(expected, roots, when="while the builds were served and measured")
        for run in runs:
            (ga if run.job.tag == a.tag else gb).runs.append(run)
        if parity is not None and report is not None \
                and {**server.engine_args, **b.engine_args}.get("load_format") != "dummy":
            # Dummy speed weights make every logprob equal: their outputs are ties by construction.
            workload = compare_workload(
                ga.runs, gb.runs, tokenizer=server.model, reference_url=servers[a.tag].base_url,
                model=server.served_model_name, tie_margin=parity.tie_margin,
                answer=copy_task_answer if bench.dataset == "copy-task" else None, alpha=parity.workload_alpha)
            report = dataclasses.replace(report, workload=workload)
            progress(workload.summary())
    cell_cis, _ = grid_ratios(ga, gb, cells, stats_cfg)
    overall, images = split_headlines(ga, gb, cells, stats_cfg)
    return ABResult(a=ga, b=gb, parity=report, cells=cell_cis, overall=overall, images=images)
