"""The campaign loop: baseline, then measure → hypothesize → optimize → verify until a budget ends.

Only a candidate with exact token parity on the held prompts and a bootstrap lower bound of the
speedup above the spec's threshold (no cell regressing past its guard) moves the incumbent forward;
every step is written to the audit log before it happens, and the log alone is enough to resume.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.base import CampaignState, GiveUp, HistoryEntry, Outcome, Proposal, Proposer
from agent.errors import ActionDenied, BudgetExhausted
from agent.gatekeeper import Gatekeeper
from agent.spec import CampaignSpec
from agent.tools import GatedTools, to_unified_diff
from audit import AuditError, AuditWriter
from harness.engine_args import engine_argv
from harness.errors import HarnessError
from harness.measure import ABResult, Build, ab_compare
from harness.parity import Generation
from harness.server import port_is_free
from harness.stats import decide
from sandbox.base import Backend
from sandbox.errors import PatchRejected, SandboxError
from sandbox.workspace import Workspace

__all__ = ["Campaign", "IterationOutcome", "gate_server", "pick_port", "SERVER_PORTS"]

Event = Callable[[str, dict[str, Any]], None]
# The ports the default policy lets servers listen on; each start takes a free one.
SERVER_PORTS = tuple(range(8000, 8016))


def pick_port(exclude: Iterable[int] = ()) -> int:
    """A free port from SERVER_PORTS; when none is free, the first (serve() then names the culprit)."""
    taken = set(exclude)
    return next((p for p in SERVER_PORTS if p not in taken and port_is_free(p)), SERVER_PORTS[0])


def gate_server(gate: Gatekeeper, spec: CampaignSpec, engine_args: dict[str, object], iteration: int,
                *, exclude: tuple[int, ...] = ()) -> int:
    """Each server start is an action: pick a free port, let the policy see the command line a user would
    type, and return the port."""
    port = pick_port(exclude)
    argv = ["vllm", "serve", str(spec.server.model), "--host", "127.0.0.1", "--port", str(port),
            *engine_argv(engine_args)]
    gate.require({"kind": "start_server", "argv": argv, "env": dict(spec.server.env), "host": "127.0.0.1",
                  "port": port}, iteration=iteration)
    return port


@dataclass(frozen=True)
class IterationOutcome:
    iteration: int
    outcome: Outcome
    reason: str
    result: ABResult | None = None
    commit: str | None = None


@dataclass
class Campaign:
    spec: CampaignSpec
    spec_path: Path
    campaign_id: str
    log_dir: Path
    writer: AuditWriter
    gate: Gatekeeper
    workspace: Workspace
    backend: Backend
    proposer: Proposer
    reference: list[Generation]
    baseline_rows: list[dict[str, Any]]
    incumbent_ref: str
    incumbent_rows: list[dict[str, Any]]
    history: list[HistoryEntry] = field(default_factory=list)
    profile: str | None = None             # the baseline's top ops, rendered for the proposer
    next_iteration: int = 1
    started: float = field(default_factory=time.monotonic)
    on_event: Event = lambda kind, data: None

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> str:
        """Iterate until a budget ends; return why the campaign stopped."""
        budget = self.spec.budget
        last_duration = 0.0
        while True:
            if self.next_iteration > budget.max_iterations:
                return f"iteration budget of {budget.max_iterations} reached"
            left = self.gate.left("wall_seconds")
            if left < last_duration:   # never start an iteration that would overrun the wall budget
                return f"wall-time budget: {left:.0f} s left, an iteration takes ~{last_duration:.0f} s"
            t0 = time.monotonic()
            outcome = self.iteration(self.next_iteration)
            last_duration = time.monotonic() - t0
            self.writer.checkpoint()
            self.next_iteration += 1
            self.gate.spend("wall_seconds", last_duration, iteration=outcome.iteration)
            if self._proposer_done(outcome):
                return f"proposer {outcome.reason}"

    def _proposer_done(self, outcome: IterationOutcome) -> bool:
        """A proposer that says its space is exhausted, or gives up three times in a row, is done."""
        if outcome.outcome != "invalid" or not outcome.reason.startswith("gave up"):
            return False
        return "exhausted" in outcome.reason or all(h.outcome == "invalid" for h in self.history[-3:]) \
            and len(self.history) >= 3

    def iteration(self, i: int) -> IterationOutcome:
        self.on_event("iteration", {"iteration": i})
        self._current: Proposal | None = None
        try:
            proposal = self._propose(i)
            if isinstance(proposal, GiveUp):
                return self._finish(i, "invalid", f"gave up: {proposal.reason}", proposal=None)
            return self._verify(i, proposal)
        except (BudgetExhausted, AuditError):
            raise    # a budget end or a log that cannot be written stops the campaign
        except ActionDenied as exc:
            return self._finish(i, "denied", str(exc), proposal=self._current)
        except PatchRejected as exc:
            return self._finish(i, "invalid", f"patch rejected: {exc}", proposal=self._current)
        except (HarnessError, SandboxError) as exc:
            return self._finish(i, "failed", f"{type(exc).__name__}: {exc}", proposal=self._current)
        except Exception as exc:  # the loop boundary: record and move on, never crash the campaign
            self.writer.append("error", payload={"type": type(exc).__name__, "message": str(exc)[:4000]},
                               iteration=i)
            return self._finish(i, "failed", f"{type(exc).__name__}: {exc}", proposal=self._current)

    # -- steps ------------------------------------------------------------------------------------
    def _state(self, i: int) -> CampaignState:
        return CampaignState(iteration=i, incumbent_ref=self.incumbent_ref,
                             serving_config=self.workspace.serving_config(),
                             incumbent_metrics=tuple(self.incumbent_rows), baseline_metrics=tuple(self.baseline_rows),
                             history=tuple(self.history), profile=self.profile,
                             baseline_serving_config=dict(self.spec.server.engine_args),
                             budget_left={r: self.gate.left(r) for r in ("llm_tokens", "llm_usd", "wall_seconds")},
                             allowed_paths=("vllm/model_executor/models/gemma4*.py", "vllm/model_executor/layers/**",
                                            "vllm/v1/attention/**", "serving.yaml"))

    def _propose(self, i: int) -> Proposal | GiveUp:
        self.on_event("phase", {"phase": "propose"})
        tools = GatedTools(gate=self.gate, root=self.workspace.root, iteration=i)
        result = self.proposer.propose(self._state(i), tools, rng=random.Random(f"{self.campaign_id}:{i}"))
        if isinstance(result, Proposal):
            self._current = result
            self.writer.append("iteration.hypothesis", iteration=i, payload={
                "hypothesis": result.hypothesis, "predicted_speedup": result.predicted_speedup,
                "target_cells": list(result.target_cells), "source": result.source, "proposer": self.proposer.name,
                "patch_format": result.patch_format})
            self.on_event("hypothesis", {"text": result.hypothesis})
        return result

    def _verify(self, i: int, proposal: Proposal) -> IterationOutcome:
        ws = self.workspace
        diff = to_unified_diff(ws.root, proposal.patch, proposal.patch_format)
        self.gate.require({"kind": "patch", "diff": diff}, iteration=i)      # the loop gates what it applies
        work = self.log_dir / "runs" / f"it{i:03d}"
        tree_b = ws.checkout_copy(self.incumbent_ref, work / "tree-B")
        tree_a = ws.checkout_copy(self.incumbent_ref, work / "tree-A")
        try:
            canonical = Workspace.open(tree_b, ws.package).apply_patch(diff)
            self.writer.append("iteration.patch", iteration=i,
                               payload={"diff": canonical, "base": self.incumbent_ref})
            a = Build(tag="A", tree=tree_a, engine_args=ws.serving_config(), ref=self.incumbent_ref)
            b = Build(tag="B", tree=tree_b, engine_args=Workspace.open(tree_b).serving_config(), ref="candidate")
            ports = self._gate_servers(i, (a, b))
            self.on_event("phase", {"phase": "verify: parity, then interleaved A/B"})
            result = ab_compare(self.backend, a, b, server=self.spec.server, bench=self.spec.benchmark,
                                stats_cfg=self.spec.stats, parity=self.spec.parity, work_dir=work,
                                cache_dir=self.log_dir / "cache", reference=self.reference,
                                stop_on_parity_failure=True, ports=ports,
                                progress=lambda msg: self.on_event("progress", {"message": msg}),
                                on_run=lambda run: self.on_event("run", {"cell": run.job.cell.label}))
        finally:
            for tree in (tree_a, tree_b):
                ws.remove_copy(tree)
        return self._judge(i, proposal, canonical, result)

    def _gate_servers(self, i: int, builds: tuple[Build, ...]) -> dict[str, int]:
        ports: dict[str, int] = {}
        for build in builds:
            ports[build.tag] = gate_server(self.gate, self.spec, build.engine_args, i, exclude=tuple(ports.values()))
        return ports

    def _judge(self, i: int, proposal: Proposal, diff: str, result: ABResult) -> IterationOutcome:
        assert result.parity is not None
        self.writer.append("iteration.parity", iteration=i, payload=result.parity.to_json())
        if not result.parity.ok or result.overall is None:
            return self._finish(i, "parity-broken", result.parity.summary(), proposal=proposal, result=result)
        verdict = decide(result.overall, result.headline(), self.spec.stats)
        commit = None
        if verdict.quarantine:
            outcome: Outcome = "quarantined"
        elif verdict.accept:
            outcome = "accepted"
            commit = self._commit(i, proposal, diff, result)
        else:
            outcome = "rejected"
        return self._finish(i, outcome, verdict.reason, proposal=proposal, result=result, commit=commit)

    def _commit(self, i: int, proposal: Proposal, diff: str, result: ABResult) -> str:
        assert result.overall is not None and result.parity is not None
        title = proposal.hypothesis.splitlines()[0][:72]
        trailers = [f"Ratchet-Campaign: {self.campaign_id}", f"Ratchet-Iteration: {i}",
                    f"Ratchet-Speedup: {result.overall}", f"Ratchet-Parity: {result.parity.candidate_digest}",
                    f"Ratchet-Predicted: {proposal.predicted_speedup}",
                    f"Ratchet-Audit-Seq: {self.writer.next_seq}"]
        trailers += [f"Ratchet-Cell: {label} {ci}" for label, ci in result.headline().items()]
        self.workspace.apply_patch(diff)
        commit = self.workspace.commit(f"ratchet: {title}\n\n{proposal.hypothesis}\n\n" + "\n".join(trailers))
        self.incumbent_ref = commit
        self.incumbent_rows = result.b.table(self.spec.benchmark.cells())
        return commit

    def _finish(self, i: int, outcome: Outcome, reason: str, *, proposal: Proposal | None,
                result: ABResult | None = None, commit: str | None = None) -> IterationOutcome:
        payload: dict[str, Any] = {"outcome": outcome, "accepted": outcome == "accepted", "reason": reason[:4000],
                                   "parity_ok": bool(result and result.parity and result.parity.ok),
                                   "commit": commit, "source": proposal.source if proposal else ""}
        if commit:
            payload["tree"] = self.workspace.tree_hash(commit)   # replay checks it rebuilds this exact tree
        if proposal is None:
            payload["hypothesis"] = ""
        if result is not None and result.overall is not None:
            head_a = [r for r in result.a.runs]
            payload.update(speedup=result.overall.ratio, ci_low=result.overall.low, ci_high=result.overall.high,
                           speedup_text=str(result.overall),
                           cells={label: {m: vars(ci) for m, ci in per.items()} for label, per in result.cells.items()},
                           throughput_tok_s=_mean_total(result.b.runs), incumbent_tok_s=_mean_total(head_a),
                           cells_rows=result.b.table(self.spec.benchmark.cells()),
                           evidence={"A": result.a.evidence, "B": result.b.evidence})
        self.writer.append("iteration.result", iteration=i, payload=payload)
        entry = HistoryEntry(iteration=i, hypothesis=proposal.hypothesis if proposal else "", outcome=outcome,
                             speedup=payload.get("speedup_text"),
                             predicted_speedup=proposal.predicted_speedup if proposal else None,
                             detail=reason[:500], source=proposal.source if proposal else "")
        self.history.append(entry)
        self.on_event("result", {"entry": entry})
        return IterationOutcome(iteration=i, outcome=outcome, reason=reason, result=result, commit=commit)


def _mean_total(runs: list[Any]) -> float | None:
    values = [r.result.total_token_throughput for r in runs]
    return sum(values) / len(values) if values else None
