"""Where candidate evaluations run: here, one at a time (`local`), or as Ray tasks, several at once (`ray`).

An evaluation is one interleaved A/B (parity first, then the grid) of a prepared candidate tree
against the incumbent tree, both servers on the same node: a candidate measured on one host is never
compared with an incumbent measured on another. Everything an evaluation needs travels as data
(`EvalJob`), and everything it produces comes back as data (`EvalOutcome`); the coordinator alone
gates, writes the audit log and commits. The trees are read from the campaign folder, so on a
multi-node cluster that folder must be on a filesystem every node mounts at the same path.

A lost worker or node is not left to Ray's silent retries: the coordinator sees the loss, records
it, kills what the dead attempt left running and resubmits up to `max_retries` times, then records
the evaluation as failed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from agent.errors import CampaignError
from agent.measurements import HARNESS, Measurements
from agent.spec import ExecutorConfig, SandboxConfig
from harness.config import BenchmarkConfig, ParityConfig, ServerConfig, StatsConfig
from harness.integrity import MeasurementDigest
from harness.measure import ABResult, Build
from harness.parity import Generation
from sandbox.factory import backend_from_config
from sandbox.reap import reap_under

__all__ = ["EvalJob", "EvalOutcome", "Executor", "LocalExecutor", "RayExecutor", "WorkerLost", "evaluate",
           "make_executor", "preflight"]

Progress = Callable[[str], None]


class WorkerLost(Exception):
    """The worker or node running an evaluation died, and every allowed retry was used up."""


@dataclass(frozen=True)
class EvalJob:
    iteration: int
    a: Build                               # the incumbent
    b: Build                               # the candidate (its patch already applied to b.tree)
    ports: dict[str, int]                  # gated by the coordinator, disjoint across a round
    server: ServerConfig
    bench: BenchmarkConfig
    stats: StatsConfig
    parity: ParityConfig
    sandbox: SandboxConfig
    work_dir: Path                         # runs/itNNN: the trees, server logs, bench results
    cache_dir: Path
    reference: list[Generation]
    attempt: int = 1
    # "screen": the A/B that finds a candidate; "confirm": the fresh, independent A/B a candidate that
    # cleared the bar must pass again before it is committed (new servers, seeds, B-first interleaving)
    purpose: str = "screen"
    measurement: MeasurementDigest | None = None   # the measurement path as the campaign found it
    measurement_host: str = ""                     # where that digest was taken (another node takes its own)

    @property
    def attempt_dir(self) -> Path:
        return self.work_dir if self.attempt == 1 else self.work_dir / f"retry{self.attempt - 1}"


@dataclass(frozen=True)
class EvalOutcome:
    iteration: int
    result: ABResult | None = None
    error: BaseException | None = None     # what the evaluation raised (HarnessError, SandboxError, WorkerLost…)
    placement: dict[str, Any] = field(default_factory=dict)   # node, host, GPUs, pid, attempt, seconds


def _placement(job: EvalJob, executor: str) -> dict[str, Any]:
    where: dict[str, Any] = {"executor": executor, "host": socket.gethostname(), "pid": os.getpid(),
                             "attempt": job.attempt, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if executor == "ray":
        import ray

        ctx = ray.get_runtime_context()
        where.update(node_id=ctx.get_node_id(), node_ip=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                     gpu_ids=[str(g) for g in ray.get_gpu_ids()])
    return where


def evaluate(job: EvalJob, *, executor: str = "local", progress: Progress = lambda _: None,
             measure: Measurements = HARNESS) -> tuple[ABResult, dict[str, Any]]:
    """Run one evaluation on this host. Safe to call in a Ray worker: it rebuilds the backend here."""
    placement = _placement(job, executor)
    job.attempt_dir.mkdir(parents=True, exist_ok=True)
    # Written first, so an operator (or the fault test) can see which process holds which evaluation.
    (job.attempt_dir / f"placement-attempt{job.attempt}.json").write_text(json.dumps(placement))
    if job.attempt > 1:   # a dead attempt's servers may still hold the ports on this host
        from sandbox.docker_backend import reap_containers_under

        placement["reaped_pids"] = reap_under(job.work_dir)
        placement["reaped_containers"] = reap_containers_under(job.work_dir)
    t0 = time.monotonic()
    result = measure.ab(backend_from_config(job.sandbox), job.a, job.b, server=job.server, bench=job.bench,
                        stats_cfg=job.stats, parity=job.parity, work_dir=job.attempt_dir,
                        cache_dir=job.cache_dir, reference=job.reference, stop_on_parity_failure=True,
                        ports=job.ports, progress=progress, b_first=job.purpose == "confirm",
                        measurement=job.measurement if job.measurement_host == socket.gethostname() else None)
    placement["seconds"] = round(time.monotonic() - t0, 1)
    return result, placement


OnRetry = Callable[[EvalJob, BaseException], None]


class Executor(Protocol):
    name: str
    slots: int
    gpus_per_eval: float

    def run(self, jobs: list[EvalJob], *, on_retry: OnRetry, progress: Progress) -> list[EvalOutcome]: ...
    def close(self) -> None: ...


class LocalExecutor:
    """Evaluations in this process, on this host (what the single-machine CLI uses). With `slots` > 1, a round's
    screening A/Bs are one comparison: the incumbent's server and every candidate's start together and their
    runs interleave (harness.measure.compare_arms), so one start-up and one incumbent serve several candidates.
    Confirmations, and a round of one, are ordinary A/Bs."""

    name = "local"

    def __init__(self, gpus_per_eval: float = 0.0, measure: Measurements = HARNESS, slots: int = 1) -> None:
        self.gpus_per_eval = gpus_per_eval
        self.measure = measure
        self.slots = slots

    def run(self, jobs: list[EvalJob], *, on_retry: OnRetry, progress: Progress) -> list[EvalOutcome]:
        if len(jobs) > 1 and all(job.purpose == "screen" for job in jobs):
            return self._together(jobs, progress)
        outcomes = []
        for job in jobs:
            try:
                result, placement = evaluate(job, progress=progress, measure=self.measure)
                outcomes.append(EvalOutcome(job.iteration, result=result, placement=placement))
            except Exception as exc:   # judged by the coordinator, like any other evaluation error
                outcomes.append(EvalOutcome(job.iteration, error=exc, placement=_placement(job, "local")))
        return outcomes

    def _together(self, jobs: list[EvalJob], progress: Progress) -> list[EvalOutcome]:
        """One comparison of the round's candidates against the first job's incumbent tree (every job's is a
        copy of the same commit). Each candidate's server gets its own tag (B<iteration>) there and is "B" again
        in its result. Its seconds are the comparison's, shared out: the GPU budget is charged once."""
        first = jobs[0]
        tags = {job.iteration: f"B{job.iteration}" for job in jobs}
        ports = {first.a.tag: first.ports[first.a.tag]}
        for job in jobs:
            ports[tags[job.iteration]] = job.ports[job.b.tag]
            if f"{job.b.tag}-parity" in job.ports:
                ports[f"{tags[job.iteration]}-parity"] = job.ports[f"{job.b.tag}-parity"]
        placement = _placement(first, "local")
        placement["screened_together"] = [job.iteration for job in jobs]
        first.attempt_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            results = self.measure.arms(
                backend_from_config(first.sandbox), first.a,
                [replace(job.b, tag=tags[job.iteration]) for job in jobs],
                server=first.server, bench=first.bench, stats_cfg=first.stats, parity=first.parity,
                work_dir=first.attempt_dir, cache_dir=first.cache_dir, reference=first.reference,
                stop_on_parity_failure=True, ports=ports, progress=progress,
                measurement=first.measurement if first.measurement_host == socket.gethostname() else None)
        except Exception as exc:   # the incumbent's server, the client or the measurement path: every candidate's
            placement["seconds"] = round((time.monotonic() - t0) / len(jobs), 1)
            return [EvalOutcome(job.iteration, error=exc, placement=dict(placement)) for job in jobs]
        seconds = time.monotonic() - t0
        placement.update(seconds=round(seconds / len(jobs), 1), comparison_seconds=round(seconds, 1),
                         comparison_dir=str(first.attempt_dir))
        outcomes = []
        for job, result in zip(jobs, results, strict=True):
            if result.error is not None:
                outcomes.append(EvalOutcome(job.iteration, error=result.error, placement=dict(placement)))
                continue
            outcomes.append(EvalOutcome(job.iteration, result=_retagged(result, job.b), placement=dict(placement)))
        return outcomes

    def close(self) -> None:
        pass


def _retagged(result: ABResult, b: Build) -> ABResult:
    """A candidate's result from a comparison of several, under its own build and tag again."""
    runs = [replace(run, job=replace(run.job, tag=b.tag)) for run in result.b.runs]
    return replace(result, b=replace(result.b, build=b, runs=runs))


def _evaluate_task(job: EvalJob, measure: Measurements) -> tuple[ABResult, dict[str, Any]]:
    return evaluate(job, executor="ray", measure=measure)


class RayExecutor:
    """Each evaluation is a Ray task asking for the spec's resources (one GPU each on a GPU cluster)."""

    name = "ray"

    def __init__(self, config: ExecutorConfig, measure: Measurements = HARNESS) -> None:
        import ray

        self._ray = ray
        # Shipped with every task, so it must pickle: HARNESS is stateless (a worker measures with its own
        # harness); the unit suite's fake is plain data whose "servers" are processes on the worker's host.
        self.measure = measure
        self.slots = config.slots
        self.config = config.ray
        self.gpus_per_eval = config.ray.num_gpus
        self._owns_cluster = not ray.is_initialized()
        if self._owns_cluster:
            if config.ray.address:
                ray.init(address=config.ray.address, logging_level=logging.WARNING, log_to_driver=False)
            else:   # a private local cluster sized for exactly `slots` evaluations
                ray.init(num_cpus=max(1, int(config.slots * config.ray.num_cpus)),
                         num_gpus=int(config.slots * config.ray.num_gpus), include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=False)
        # max_retries=0: retries are the coordinator's, so each one is on record.
        self._evaluate = ray.remote(max_retries=0)(_evaluate_task)
        self._reap = ray.remote(max_retries=0, num_cpus=0)(reap_under)

    def _submit(self, job: EvalJob) -> Any:
        return self._evaluate.options(num_cpus=self.config.num_cpus, num_gpus=self.config.num_gpus,
                                      resources=dict(self.config.resources) or None).remote(job, self.measure)

    def _lost(self, exc: BaseException) -> bool:
        errors = self._ray.exceptions
        lost = (errors.WorkerCrashedError, errors.NodeDiedError, errors.ObjectLostError, errors.OutOfMemoryError,
                errors.LocalRayletDiedError, errors.RaySystemError)
        return isinstance(exc, lost)

    def _reap_on_node(self, job: EvalJob, placement: dict[str, Any] | None) -> None:
        """Kill the dead attempt's servers on the node that ran it, when that node is still alive."""
        if not placement or "node_id" not in placement:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(node_id=placement["node_id"], soft=False)
        try:
            self._ray.get(self._reap.options(scheduling_strategy=strategy).remote(job.work_dir), timeout=60)
        except Exception:  # the node is gone with its processes; nothing left to reap there
            return

    def run(self, jobs: list[EvalJob], *, on_retry: OnRetry, progress: Progress) -> list[EvalOutcome]:
        ray = self._ray
        pending: dict[Any, EvalJob] = {self._submit(job): job for job in jobs}
        progress(f"{len(jobs)} evaluation(s) submitted to Ray ({self.slots} slot(s))")
        done: dict[int, EvalOutcome] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            try:
                result, placement = ray.get(ready[0])
                done[job.iteration] = EvalOutcome(job.iteration, result=result, placement=placement)
                progress(f"iteration {job.iteration} evaluated on {placement.get('host')} "
                         f"(node {str(placement.get('node_id'))[:8]}) in {placement.get('seconds')} s")
            except ray.exceptions.RayTaskError as exc:   # the evaluation itself raised: an ordinary failure
                cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                done[job.iteration] = EvalOutcome(job.iteration, error=cause, placement=_read_placement(job))
            except Exception as exc:
                if not self._lost(exc):
                    raise
                placement = _read_placement(job)
                self._reap_on_node(job, placement)
                reap_under(job.work_dir)   # the same host as the coordinator (a local cluster)
                if job.attempt <= self.config.max_retries:
                    on_retry(job, exc)
                    retry = replace(job, attempt=job.attempt + 1)
                    pending[self._submit(retry)] = retry
                    continue
                done[job.iteration] = EvalOutcome(
                    job.iteration, placement=placement,
                    error=WorkerLost(f"worker lost {job.attempt} time(s), retries used up: "
                                     f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))
        return [done[job.iteration] for job in jobs]

    def close(self) -> None:
        if self._owns_cluster and self._ray.is_initialized():
            self._ray.shutdown()


def _read_placement(job: EvalJob) -> dict[str, Any]:
    path = job.attempt_dir / f"placement-attempt{job.attempt}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {"attempt": job.attempt}


def preflight(config: ExecutorConfig) -> None:
    """Fail in seconds, before a workspace or log is created, when Ray is missing or its head is not there."""
    if config.kind == "local":
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise CampaignError("executor.kind: ray needs Ray: pip install 'ratchet[ray]' (ray==2.60.0)") from None
    address = config.ray.address
    if address and re.fullmatch(r"[\w.-]+:\d+", address):
        host, port = address.rsplit(":", 1)
        try:   # Ray itself keeps retrying an unreachable head for minutes
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise CampaignError(f"executor.ray.address {address}: no Ray head answers there ({exc}); "
                                "start one with `ray start --head` or fix the address") from None


def make_executor(config: ExecutorConfig, *, gpus_per_eval: float = 0.0, measure: Measurements = HARNESS) -> Executor:
    """Callers run preflight(config) first, before they create anything a failure would leave behind. Both
    executors measure through `measure` (the harness; only code, never a spec, passes the unit suite's fake)."""
    if config.kind == "local":
        return LocalExecutor(gpus_per_eval=gpus_per_eval, measure=measure, slots=config.slots)
    try:
        return RayExecutor(config, measure=measure)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = config.ray.address or "a local Ray instance"
        raise CampaignError(f"executor.ray: could not start or reach {where}: {str(exc).splitlines()[0]}") from None
