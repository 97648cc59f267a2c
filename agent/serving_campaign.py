"""The serving target of the campaign engine (agent/engine.py): candidates are patches of a vLLM tree and its
serving.yaml, measured by servers and the benchmark grid.

Only a candidate with exact token parity on the held prompts (ids and logprob drift) and a Student-t
lower bound of the speedup above the spec's threshold (no cell regressing past its guard) is a winner, and
only a winner that clears the same bar again in a fresh, independent confirmation A/B moves the incumbent
forward; its confirmation is its evidence. Every step is written to the audit log before it happens, and
the log alone is enough to resume.

False accepts across a campaign: a committed candidate passed a screen and then an independent strict
confirmation (new servers and prompts, twice the repeats, the lower bound of a 95 % interval above 1.02),
so under "no gain" each iteration commits with probability at most P(screen) * P(confirmation), and by the
union bound a campaign of K iterations at most K times that. Measured on recorded A/A data
(experiments/calibrate_stats.py): 0.17 % per candidate, so at most 0.5 % for the README's K = 3.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import records
from agent.base import SHOWN_BUDGETS, CampaignState, HistoryEntry, Outcome, Proposal
from agent.engine import Engine, IterationOutcome, Pending
from agent.environment import proposer_context
from agent.errors import ActionDenied
from agent.evidence import bind_step
from agent.executor import EvalJob, EvalOutcome, Executor, LocalExecutor
from agent.incumbent_profile import profile_incumbent
from agent.iteration import classify, record_outcome
from agent.iteration import commit as commit_change
from agent.server_gate import gate_servers, parity_server_alongside
from agent.spec import CampaignSpec
from agent.tools import GatedTools, to_unified_diff
from agent.trial import IterationTrials, Trials
from harness.ceilings import Ceilings
from harness.certificate import certificate_line, parity_certificate
from harness.engine_args import spec_owned_changes
from harness.errors import HarnessError, PortInUse
from harness.integrity import MeasurementDigest
from harness.measure import ABResult, Build, GridResult
from harness.parity import Generation, ParityReport
from harness.physics import ServedModel, physics_of, roofline_rows, served_model
from harness.server import FAILURE_EXCERPT_CHARS
from harness.stats import Physical, Verdict, decide, impossible_cells
from policies import Policy
from policies.diffparse import parse_patch
from sandbox.base import Backend
from sandbox.errors import PatchRejected
from sandbox.workspace import SERVING_FILE, Workspace

if TYPE_CHECKING:
    from agent.campaign import CampaignEnd, Ending

__all__ = ["Campaign", "Confirmation", "IterationOutcome"]


@dataclass(frozen=True)
class Confirmation:
    """The fresh A/B of a round's best candidate, or (outcome None) why it could not run."""

    outcome: EvalOutcome | None
    reason: str


# Added to the benchmark seed for a confirmation: its random prompts are not the screen's.
CONFIRM_SEED_OFFSET = 1_000_003
PORT_ATTEMPTS = 3          # evaluations whose port another campaign took first


@dataclass(kw_only=True)
class Campaign(Engine["CampaignEnd"]):
    """The serving target: a vLLM tree and its serving.yaml, measured by servers and the benchmark grid with parity
    on held prompts; a round's candidates are screened together against one incumbent, and only the best of them
    is confirmed in a fresh A/B and committed. The engine (agent/engine.py) runs the rounds."""

    spec: CampaignSpec
    spec_path: Path
    backend: Backend
    reference: list[Generation]
    baseline_rows: list[dict[str, Any]]
    incumbent_rows: list[dict[str, Any]]
    profile: str | None = None             # the incumbent's profile (baseline's, then each accept's), rendered
    profile_steps: dict[str, dict[str, float]] = field(default_factory=dict)   # its step table, as numbers
    started: float = field(default_factory=time.monotonic)
    executor: Executor = field(default_factory=LocalExecutor)
    _eval_minutes: float = 0.0                              # the longest evaluation so far, for the GPU budget
    _eval_seconds: float = 0.0                              # the same in wall seconds, for the wall budget
    _confirm_seconds: float = 0.0                           # the last confirmation's wall seconds, once one ran
    effective_serving: dict[str, object] = field(default_factory=dict)   # vLLM's view of the incumbent's args
    _resolver: ThreadPoolExecutor | None = field(default=None, repr=False)   # the round's no-op checks
    _noops: dict[int, Future[str | None]] = field(default_factory=dict, repr=False)   # under way, by iteration
    measurement: MeasurementDigest | None = None    # the measurement path as the campaign found it
    context: dict[str, str] = field(default_factory=dict)   # the proposer's environment block (proposer_context)
    served: dict[str, object] | None = None   # vllm-image: the environment with the image's versions (agent/target.py)
    trials: Trials | None = None                            # try_patch's runner, made on first use
    # What the first round is planned with: the baseline server's start-up and its grid's seconds (one build)
    round_basis: tuple[float, float] = (0.0, 0.0)
    _last_round: tuple[float, int] | None = None            # the last round's seconds and its candidates
    # The conclusion (final comparison and verdict), kept for the CampaignEnd built after campaign.end
    final: ABResult | None = None
    ending: Ending | None = None
    # This host's ceilings, measured before the baseline (None: not measured, or a log from before them): every
    # candidate's cells are placed on the roofline, and one faster than its floor is quarantined as impossible.
    ceilings: Ceilings | None = None

    def resolve_defaults(self) -> None:
        """Ask the pristine vLLM which engine args are in force for the incumbent (explicit and defaults),
        so that no proposer spends an A/B on a value already in force. Unknown: the proposer sees {}."""
        config = self.workspace.serving_config()
        try:
            self.effective_serving = self.measure.engine_defaults(self.spec.server.model, config,
                                                                  env=self.spec.server.env)
        except HarnessError as exc:
            self.effective_serving = {}
            self.writer.append(records.ERROR, payload={"phase": "engine defaults", "type": type(exc).__name__,
                                                 "message": str(exc)[:2000]})
            return
        self.writer.append(records.ENGINE_DEFAULTS, payload={"incumbent": self.incumbent_ref, "serving": config,
                                                       "effective": self.effective_serving})

    # -- the engine's hooks -----------------------------------------------------------------------
    @property
    def max_iterations(self) -> int:
        return self.spec.budget.max_iterations

    def tools(self, i: int) -> GatedTools:
        return GatedTools(gate=self.gate, root=self.workspace.root, iteration=i, trial=self._trials(i))

    def prepare(self, i: int, proposal: Proposal, earlier: Sequence[Pending]) -> tuple[Any, str]:
        reserved = [port for item in earlier if item.job is not None for port in item.job.ports.values()]
        job, diff, noop = self._prepare(i, proposal, reserved)
        if noop is not None:
            self._noops[i] = noop
        return job, diff

    def evaluate(self, items: Sequence[Pending]) -> dict[int, Any]:
        jobs = [item.job for item in items]
        evals: dict[int, EvalOutcome] = {}
        if not jobs:
            return evals
        parallel = f" ({len(jobs)} candidates in parallel)" if len(jobs) > 1 else ""
        self.on_event("phase", {"phase": f"verify: parity, then interleaved A/B{parallel}"})
        for o in self._evaluate(jobs):
            evals[o.iteration] = o
            # a comparison of several candidates took its whole time for all of its builds
            together = o.placement.get("comparison_seconds")
            whole = float(together or o.placement.get("seconds") or 0.0)
            self._eval_seconds = max(self._eval_seconds,
                                     self._ab_seconds(whole, builds=len(jobs) + 1 if together else 2))
        return evals

    def finish(self, i: int, outcome: Outcome, reason: str, proposal: Proposal | None) -> IterationOutcome:
        return self._finish(i, outcome, reason, proposal=proposal)

    def slots(self) -> tuple[int, str]:
        slots = min(self.executor.slots, self._gpu_slots())
        return slots, f"GPU budget: {self.gate.left('gpu_minutes'):.1f} GPU-minutes left, less than one evaluation"

    def reserve_seconds(self) -> float:
        """Once something is accepted, a round must leave time for the final best-vs-stock comparison (a round's
        own confirmation checks that it leaves time for itself and the final)."""
        return self._strong_seconds if any(h.outcome == "accepted" for h in self.history) else 0.0

    def after_round(self, seconds: float, outcomes: Sequence[IterationOutcome]) -> None:
        self._last_round = (seconds, len(outcomes))
        self._spend_gpu(list(outcomes))

    def close(self) -> None:
        self.executor.close()
        if self._resolver is not None:
            self._resolver.shutdown(wait=False, cancel_futures=True)

    def conclude(self, base_commit: str, accepted: list[int]) -> dict[str, Any]:
        from agent.campaign import final_comparison, judge_ending  # the ending's rules live with the campaign

        why = ""
        if accepted:   # always, whatever the budget says: the loop reserved its time; an overrun beats no verdict
            self.final, why = final_comparison(self, base_commit)
        unconfirmed = tuple(f"iteration {h.iteration}: screen {h.speedup}" for h in self.history
                            if h.outcome != "accepted" and "wall budget left" in h.detail)
        final = self.final
        impossible = tuple(impossible_cells(self._physics(final.b))) if final else ()
        self.ending = judge_ending(len(accepted), self.final, why, unconfirmed, impossible)
        return {"verdict": {"status": self.ending.status, "text": self.ending.text},
                "final": ({"overall": vars(final.overall) if final.overall else None,
                           **({"images": vars(final.images)} if final.images else {}),
                           "cells": {label: vars(per["headline"]) for label, per in final.cells.items()},
                           "roofline": {str(row["cell"]): row.get("roofline") for row in self._rows(final.b)},
                           "parity_ok": bool(final.parity and final.parity.ok),
                           **({"certificate": self.certificate(final.parity, final.b)} if final.parity else {})}
                          if final else None)}

    def certificate(self, report: ParityReport, grid: GridResult) -> dict[str, Any]:
        """The parity certificate of an A/B this campaign judged (harness/certificate.py), with the candidate's
        cells on the host's roofline."""
        fractions = {str(row["cell"]): {k: v for k, v in (row.get("roofline") or {}).items()
                                        if k in CERTIFIED_FRACTIONS and isinstance(v, float)}
                     for row in self._rows(grid)}
        return parity_certificate(report, tolerance_basis=self.spec.parity.tolerance_basis,
                                  roofline={cell: f for cell, f in fractions.items() if f})

    def _served(self, build: Build) -> ServedModel:
        return served_model(self.spec.server.model, {**self.spec.server.engine_args, **build.engine_args})

    def _rows(self, grid: GridResult) -> list[dict[str, Any]]:
        """A build's grid rows, each with its roofline column (harness/physics.py)."""
        return roofline_rows(grid.table(self.spec.benchmark.cells()), self._served(grid.build), self.ceilings,
                             self.spec.benchmark)

    def _physics(self, grid: GridResult) -> dict[str, Physical]:
        """Each measured cell's fastest run against its floor: what decide() quarantines on."""
        cells = list(dict.fromkeys(run.job.cell for run in grid.runs))
        return physics_of(self._served(grid.build), self.ceilings, self.spec.benchmark,
                          {cell: grid.cell_metrics(cell) for cell in cells})

    def ended(self, stop: str, branch: str) -> CampaignEnd:
        from agent.campaign import campaign_end

        return campaign_end(self, stop, branch)

    # On an H200 a round of three (proposals and tree copies included) would have taken ~965 s, 1.22x its
    # baseline's start-up plus four of its grids (175 + 4 x 154 s; experiments/results/h200-arms-campaign.md:
    # it was cut short, so ~965 s is projected from 54 of its 64 runs). The first round's estimate is padded so.
    ROUND_MARGIN = 1.2

    def round_seconds(self, candidates: int) -> float:
        """What a round of `candidates` is expected to take: its servers' start-up (together: about one) and each
        build's grid once. From the last round when there was one (its time beyond one start-up scaled by the
        builds measured), else from the baseline's start-up and grid. 0 when nothing is known yet."""
        start, grid = self.round_basis
        if self._last_round is not None:
            seconds, measured = self._last_round
            return start + max(seconds - start, 0.0) * (candidates + 1) / (measured + 1)
        return self.ROUND_MARGIN * (start + grid * (candidates + 1))

    def _gpu_slots(self) -> int:
        """How many evaluations the GPU-minute budget still covers (unmetered: no limit)."""
        if self.executor.gpus_per_eval <= 0 or self._eval_minutes <= 0:
            return self.executor.slots
        left = self.gate.left("gpu_minutes")
        return self.executor.slots if left == float("inf") else \
            int(left // (self.executor.gpus_per_eval * self._eval_minutes))

    def _spend_gpu(self, outcomes: list[IterationOutcome]) -> None:
        for o in outcomes:
            seconds = float(o.placement.get("seconds") or 0.0)
            if seconds and self.executor.gpus_per_eval > 0:
                self._eval_minutes = max(self._eval_minutes, seconds / 60)
                self.gate.spend("gpu_minutes", self.executor.gpus_per_eval * seconds / 60, iteration=o.iteration)

    # -- steps ------------------------------------------------------------------------------------
    def state(self, i: int, pending: Sequence[HistoryEntry] = ()) -> CampaignState:
        return CampaignState(iteration=i, incumbent_ref=self.incumbent_ref,
                             serving_config=self.workspace.serving_config(),
                             incumbent_metrics=tuple(self.incumbent_rows), baseline_metrics=tuple(self.baseline_rows),
                             history=tuple(self.history) + tuple(pending), profile=self.profile,
                             profile_steps=dict(self.profile_steps),
                             baseline_serving_config=dict(self.spec.server.engine_args),
                             effective_serving_config=dict(self.effective_serving),
                             budget_left={r: self.gate.left(r) for r in SHOWN_BUDGETS},
                             allowed_paths=allowed_write_globs(self.gate.policy),
                             environment=self._context())

    def _context(self) -> dict[str, str]:
        if not self.context:   # once per campaign: it reads the model's config and the installed versions
            self.context = proposer_context(self.spec.server.model, dict(self.spec.server.engine_args),
                                            environment=self.served)
        return self.context

    def _trials(self, i: int) -> IterationTrials:
        if self.trials is None:
            chars = self.spec.proposer.llm.model_dump().get("try_log_chars", FAILURE_EXCERPT_CHARS)
            self.trials = Trials(spec=self.spec, workspace=self.workspace, backend=self.backend, gate=self.gate,
                                 writer=self.writer, log_dir=self.log_dir, measurement=self.measurement,
                                 log_chars=int(chars), measure=self.measure)
        return self.trials.for_iteration(i, self.incumbent_ref)

    def _prepare(self, i: int, proposal: Proposal, reserved: list[int]
                 ) -> tuple[EvalJob, str, Future[str | None] | None]:
        """Gate the patch, build both trees (incumbent, candidate) and gate both servers: everything an
        evaluation needs, as data; and, for a serving.yaml-only patch, its no-op check under way."""
        ws = self.workspace
        diff = to_unified_diff(ws.root, proposal.patch, proposal.patch_format)
        self.gate.require({"kind": "patch", "diff": diff}, iteration=i)      # the loop gates what it applies
        work = self.log_dir / "runs" / f"it{i:03d}"
        tree_b = ws.checkout_copy(self.incumbent_ref, work / "tree-B")
        tree_a = ws.checkout_copy(self.incumbent_ref, work / "tree-A")
        try:
            canonical = Workspace.open(tree_b, ws.package).apply_patch(diff)
            self.writer.append(records.ITERATION_PATCH, iteration=i,
                               payload={"diff": canonical, "base": self.incumbent_ref})
            # cache keys = content: A finds the incumbent's compiled graphs (the baseline's, or the accepted
            # candidate's); B's are its own, and become the next incumbent's if it is committed. A patch of
            # serving.yaml alone leaves the code as it is (code_key): B's folder starts as a copy of A's.
            serving_only = set(parse_patch(canonical).paths) == {SERVING_FILE}
            code = ws.code_hash(self.incumbent_ref)
            a = Build(tag="A", tree=tree_a, engine_args=ws.serving_config(), ref=self.incumbent_ref,
                      cache_key=ws.tree_hash(self.incumbent_ref), code_key=code)
            candidate = Workspace.open(tree_b)
            b = Build(tag="B", tree=tree_b, engine_args=candidate.serving_config(), ref="candidate",
                      cache_key=candidate.content_hash(), code_key=code if serving_only else "")
            owned = spec_owned_changes(a.engine_args, b.engine_args, frozenset(self.spec.server.candidate_may_change))
            if owned:
                # dummy weights measure speed only; a lower precision or a bigger memory share buys speed with
                # accuracy or the other build's resources: what is measured would change, not how fast
                raise PatchRejected(f"serving.yaml: {', '.join(owned)} is fixed by the spec; a candidate may not "
                                    "change it (the spec may allow it in server.candidate_may_change)")
            noop = self._check_noop(a.engine_args, b.engine_args) if serving_only else None
            ports = gate_servers(self.gate, self.spec, self._servers_of(a, b), i, exclude=reserved)
        except BaseException:
            for tree in (tree_a, tree_b):
                ws.remove_copy(tree)
            raise
        job = EvalJob(iteration=i, a=a, b=b, ports=ports, server=self.spec.server, bench=self.spec.benchmark,
                      stats=self.spec.stats, parity=self.spec.parity, sandbox=self.spec.sandbox, work_dir=work,
                      cache_dir=self.log_dir / "cache", reference=self.reference, measurement=self.measurement,
                      measurement_host=socket.gethostname())
        return job, canonical, noop

    def _check_noop(self, incumbent: dict[str, object], candidate: dict[str, object]) -> Future[str | None] | None:
        """A patch of serving.yaml alone that vLLM resolves to the engine args already in force changes nothing
        the servers run (e.g. async_scheduling on vLLM CPU, which forces it off): it is refused before any
        server starts instead of costing a full A/B whose ratio can only be noise. Unknown either way (no
        resolution of the incumbent, or this one fails): the A/B decides.

        The same text raises at once. vLLM's resolution (a fresh process importing vLLM: ~23 s on an H200 host)
        runs in the background, so that a round's candidates are resolved together rather than one after
        another (3 x 23 s before a round of three could start its servers); `screen` collects them."""
        if incumbent == candidate:
            raise PatchRejected("no-op: the patch changes serving.yaml's text, not its engine args")
        if not self.effective_serving:
            return None
        in_force = dict(self.effective_serving)
        model, env = self.spec.server.model, self.spec.server.env

        def resolve() -> str | None:
            try:
                effective = self.measure.engine_defaults(model, candidate, env=env)
            except HarnessError:
                return None
            if effective != in_force:
                return None
            keys = sorted(k for k in set(incumbent) | set(candidate) if incumbent.get(k) != candidate.get(k))
            changes = ", ".join(f"{k}: {incumbent.get(k, '(unset)')} -> {candidate.get(k, '(unset)')}" for k in keys)
            return (f"no-op: vLLM resolves the changed serving.yaml ({changes}) to the engine args already in force "
                    f"({_fmt_args(effective)}); nothing the servers run would change")

        if self._resolver is None:
            self._resolver = ThreadPoolExecutor(max_workers=max(1, self.executor.slots),
                                                thread_name_prefix="noop-check")
        return self._resolver.submit(resolve)

    def screen(self, items: Sequence[Pending]) -> None:
        """Wait for the round's no-op checks; a candidate vLLM resolves to the args in force is refused (invalid)
        before any server starts, and its trees are removed. Its servers' ports, gated already, stay unused."""
        for item in items:
            noop = self._noops.pop(item.iteration, None)
            if noop is None:
                continue
            reason = noop.result()
            if reason is not None and item.job is not None:
                item.early = classify(self.writer, item.iteration, PatchRejected(reason))
                for tree in (item.job.a.tree, item.job.b.tree):
                    self.workspace.remove_copy(tree)
                item.job = None

    def cleanup(self, items: Sequence[Pending]) -> None:
        for item in items:
            if item.job is not None:
                for tree in (item.job.a.tree, item.job.b.tree):
                    self.workspace.remove_copy(tree)

    def _servers_of(self, a: Build, b: Build) -> list[tuple[str, dict[str, object]]]:
        """The servers an A/B starts: A's and B's, and B's parity server on the real checkpoint when it starts
        beside them (the reference is the baseline's): each on a port of its own."""
        servers = [(a.tag, a.engine_args), (b.tag, b.engine_args)]
        if parity_server_alongside(self.spec):
            servers.append((f"{b.tag}-parity", {**b.engine_args, **self.spec.parity.engine_args}))
        return servers

    def _gate_ports(self, job: EvalJob) -> dict[str, int]:
        return gate_servers(self.gate, self.spec, self._servers_of(job.a, job.b), job.iteration)

    def _evaluate(self, jobs: list[EvalJob]) -> list[EvalOutcome]:
        """Run evaluations. Another campaign on this host can take a port between its pick and its lease (the
        second server starts a minute after the first): such an evaluation runs again on newly gated ports,
        in a folder of its own, up to PORT_ATTEMPTS times in all."""
        done: dict[int, EvalOutcome] = {}
        pending = jobs
        for attempt in range(2, PORT_ATTEMPTS + 2):
            outcomes = self.executor.run(pending, on_retry=self._record_retry,
                                         progress=lambda msg: self.on_event("progress", {"message": msg}))
            for o in outcomes:
                done[o.iteration] = o
            self._bind(pending, outcomes)
            lost = [job for job in pending if isinstance(done[job.iteration].error, PortInUse)]
            if not lost or attempt > PORT_ATTEMPTS:
                break
            pending = []
            for job in lost:
                try:
                    ports = self._gate_ports(job)
                except ActionDenied:           # its PortInUse outcome stands
                    continue
                self.writer.append(records.ITERATION_PORT_RETRY, iteration=job.iteration, payload={
                    "error": str(done[job.iteration].error)[:500], "ports": ports, "attempt": attempt})
                self.on_event("progress", {"message": f"iteration {job.iteration}: a port was taken by another "
                                                     f"campaign; again on ports {sorted(ports.values())}"})
                name = job.work_dir.name
                pending.append(replace(job, ports=ports, work_dir=job.work_dir.with_name(f"{name}{attempt}")
                                       if name == "confirm" else job.work_dir / f"ports{attempt}"))
            if not pending:
                break
        return [done[job.iteration] for job in jobs]

    def _bind(self, jobs: list[EvalJob], outcomes: list[EvalOutcome]) -> None:
        """The evidence of every evaluation that measured something, one record per folder (a round's candidates
        screened together share theirs), before any record judges it. A failed evaluation's files are not bound:
        its outcome is its error, and what it left may still be written by processes a lost worker left behind."""
        folders: dict[Path, list[int]] = {}
        purpose: dict[Path, str] = {}
        by_iteration = {job.iteration: job for job in jobs}
        for o in outcomes:
            job = by_iteration[o.iteration]
            if o.result is None:
                continue
            where = o.placement.get("comparison_dir")
            folder = Path(where) if where else replace(job, attempt=int(o.placement.get("attempt") or
                                                                            job.attempt)).attempt_dir
            folders.setdefault(folder, []).append(job.iteration)
            purpose[folder] = job.purpose
        for folder, iterations in folders.items():
            bind_step(self.writer, folder, step=purpose[folder], iteration=iterations[0], iterations=iterations)

    def _record_retry(self, job: EvalJob, exc: BaseException) -> None:
        self.writer.append(records.ITERATION_RETRY, iteration=job.iteration, payload={
            "attempt": job.attempt, "error": type(exc).__name__, "message": str(exc)[:2000],
            "next_attempt": job.attempt + 1})
        self.on_event("progress", {"message": f"iteration {job.iteration}: worker lost ({type(exc).__name__}); "
                                              f"retrying (attempt {job.attempt + 1})"})

    def settle(self, items: Sequence[Pending], evals: dict[int, Any]) -> list[IterationOutcome]:
        """Judge and record in iteration order. Every candidate of a round was measured against the same
        incumbent, so at most one can be committed: the one with the highest lower bound."""
        verdicts: dict[int, Verdict] = {}          # only for results with exact parity
        accepted: dict[int, float] = {}
        for i, done in evals.items():
            if done.result and done.result.parity and done.result.parity.ok and done.result.overall:
                verdicts[i] = decide(done.result.overall, done.result.headline(), self.spec.stats, stage="screen",
                                     images=done.result.images, confirm_pairs=self.spec.benchmark.strong_repeats,
                                     physics=self._physics(done.result.b))
                if verdicts[i].accept and not verdicts[i].quarantine:
                    accepted[i] = done.result.overall.low
        best = max(accepted, key=lambda it: accepted[it]) if accepted else None
        confirmation = None
        if best is not None:
            item = next(it for it in items if it.iteration == best)
            assert item.job is not None
            confirmation = self._confirm(item.job, evals[best])
        outcomes = []
        for item in items:
            i, proposal = item.iteration, item.proposal
            o = evals.get(i)
            if item.early is not None or o is None:
                outcome, reason = item.early or ("failed", "not evaluated")
                outcomes.append(self._finish(i, outcome, reason, proposal=proposal))
            elif o.error is not None or o.result is None:
                outcome, reason = classify(self.writer, i, o.error or RuntimeError("evaluation returned nothing"))
                outcomes.append(self._finish(i, outcome, reason, proposal=proposal, placement=o.placement))
            else:
                assert proposal is not None
                outcomes.append(self._judge(i, proposal, item.diff, o, verdicts.get(i), best=best,
                                            confirmation=confirmation if i == best else None))
        accepted_now = [o.iteration for o in outcomes if o.outcome == "accepted"]
        if accepted_now:   # recorded after its result: the new incumbent's hot spots, for the next proposals
            taken = profile_incumbent(spec=self.spec, writer=self.writer, gate=self.gate, ws=self.workspace,
                                      backend=self.backend, log_dir=self.log_dir, iteration=accepted_now[0],
                                      on_event=self.on_event, reads_profile=self.proposer.reads_profile,
                                      measure=self.measure)
            if taken is not None:     # a failed profile leaves the previous one
                self.profile, self.profile_steps = taken.text, taken.steps
        return outcomes

    def _ab_seconds(self, whole: float, *, builds: int) -> float:
        """What an A/B of two builds at the screen's repeats takes, from an evaluation of `builds` builds that took
        `whole` seconds: one start-up (the servers start together) and each build's share of the benchmark."""
        start = self.round_basis[0]
        return start + max(whole - start, 0.0) * 2 / builds

    @property
    def _strong_seconds(self) -> float:
        """What a confirmation (or the final comparison) takes: an A/B of two builds at the strong repeats. Only the
        benchmark scales with the repeats; the start-up is paid once. (Scaling a round of three candidates' whole
        time by the repeats, as this did before, put a confirmation and the final comparison on an H200 at
        ~2,316 s when they needed ~1,430.)

        Once a confirmation has run, its own wall time is the estimate: the same A/B on the same host. The screens'
        slowest round is a proxy that one disturbed round inflates (the main job's run 8: a round slowed by a test
        beside it put a confirmation at ~1,657 s; the one that ran took 938 s, and the strongest candidate was
        left unconfirmed)."""
        if self._confirm_seconds:
            return self._confirm_seconds
        bench = self.spec.benchmark
        start = min(self.round_basis[0], self._eval_seconds)
        return start + (self._eval_seconds - start) * bench.strong_repeats / bench.repeats

    def _confirm(self, job: EvalJob, screen: EvalOutcome) -> Confirmation:
        """The candidate that passed the screen, measured again in a fresh, independent A/B: new servers,
        new benchmark seeds, its own (B-first) interleaving, `strong_repeats` pairs, and the strict rule.
        Its figures, not the screen's, are the evidence. It is skipped (the candidate stays uncommitted)
        when the wall budget cannot hold it and the final comparison after it."""
        i = job.iteration
        need = 2 * self._strong_seconds
        left = self.gate.left("wall_seconds") - (time.monotonic() - self.round_started)
        if left < need:
            return Confirmation(None, f"not confirmed: {left:.0f} s of the wall budget left, a confirmation "
                                      f"and the final comparison need ~{need:.0f} s; left uncommitted")
        self.on_event("phase", {"phase": "confirm: a fresh, independent A/B of the best candidate"})
        bench = job.bench.model_copy(update={"seed": job.bench.seed + CONFIRM_SEED_OFFSET,
                                             "repeats": job.bench.strong_repeats})
        assert screen.result is not None and screen.result.overall is not None
        self.writer.append(records.ITERATION_CONFIRM, iteration=i, payload={
            "screen_speedup": str(screen.result.overall), "seed": bench.seed, "order": "B first",
            "repeats": bench.repeats,
            "screen_cells": {label: str(ci) for label, ci in screen.result.headline().items()}})
        try:
            ports = self._gate_ports(job)
        except ActionDenied as exc:
            return Confirmation(None, f"not confirmed: its servers were denied ({exc}); left uncommitted")
        again = replace(job, purpose="confirm", bench=bench, ports=ports, work_dir=job.work_dir / "confirm")
        t0 = time.monotonic()
        done = self._evaluate([again])[0]
        if done.error is not None or done.result is None:
            error = done.error or RuntimeError("evaluation returned nothing")
            return Confirmation(None, f"not confirmed: the confirmation failed ({type(error).__name__}: "
                                      f"{str(error)[:1000]}); left uncommitted")
        self._confirm_seconds = time.monotonic() - t0
        return Confirmation(done, "")

    def _judge(self, i: int, proposal: Proposal, diff: str, evaluation: EvalOutcome, verdict: Verdict | None, *,
               best: int | None, confirmation: Confirmation | None = None) -> IterationOutcome:
        """`verdict` is None when parity broke (or the benchmark was skipped for it). The best candidate
        is committed only when its confirmation passes too; then the confirmation is its evidence."""
        result, placement = evaluation.result, evaluation.placement
        assert result is not None and result.parity is not None
        self.writer.append(records.ITERATION_PARITY, iteration=i, payload=result.parity.to_json())
        if verdict is None:
            return self._finish(i, "parity-broken", result.parity.summary(), proposal=proposal, result=result,
                                placement=placement)
        commit = None
        reason = verdict.reason
        screen, screen_placement = None, None
        if verdict.accept and i == best and confirmation is not None:
            screen, screen_placement = result, placement
            if confirmation.outcome is None:
                return self._finish(i, "rejected", f"{confirmation.reason} (screen: {verdict.reason})",
                                    proposal=proposal, result=result, placement=placement)
            result, placement = confirmation.outcome.result, confirmation.outcome.placement
            assert result is not None and result.parity is not None
            self.writer.append(records.ITERATION_PARITY, iteration=i, payload=result.parity.to_json())
            if not result.parity.ok or result.overall is None:
                return self._finish(i, "parity-broken", f"confirmation: {result.parity.summary()}",
                                    proposal=proposal, result=result, placement=placement, screen=screen,
                                    screen_placement=screen_placement)
            verdict = decide(result.overall, result.headline(), self.spec.stats, images=result.images,
                             physics=self._physics(result.b))
            reason = f"confirmed: {verdict.reason}" if verdict.accept else \
                f"not confirmed: {verdict.reason} (screen: {screen.overall})"
        if verdict.quarantine:
            outcome: Outcome = "quarantined"
        elif verdict.accept and i == best:
            outcome = "accepted"
            commit = self._commit(i, proposal, diff, result)
        elif verdict.accept:
            outcome = "rejected"
            reason = (f"superseded: {verdict.reason}, but iteration {best} of the same round had the higher lower "
                      f"bound and was committed; this patch was measured against the previous incumbent")
        else:
            outcome = "rejected"
        return self._finish(i, outcome, reason, proposal=proposal, result=result, commit=commit,
                            placement=placement, screen=screen,
                            screen_placement=screen_placement)

    def _commit(self, i: int, proposal: Proposal, diff: str, result: ABResult) -> str:
        assert result.overall is not None and result.parity is not None
        self.workspace.apply_patch(diff)
        certificate = certificate_line(self.certificate(result.parity, result.b))
        commit = commit_change(self.workspace, self.writer, campaign_id=self.campaign_id, iteration=i,
                               proposal=proposal, title=proposal.hypothesis.splitlines()[0][:72],
                               speedup=result.overall, evidence=[f"Ratchet-Parity: {result.parity.candidate_digest}",
                                                                 f"Ratchet-Parity-Certificate: {certificate}"],
                               per=[f"Ratchet-Cell: {label} {ci}" for label, ci in result.headline().items()])
        self.incumbent_ref = commit
        self.incumbent_rows = self._rows(result.b)
        self.resolve_defaults()
        return commit

    def _finish(self, i: int, outcome: Outcome, reason: str, *, proposal: Proposal | None,
                result: ABResult | None = None, commit: str | None = None,
                placement: dict[str, Any] | None = None, screen: ABResult | None = None,
                screen_placement: dict[str, Any] | None = None) -> IterationOutcome:
        """Record an iteration's outcome. With a confirmation, `result` is the confirmation (the evidence)
        and `screen` the A/B that selected the candidate (kept beside it, never its evidence)."""
        payload: dict[str, Any] = {}
        if placement:
            payload["placement"] = placement   # which node, host and GPU measured both sides of this A/B
        if result is not None and result.overall is not None:
            head_a = [r for r in result.a.runs]
            payload.update(speedup=result.overall.ratio, ci_low=result.overall.low, ci_high=result.overall.high,
                           speedup_text=str(result.overall),
                           cells={label: {m: vars(ci) for m, ci in per.items()} for label, per in result.cells.items()},
                           throughput_tok_s=_mean_total(result.b.runs), incumbent_tok_s=_mean_total(head_a),
                           cells_rows=self._rows(result.b),
                           incumbent_rows=self._rows(result.a),   # A, same A/B
                           evidence={"A": result.a.evidence, "B": result.b.evidence})
        if result is not None and result.parity is not None:
            payload["certificate"] = self.certificate(result.parity, result.b)
        if screen is not None and screen.overall is not None:
            payload["screen"] = {"speedup_text": str(screen.overall), "speedup": screen.overall.ratio,
                                 "ci_low": screen.overall.low, "ci_high": screen.overall.high,
                                 "cells": {label: str(ci) for label, ci in screen.headline().items()},
                                 "placement": dict(screen_placement or {})}
        record_outcome(self.writer, self.history, self.on_event, i, outcome, reason, proposal, commit=commit,
                       parity_ok=bool(result and result.parity and result.parity.ok),
                       tree=self.workspace.tree_hash(commit) if commit else None,
                       commit_object=self.workspace.commit_object(commit) if commit else None, figures=payload)
        return IterationOutcome(iteration=i, outcome=outcome, reason=reason, result=result, commit=commit,
                                placement=dict(placement or {}))


# The roofline figures a parity certificate carries per cell: matmul and bandwidth utilisation, and the share of
# the cell's physical floor its measurement reached (harness/physics.py).
CERTIFIED_FRACTIONS = ("mfu", "mbu", "roofline")


def _fmt_args(args: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(args.items()))


def allowed_write_globs(policy: Policy) -> tuple[str, ...]:
    """What the loaded policy lets a patch write, for the prompt (the gate still decides every write: a deny
    rule inside an allowed glob, e.g. startup hooks, wins there)."""
    return tuple(glob.lstrip("/") for rule in policy.paths if rule.effect == "allow" and "write" in rule.ops
                 for glob in rule.globs)


def _mean_total(runs: list[Any]) -> float | None:
    values = [r.result.total_token_throughput for r in runs]
    return sum(values) / len(values) if values else None
