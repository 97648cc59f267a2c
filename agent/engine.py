"""The one campaign engine: every campaign, whatever its target, is rounds of

    propose → gate → prepare → evaluate → judge → commit/reset → record

until a budget ends or the proposer is done, then its conclusion (the final comparison and any later stage) and
`campaign.end`. The engine owns that order, the budgets, the stop rules, the exception ladder and the resume; the
target owns what is measured and how it is judged. Two targets plug in today, as subclasses that fill in the
hooks below:

    serving   agent/serving_campaign.py (Campaign): a vLLM tree and its serving.yaml; servers, the benchmark grid,
              parity, screens and confirmations, candidates of a round evaluated in parallel
    kernel    agent/kernel_campaign.py (KernelCampaign): one kernel file; one runner process checks and times the
              incumbent beside the candidate; the final comparison, then (optionally) the kernel's best served end
              to end (agent/kernel_serving.py)

A new campaign and a resumed one run the same `run_to_end`; `reopen` is the resume's common part (the log's lock,
the dead run's processes reaped, the workspace reset to the incumbent, the gate with what the log says was spent).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from agent import records
from agent.base import CampaignState, GiveUp, HistoryEntry, Outcome, Proposal, Proposer
from agent.errors import BudgetExhausted
from agent.gatekeeper import Gatekeeper
from agent.iteration import INTERRUPTED, classify, propose
from agent.journal import Journal, ended_on_wall_budget, restore_workspace
from agent.measurements import HARNESS, Measurements
from agent.tools import GatedTools
from audit import AuditError, AuditWriter
from policies import load_policy
from sandbox.reap import reap_under
from sandbox.workspace import Workspace

__all__ = ["Engine", "Event", "IterationOutcome", "Pending", "reap_leftovers", "reopen"]

Event = Callable[[str, dict[str, Any]], None]
End = TypeVar("End")   # what a target's campaign returns when it ends (serving: CampaignEnd; kernel: KernelEnd)

# A proposer that gives up this many times in a row is done, whatever it says (one that says its space is
# exhausted is done at once).
GIVE_UPS = 3


@dataclass(frozen=True)
class IterationOutcome:
    iteration: int
    outcome: Outcome
    reason: str
    result: Any = None          # the target's deciding evaluation (serving: an ABResult)
    commit: str | None = None
    placement: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pending:
    """One iteration of a round, between its proposal and its verdict."""

    iteration: int
    proposal: Proposal | None = None
    job: Any = None                              # what the target prepared for evaluation; None once refused
    diff: str = ""                               # the canonical patch, as recorded and as committed
    early: tuple[Outcome, str] | None = None     # decided before evaluation: gave up, denied, bad patch, error

    def pending_entry(self) -> HistoryEntry:
        assert self.proposal is not None
        return HistoryEntry(iteration=self.iteration, hypothesis=self.proposal.hypothesis, outcome="pending",
                            predicted_speedup=self.proposal.predicted_speedup, source=self.proposal.source,
                            detail="proposed in this round; being evaluated in parallel")


@dataclass(kw_only=True)
class Engine(ABC, Generic[End]):
    """A campaign's state that every target shares, the loop, and the hooks a target fills in."""

    campaign_id: str
    log_dir: Path
    writer: AuditWriter
    gate: Gatekeeper
    workspace: Workspace
    proposer: Proposer
    incumbent_ref: str
    history: list[HistoryEntry] = field(default_factory=list)
    next_iteration: int = 1
    on_event: Event = lambda kind, data: None
    measure: Measurements = HARNESS      # every measurement goes through this seam (agent/measurements.py)
    round_started: float = 0.0           # when the round under way began (a confirmation plans its time by it)

    # -- what a target fills in ------------------------------------------------------------------------
    @property
    @abstractmethod
    def max_iterations(self) -> int: ...

    @abstractmethod
    def state(self, i: int, pending: Sequence[HistoryEntry]) -> CampaignState:
        """What the proposer of iteration `i` sees (`pending`: the round's candidates proposed before it)."""

    @abstractmethod
    def tools(self, i: int) -> GatedTools:
        """The proposer's gated tools for iteration `i` (the target's trial runner: try_patch, check_kernel)."""

    @abstractmethod
    def prepare(self, i: int, proposal: Proposal, earlier: Sequence[Pending]) -> tuple[Any, str]:
        """Gate the candidate and build what its evaluation needs (trees, ports), as data; record its patch.
        Returns (job, canonical diff). Raises to decide the iteration early (denied, bad patch, ...)."""

    def screen(self, items: Sequence[Pending]) -> None:
        """After a round is prepared, before anything is measured: refuse candidates known to change nothing."""
        return None   # optional: most targets have nothing to do here

    @abstractmethod
    def evaluate(self, items: Sequence[Pending]) -> dict[int, Any]:
        """Measure the round's prepared jobs; an evaluation's error is its value, not raised."""

    @abstractmethod
    def settle(self, items: Sequence[Pending], evaluations: dict[int, Any]) -> list[IterationOutcome]:
        """Judge and record every item in iteration order; commit what is accepted."""

    @abstractmethod
    def cleanup(self, items: Sequence[Pending]) -> None:
        """Remove what `prepare` built (the workspace keeps only commits)."""

    @abstractmethod
    def finish(self, i: int, outcome: Outcome, reason: str, proposal: Proposal | None) -> IterationOutcome:
        """Record an iteration decided without a measurement."""

    def slots(self) -> tuple[int, str]:
        """How many candidates a round may evaluate, and why none when 0."""
        return 1, ""

    @abstractmethod
    def round_seconds(self, candidates: int) -> float:
        """What a round of `candidates` is expected to take (0 when nothing is known yet)."""

    def reserve_seconds(self) -> float:
        """The wall time kept back from the loop for the conclusion (e.g. the final comparison)."""
        return 0.0

    def after_round(self, seconds: float, outcomes: Sequence[IterationOutcome]) -> None:
        """What the target learns from a round (its time, its evaluations' GPU time)."""
        return None   # optional: most targets have nothing to do here

    def begin(self) -> None:
        """What comes before the loop and is not on record yet (a kernel campaign's baseline and prelude)."""
        return None   # optional: most targets have nothing to do here

    def close(self) -> None:
        """Release what the loop holds (an executor, its threads)."""
        return None   # optional: most targets have nothing to do here

    @abstractmethod
    def conclude(self, base_commit: str, accepted: list[int]) -> dict[str, Any]:
        """After the loop: the final comparison and any later stage; returns campaign.end's fields of the target
        (its verdict)."""

    @abstractmethod
    def ended(self, stop: str, branch: str) -> End:
        """After campaign.end: the target's report and its result object."""

    # -- the engine -------------------------------------------------------------------------------------
    def run_to_end(self, *, base_commit: str, branch: str) -> End:
        """The campaign from wherever its log ends: what comes before the loop (unless on record), the loop, the
        conclusion, and campaign.end."""
        try:
            try:
                self.begin()
                stop = self.run()
            finally:
                self.close()
        except BudgetExhausted as exc:   # the time before the loop can spend the wall budget too
            stop = f"budget exhausted: {exc}"
        accepted = [h.iteration for h in self.history if h.outcome == "accepted"]
        fields = self.conclude(base_commit, accepted)
        # ended_by: a loop that stopped on its wall budget may be continued with a new one (`ratchet resume DIR
        # --wall-seconds S`): a host booked by the hour ends each booking with a verdict, the next goes on
        ended = {"ended_by": "wall_seconds"} if ended_on_wall_budget(stop) else {}
        self.writer.append(records.CAMPAIGN_END, payload={
            "stop_reason": stop, "incumbent": self.incumbent_ref, "iterations": len(self.history),
            "accepted": accepted, "spent": dict(self.gate.spent), **ended, **fields})
        self.writer.checkpoint()
        return self.ended(stop, branch)

    def run(self) -> str:
        """Rounds until a budget ends or the proposer is done; return why the loop stopped. Each stop is read off
        the state (the history, the next iteration, the budget left), so a resumed campaign whose loop had
        already stopped stops again. A round is `slots` iterations: proposed one after another (each proposal
        sees the round's earlier ones as pending), evaluated together, then judged and recorded in order."""
        while True:
            done = self.proposer_done()
            if done:
                return done
            if self.next_iteration > self.max_iterations:
                return f"iteration budget of {self.max_iterations} reached"
            left = self.gate.left("wall_seconds")
            # never start a round that would overrun the wall budget, nor one that would leave no time for the
            # conclusion; a round of several candidates shrinks to fit
            reserve = self.reserve_seconds()
            slots, why = self.slots()
            slots = min(slots, self.max_iterations - self.next_iteration + 1)
            if slots < 1:
                return why
            fit = next((k for k in range(slots, 0, -1) if self.round_seconds(k) <= left - reserve), 0)
            if left <= 0 or fit < 1:
                return (f"wall-time budget: {left:.0f} s left, a round takes ~{self.round_seconds(1):.0f} s"
                        + (f" and ~{reserve:.0f} s stay reserved for the final comparison" if reserve else ""))
            if fit < slots:
                self.on_event("progress", {"message": f"{fit} candidate(s) this round, not {slots}: a round of "
                                                      f"{slots} takes ~{self.round_seconds(slots):.0f} s, "
                                                      f"{left - reserve:.0f} s are left"})
            t0 = time.monotonic()
            outcomes = self.round(self.next_iteration, fit)
            duration = time.monotonic() - t0
            self.writer.checkpoint()
            self.next_iteration = outcomes[-1].iteration + 1
            self.gate.spend("wall_seconds", duration, iteration=outcomes[-1].iteration)
            self.after_round(duration, outcomes)

    def proposer_done(self) -> str:
        """Why the proposer is done ('' while it is not): it said its space is exhausted, or it gave up
        GIVE_UPS times in a row."""
        last = self.history[-GIVE_UPS:]
        if not last or not _gave_up(last[-1]):
            return ""
        if "exhausted" in last[-1].detail or (len(last) == GIVE_UPS and all(_gave_up(h) for h in last)):
            return f"proposer {last[-1].detail}"
        return ""

    def iteration(self, i: int) -> IterationOutcome:
        """One iteration on its own: a round of one."""
        return self.round(i, 1)[0]

    def round(self, first: int, slots: int) -> list[IterationOutcome]:
        self.round_started = time.monotonic()
        items: list[Pending] = []
        stop: BaseException | None = None
        for i in range(first, first + slots):
            self.on_event("iteration", {"iteration": i})
            item = Pending(i)
            items.append(item)
            try:
                self.on_event("phase", {"phase": "propose"})
                got = propose(self.proposer, self.state(i, [p.pending_entry() for p in items if p.job]),
                              self.tools(i), writer=self.writer, campaign_id=self.campaign_id,
                              on_event=self.on_event)
                if isinstance(got, GiveUp):
                    item.early = ("invalid", f"gave up: {got.reason}")
                    break
                item.proposal = got
                item.job, item.diff = self.prepare(i, got, items[:-1])
            except BudgetExhausted as exc:   # evaluate what this round already prepared, then stop
                stop = exc
                if item.proposal is None:    # nothing of this iteration was recorded: it did not happen
                    items.pop()
                else:
                    item.early = ("failed", f"budget exhausted while preparing: {exc}")
                break
            except AuditError:
                self.cleanup(items)
                raise
            except Exception as exc:
                item.early = classify(self.writer, i, exc)
        try:
            self.screen(items)
            if not items and stop is not None:
                raise stop
            evaluations = self.evaluate([item for item in items if item.job is not None])
            outcomes = self.settle(items, evaluations)   # the trees are still there for a confirmation
        finally:
            self.cleanup(items)
        if stop is not None:
            raise stop
        return outcomes

    def close_interrupted(self, iterations: Sequence[int]) -> None:
        """Iterations a crash or a kill cut short (a hypothesis and no result): each recorded once, failed."""
        for i in iterations:
            self.finish(i, "failed", INTERRUPTED, None)
        if iterations:
            self.writer.checkpoint()


def _gave_up(entry: HistoryEntry) -> bool:
    return entry.outcome == "invalid" and entry.detail.startswith("gave up")


def reap_leftovers(log_dir: Path) -> tuple[list[int], int]:
    """Kill servers and runners a crashed campaign left behind (they run in their own sessions, so the crash did
    not take them down): local processes by their working directory (sandbox/reap.py), containers by the log
    folder on their label. Returns (pids, containers removed)."""
    from sandbox.docker_backend import reap_containers_under

    return reap_under(log_dir / "runs"), reap_containers_under(log_dir / "runs")


@dataclass(frozen=True)
class Reopened:
    writer: AuditWriter
    workspace: Workspace
    gate: Gatekeeper
    next_iteration: int


@contextmanager
def reopen(log_dir: Path, journal: Journal, *, policy_path: Path, package: str, limits: dict[str, float],
           header: dict[str, str] | None = None, host: Mapping[str, Any] | None = None,
           workspace: Callable[[], tuple[Workspace, dict[str, Any]]] | None = None,
           resume: Mapping[str, Any] | None = None) -> Iterator[Reopened]:
    """The common part of every resume, once the log has verified (agent/journal.py verify_for_resume) and this host
    has been checked (agent/fresh_host.py): take the log's lock (no campaign runs on it), record the new host
    (`host`: campaign.host, before anything acts on it), reap what the killed run left running, open the workspace
    (`workspace`: opened or rebuilt, agent/rebuild.py) and reset it to the incumbent (uncommitted work and a commit
    whose result was never recorded are dropped), rebuild the gate with the spending on record, and record
    campaign.resume (with `resume`'s fields). The writer closes when the block ends."""
    policy = load_policy(policy_path)   # a policy that no longer loads fails before the log is touched
    with AuditWriter.open(log_dir, campaign=journal.campaign, header=header) as writer:
        if host is not None:
            writer.append(records.CAMPAIGN_HOST, payload=dict(host))
        pids, containers = reap_leftovers(log_dir)   # under the log's lock: never a live campaign's servers
        ws, placed = workspace() if workspace else (Workspace.open(journal.workspace, package), {})
        discarded = restore_workspace(ws, journal, log_dir / "runs")
        gate = Gatekeeper(policy=policy, writer=writer, root=ws.root, limits=limits,
                          spent=dict(journal.spent))
        next_iteration = max(journal.last_iteration, journal.open_iteration or 0) + 1
        writer.append(records.CAMPAIGN_RESUME, payload={
            "incumbent": journal.incumbent_ref, "reaped_pids": pids, "reaped_containers": containers,
            "discarded": discarded, "next_iteration": next_iteration, "interrupted": journal.open_iterations,
            **({"workspace": placed} if placed else {}), **(resume or {})})
        yield Reopened(writer=writer, workspace=ws, gate=gate, next_iteration=next_iteration)
