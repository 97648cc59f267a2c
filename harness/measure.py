"""Measurement procedures: one build's grid, and an interleaved A/B comparison of two builds.

Each procedure starts fresh servers (never reused across procedures), records start-up time and the
evidence of what each server imported, and runs the pristine benchmark client host-side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import statistics
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bench import BenchJob, CellRun, mismatched_inputs, run_jobs
from harness.config import BenchmarkConfig, Cell, ParityConfig, ServerConfig, StatsConfig
from harness.datasets import copy_task_answer
from harness.errors import HarnessError
from harness.integrity import MeasurementDigest, check_unchanged, digest_roots, measurement_roots
from harness.parity import Generation, ParityReport, compare, held_generations, load_prompts
from harness.server import Server, ServerStart, serve, start_together
from harness.stats import SpeedupCI, cv, overall_ci, speedup_ci
from harness.workload import compare_workload
from sandbox.base import Backend

__all__ = ["Build", "GridResult", "ABResult", "measure_grid", "ab_compare", "compare_arms", "headline_metric",
           "parity_server", "cache_dir_for", "seed_cache", "split_headlines"]

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
    # What the server's code is: the tree's content without serving.yaml. A candidate that changes engine args
    # alone runs the incumbent's code, and its cold cache folder starts as a copy of the incumbent's
    # (`seed_cache`): vLLM keys its compile cache by config and code, Triton and Inductor theirs by kernel
    # source, so what it finds there is what its own start would have compiled, or is passed over.
    code_key: str = ""


def cache_dir_for(build: Build, root: Path, *, taken: tuple[Path, ...] = ()) -> Path:
    """Where `build`'s server keeps its caches (HOME, VLLM_CACHE_ROOT): one folder per content, so a
    candidate never reads artefacts compiled from other code, and an unchanged incumbent finds its own.
    Two servers alive at once never share one (`taken`): their start-ups would write it concurrently."""
    path = root / (build.cache_key or build.tag)
    return path.with_name(f"{path.name}-{build.tag}") if path in taken else path


def seed_cache(incumbent: Build, incumbent_dir: Path, build: Build, target: Path) -> bool:
    """Start `build`'s cache folder `target` as a copy of the incumbent's when both run the same code and the
    target does not exist yet; True when it did. Called before either server starts (a copy taken while a
    server writes could be torn). Never across code: a candidate that changes code compiles its own. Not from a
    folder without a file in it (a sandbox that keeps its caches inside, as Docker's tmpfs does, leaves the host
    folder empty): nothing would be copied, and the progress line would claim a warm start that is not."""
    if not incumbent.code_key or build.code_key != incumbent.code_key or build is incumbent:
        return False
    if target.exists() or target == incumbent_dir or not incumbent_dir.is_dir():
        return False
    if not any(path.is_file() for path in incumbent_dir.rglob("*")):
        return False
    shutil.copytree(incumbent_dir, target, symlinks=True)
    return True


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
    # In a comparison of several candidates (compare_arms): this one's server could not start, nothing of it
    # was measured; the others were. A comparison of one candidate raises it instead.
    error: HarnessError | None = None

    def headline(self) -> dict[str, SpeedupCI]:
        return {label: metrics["headline"] for label, metrics in self.cells.items()}


def _jobs(cells: list[Cell], servers: list[tuple[str, Server]], tokenizer: Path, repeats: int) -> list[BenchJob]:
    """ABBA-style interleaving: the order of builds rotates per (repeat, cell), so that no build always runs
    first or right after another's warm caches (with two builds: AB, BA, AB, ...)."""
    jobs = []
    for rep in range(repeats):
        for index, cell in enumerate(cells):
            shift = (rep + index) % len(servers)
            for tag, server in servers[shift:] + servers[:shift]:
                jobs.append(BenchJob(cell=cell, base_url=server.base_url, model_name=server.model_name,
                                     tokenizer=tokenizer, tag=tag, repeat=rep, first_of_cell=rep == 0))
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
                try:
                    server.running.freeze()
                except Exception:
                    if _alive(server):   # running and not frozen: an A/B with it burning the cores is not one
                        raise            # (a dead one, whose build has failed already, burns nothing)
        servers[job.tag].running.thaw()
    return switch


def _alive(server: Server) -> bool:
    try:
        server.check_alive()
    except HarnessError:
        return False
    return True


@contextlib.contextmanager
def _all_thawed(servers: dict[str, Server]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers.values():
            server.running.thaw()


def parity_server(backend: Backend, build: Build, *, server: ServerConfig, parity: ParityConfig, work_dir: Path,
                  cache_dir: Path, cancel: threading.Event | None = None) -> contextlib.AbstractContextManager[Server]:
    """A server of `build` on `parity.model` (a real checkpoint): its tree and engine args, with only
    the overrides that checkpoint needs. For specs whose speed model has dummy weights."""
    assert parity.model is not None
    return serve(backend, tree=build.tree, config=server.model_copy(update={"model": parity.model}),
                 engine_args={**build.engine_args, **parity.engine_args},
                 log_path=work_dir / f"server-{build.tag}-parity.log", cache_dir=cache_dir, cancel=cancel)


def _generate_on_parity_model(backend: Backend, build: Build, *, server: ServerConfig, parity: ParityConfig,
                              work_dir: Path, cache_dir: Path, progress: Progress,
                              concurrency: int, cancel: threading.Event | None = None) -> list[Generation]:
    """`cancel`: a speed server started beside this one failed; stop waiting for this one's start-up."""
    progress(f"parity: starting a {build.tag} server on {parity.model}")
    with parity_server(backend, build, server=server, parity=parity, work_dir=work_dir, cache_dir=cache_dir,
                       cancel=cancel) as srv:
        progress(f"parity server {build.tag} ready in {srv.startup_s:.1f} s; generating")
        return held_generations(srv.base_url, srv.model_name, load_prompts(parity.prompts), parity,
                                concurrency=concurrency)


def measure_grid(backend: Backend, build: Build, *, server: ServerConfig, bench: BenchmarkConfig,
                 work_dir: Path, cache_dir: Path, progress: Progress = lambda _: None,
                 on_run: Callable[[CellRun], None] | None = None, parity: ParityConfig | None = None,
                 parity_port: int | None = None) -> GridResult:
    """One build's grid, and its held prompts' generations when `parity` is given. A parity server on
    `parity.model` starts together with the speed server (`server.start_together`) on `parity_port`, or on a
    free port when `server.port` is unset; otherwise it runs first, on `server.port`."""
    cells = bench.cells()
    generations: list[Generation] = []
    on_parity_model = parity is not None and parity.model is not None
    together = on_parity_model and server.start_together and (server.port is None or parity_port is not None)

    failed = threading.Event()   # the speed server did not start: the parity server beside it stops waiting

    def generate() -> list[Generation]:
        assert parity is not None
        config = server.model_copy(update={"port": parity_port}) if together else server
        return _generate_on_parity_model(backend, build, server=config, parity=parity, work_dir=work_dir,
                                         cache_dir=cache_dir_for(build, cache_dir / "parity"),
                                         progress=progress, concurrency=bench.max_concurrency, cancel=failed)

    if on_parity_model and not together:
        generations = generate()
    with contextlib.ExitStack() as stack:
        parity_thread = None
        if together:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-phase"))
            parity_thread = pool.submit(generate)
        progress(f"starting server for {build.tag}" + (" (its parity server alongside)" if together else ""))
        caches = cache_dir_for(build, cache_dir) if build.cache_key else cache_dir
        try:
            srv = stack.enter_context(serve(backend, tree=build.tree, config=server, engine_args=build.engine_args,
                                            log_path=work_dir / f"server-{build.tag}.log", cache_dir=caches))
        except BaseException:
            failed.set()
            raise
        finally:
            if parity_thread is not None:
                generations = parity_thread.result()
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


def ab_compare(backend: Backend, a: Build, b: Build, **kw: Any) -> ABResult:
    """Both servers up at once, runs interleaved. Parity first (fail fast): B against `reference` when
    given (the campaign's baseline), else against A generated now. See compare_arms, of which this is the
    case of one candidate."""
    result = compare_arms(backend, a, [b], **kw)[0]
    if result.error is not None:
        raise result.error
    return result


def compare_arms(backend: Backend, a: Build, bs: list[Build], *, server: ServerConfig, bench: BenchmarkConfig,
                 stats_cfg: StatsConfig, parity: ParityConfig | None, work_dir: Path, cache_dir: Path,
                 progress: Progress = lambda _: None, on_run: Callable[[CellRun], None] | None = None,
                 reference: list[Generation] | None = None, stop_on_parity_failure: bool = False,
                 ports: dict[str, int] | None = None, b_first: bool = False,
                 measurement: MeasurementDigest | None = None, cells: list[Cell] | None = None) -> list[ABResult]:
    """The incumbent A against one or more candidates `bs` (distinct tags), every server up at once and every
    run interleaved (the order rotates per repeat and cell; only the measured server is thawed). Each
    candidate gets its own ABResult, paired with A's runs of the same repeat and cell: one A server and one
    start-up serve several candidates of a round.

    Servers start together (`server.start_together`, the default): the parity servers on `parity.model`
    (when the speed model has dummy weights) and the speed servers, each parity check judged as soon as its
    server has generated. A candidate that breaks parity with `stop_on_parity_failure` is dropped before the
    benchmark (its speed server stops); when none is left, nothing is benchmarked. Parity servers need ports
    of their own (`ports["B-parity"]`); when `ports` names none, the parity servers run first, on their
    builds' ports, as they did before starting together. `b_first`: the interleaving starts with the first
    candidate (a confirmation's own order). The measurement path must be `measurement` (the campaign's, or
    one taken when this comparison starts) before the first server starts and after the last run. `cells`:
    a subset of the grid (a trial's), default all of it."""
    if len({a.tag, *(b.tag for b in bs)}) != len(bs) + 1:
        raise ValueError("compare_arms: every build needs a tag of its own")
    cells = cells or bench.cells()
    roots = measurement_roots()
    if measurement is not None:   # the campaign's digest: nothing may have changed since it began
        check_unchanged(measurement, roots, when="before this comparison started (since the campaign began)")
    expected = measurement or digest_roots(roots)   # without one, this comparison's own start is the reference
    prompts = load_prompts(parity.prompts) if parity is not None else []
    reports: dict[str, ParityReport] = {}
    cancel = {build.tag: threading.Event() for build in (a, *bs)}
    together = server.start_together
    on_parity_model = parity is not None and parity.model is not None
    parity_builds = list(bs) if reference else [a, *bs]

    def parity_config(port_key: str) -> ServerConfig:
        port = (ports or {}).get(port_key)
        return server.model_copy(update={"port": port}) if port is not None else server

    def judge(gens: dict[str, list[Generation]]) -> None:
        """Each candidate's held prompts against the reference, as soon as both are there."""
        ref = reference or gens.get(a.tag)
        for build in bs:
            if ref is None or build.tag not in gens or build.tag in reports:
                continue
            reports[build.tag] = compare(ref, gens[build.tag], logprob_tolerance=parity.logprob_tolerance,  # type: ignore[union-attr]
                                         prompts=prompts)
            progress(f"{build.tag}: {reports[build.tag].summary()}" if len(bs) > 1 else reports[build.tag].summary())
            if not reports[build.tag].ok and stop_on_parity_failure:
                cancel[build.tag].set()

    def parity_phase(own_ports: bool) -> None:
        """The parity servers on the real checkpoint, started together, each generating when it is ready."""
        assert parity is not None
        gens: dict[str, list[Generation]] = {}
        lock = threading.Lock()
        # before any of them starts: the incumbent's parity folder (the baseline's) is not being written
        for build in parity_builds:
            seed_cache(a, cache_dir_for(a, cache_dir / "parity"), build, cache_dir_for(build, cache_dir / "parity"))

        def generate(build: Build) -> None:
            config = parity_config(f"{build.tag}-parity" if own_ports else build.tag)
            caches = cache_dir_for(build, cache_dir / "parity", taken=tuple(
                cache_dir_for(other, cache_dir / "parity") for other in parity_builds if other is not build
                and other.cache_key == build.cache_key))
            out = _generate_on_parity_model(backend, build, server=config, parity=parity, work_dir=work_dir,
                                            cache_dir=caches, progress=progress, concurrency=bench.max_concurrency,
                                            cancel=stop_parity)
            with lock:
                gens[build.tag] = out
                judge(gens)

        try:
            if not together:
                for build in parity_builds:
                    generate(build)
                return
            with ThreadPoolExecutor(max_workers=len(parity_builds), thread_name_prefix="parity") as pool:
                for future in [pool.submit(generate, build) for build in parity_builds]:
                    future.result()
        except BaseException:
            for event in cancel.values():   # a parity server that cannot start fails the comparison: stop waiting
                event.set()
            raise

    results = {build.tag: GridResult(build=build, startup_s=0.0, evidence={}) for build in (a, *bs)}
    stop_parity = threading.Event()   # a speed server failed to start: parity servers still starting stop waiting

    def dropped(build: Build) -> bool:
        return stop_on_parity_failure and build.tag in reports and not reports[build.tag].ok

    # Parity servers before the speed servers: when asked to start one at a time, or when the caller's ports
    # have none for them (they then take their builds' ports, free again before the speed servers start).
    concurrent_parity = on_parity_model and together and (
        ports is None or all(f"{build.tag}-parity" in ports for build in parity_builds))
    if on_parity_model and not concurrent_parity:
        parity_phase(own_ports=False)
    alive = [build for build in (a, *bs) if build is a or not dropped(build)]
    if len(alive) == 1:
        return [_arm_result(results[a.tag], results[b.tag], reports.get(b.tag), cells, stats_cfg) for b in bs]
    with contextlib.ExitStack() as stack:
        speed_ports = {build.tag: ports[build.tag] for build in alive} if ports else {}
        caches: dict[str, Path] = {}
        for build in alive:
            caches[build.tag] = cache_dir_for(build, cache_dir, taken=tuple(caches.values()))
        seeded = [build.tag for build in alive
                  if seed_cache(a, caches[a.tag], build, caches[build.tag])]
        if seeded:
            progress(f"{', '.join(seeded)}: engine args alone changed; starting from a copy of {a.tag}'s caches")

        def start(build: Build) -> ServerStart:
            config = server.model_copy(update={"port": speed_ports[build.tag]}) if speed_ports else server
            return lambda event: serve(backend, tree=build.tree, config=config, engine_args=build.engine_args,
                                       log_path=work_dir / f"server-{build.tag}.log", cache_dir=caches[build.tag],
                                       cancel=event)

        parity_thread = None
        if concurrent_parity:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-phase"))
            parity_thread = pool.submit(parity_phase, True)
        servers: dict[str, Server] = {}
        errors: dict[str, HarnessError] = {}
        try:
            if together:
                progress("starting " + ", ".join(f"{build.tag}" for build in alive) + " together"
                         + (" (and the parity servers)" if parity_thread else ""))
                servers, failed = start_together(stack, {build.tag: start(build) for build in alive},
                                                 cancel=cancel, progress=progress,
                                                 tolerate=frozenset(b.tag for b in bs) if len(bs) > 1 else frozenset())
                errors.update(failed)
            else:
                for build in alive:
                    progress(f"starting server for {build.tag}")
                    try:
                        servers[build.tag] = stack.enter_context(start(build)(cancel[build.tag]))
                    except HarnessError as exc:
                        if build is a or len(bs) == 1:
                            raise
                        errors[build.tag] = exc
                        continue
                    progress(f"server {build.tag} ready in {servers[build.tag].startup_s:.1f} s")
        except BaseException:
            stop_parity.set()                 # the parity servers are not waited for longer than needed
            for event in cancel.values():
                event.set()
            raise
        finally:
            if parity_thread is not None:
                parity_thread.result()        # its error (a parity server that would not start) is the A/B's
        if parity is not None and not on_parity_model:
            progress("parity: generating on " + ", ".join(b.tag for b in bs) + ("" if reference else f" and {a.tag}"))
            gens = {tag: held_generations(srv.base_url, server.served_model_name, prompts, parity,
                                          concurrency=bench.max_concurrency)
                    for tag, srv in servers.items() if tag != a.tag or not reference}
            judge(gens)
        for tag, srv in servers.items():
            results[tag] = GridResult(build=results[tag].build, startup_s=srv.startup_s, evidence=srv.evidence)
        measured = {tag: srv for tag, srv in servers.items()
                    if tag == a.tag or not dropped(results[tag].build)}
        for tag in set(servers) - set(measured):   # broke parity: not benchmarked, its server idles frozen
            servers[tag].running.freeze()
        if len(measured) > 1:
            order = [(build.tag, measured[build.tag]) for build in (a, *bs) if build.tag in measured]
            if b_first:
                order = order[1:] + order[:1]
            jobs = _jobs(cells, order, server.model, bench.repeats)
            progress(f"benchmark: {len(jobs)} runs interleaved, the other server{'s' if len(order) > 2 else ''} "
                     "frozen during each")
            failed: dict[str, HarnessError] = {}   # a candidate whose run failed (or failed its checks): its error
            with _all_thawed(measured):
                runs = run_jobs(jobs, bench, work_dir=work_dir / "bench", on_done=on_run,
                                check_alive=_alive_check(measured), before_job=_measure_only(measured),
                                failed=failed, reference=a.tag)
            check_unchanged(expected, roots, when="while the builds were served and measured")
            for run in runs:
                results[run.job.tag].runs.append(run)
            miscounted = {**mismatched_inputs(runs, reference=a.tag), **failed}
            for tag, exc in miscounted.items():   # that candidate's result is its error; the others stand
                errors[tag] = exc
                progress(f"{tag}: {exc}")
            if parity is not None and {**server.engine_args, **a.engine_args}.get("load_format") != "dummy":
                # Dummy speed weights make every logprob equal: their outputs are ties by construction.
                for build in bs:
                    if build.tag not in measured or build.tag not in reports or build.tag in miscounted:
                        continue
                    workload = compare_workload(
                        results[a.tag].runs, results[build.tag].runs, tokenizer=server.model,
                        reference_url=measured[a.tag].base_url, model=server.served_model_name,
                        tie_margin=parity.tie_margin, answer=copy_task_answer if bench.dataset == "copy-task" else None,
                        alpha=parity.workload_alpha, logprob_tolerance=parity.workload_logprob_tolerance)
                    reports[build.tag] = dataclasses.replace(reports[build.tag], workload=workload)
                    progress(f"{build.tag}: {workload.summary()}" if len(bs) > 1 else workload.summary())
    return [_arm_result(results[a.tag], results[b.tag], reports.get(b.tag), cells, stats_cfg,
                        error=errors.get(b.tag)) for b in bs]


def _arm_result(ga: GridResult, gb: GridResult, report: ParityReport | None, cells: list[Cell],
                stats_cfg: StatsConfig, error: HarnessError | None = None) -> ABResult:
    """One candidate's A/B out of a comparison: its ratios to A, or (not benchmarked, or its runs failed a
    check) its parity and its error alone. A candidate with an error never has ratios: its runs may have been
    measured, but with token counts or a clock that cannot be trusted."""
    if error is not None or not gb.runs:
        return ABResult(a=ga, b=gb, parity=report, cells={}, overall=None, error=error)
    cell_cis, _ = grid_ratios(ga, gb, cells, stats_cfg)
    overall, images = split_headlines(ga, gb, cells, stats_cfg)
    return ABResult(a=ga, b=gb, parity=report, cells=cell_cis, overall=overall, images=images)
