"""The campaign engine (agent/engine.py) with a target of a few lines: what the engine alone decides (the order of a
round's steps, the stop rules, the budgets, what a crash mid-round leaves, campaign.end) is checked here without
servers or a kernel runner. The serving and kernel targets run through the same engine in
tests/agent/test_fake_campaign.py, tests/agent/test_rounds.py and tests/kernel/."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.base import CampaignState, GiveUp, HistoryEntry, Outcome, Proposal
from agent.engine import Engine, IterationOutcome, Pending
from agent.errors import BudgetExhausted
from agent.gatekeeper import Gatekeeper
from agent.iteration import INTERRUPTED, record_outcome
from agent.tools import GatedTools
from audit import AuditError, AuditWriter, verify
from audit.reader import payload_of, read_records
from policies import load_policy
from sandbox.workspace import Workspace


@dataclass
class Scripted:
    """Proposes "x<speedup>" candidates from a script; a str entry gives up with that reason."""

    script: list[float | str]
    name: str = "scripted"
    reads_profile: bool = False

    def propose(self, state: CampaignState, tools: Any, *, rng: random.Random) -> Proposal | GiveUp:
        step = self.script[(state.iteration - 1) % len(self.script)]
        if isinstance(step, str):
            return GiveUp(step)
        return Proposal(hypothesis=f"x{step}", patch=f"x{step}", source=f"scripted:{state.iteration}")


@dataclass(kw_only=True)
class Toy(Engine[str]):
    """A target whose candidate's 'measurement' is the speedup its patch names; accepted above 1.0."""

    calls: list[str] = field(default_factory=list)
    width: int = 1
    seconds: float = 0.0                   # what a round is expected to take
    reserve: float = 0.0
    fail_prepare: dict[int, BaseException] = field(default_factory=dict)
    removed: list[int] = field(default_factory=list)

    @property
    def max_iterations(self) -> int:
        return 6

    def state(self, i: int, pending: Sequence[HistoryEntry]) -> CampaignState:
        self.calls.append(f"state {i} pending={[p.iteration for p in pending]}")
        return CampaignState(iteration=i, incumbent_ref=self.incumbent_ref, serving_config={},
                             incumbent_metrics=(), baseline_metrics=(), history=tuple(self.history) + tuple(pending))

    def tools(self, i: int) -> GatedTools:
        return GatedTools(gate=self.gate, root=self.workspace.root, iteration=i)

    def prepare(self, i: int, proposal: Proposal, earlier: Sequence[Pending]) -> tuple[Any, str]:
        self.calls.append(f"prepare {i}")
        if i in self.fail_prepare:
            raise self.fail_prepare[i]
        return float(proposal.patch[1:]), proposal.patch

    def screen(self, items: Sequence[Pending]) -> None:
        self.calls.append(f"screen {[item.iteration for item in items]}")

    def evaluate(self, items: Sequence[Pending]) -> dict[int, Any]:
        self.calls.append(f"evaluate {[item.iteration for item in items]}")
        return {item.iteration: item.job for item in items}

    def settle(self, items: Sequence[Pending], evaluations: dict[int, Any]) -> list[IterationOutcome]:
        self.calls.append(f"settle {[item.iteration for item in items]}")
        out = []
        for item in items:
            if item.early is not None:
                out.append(self.finish(item.iteration, *item.early, item.proposal))
                continue
            speedup = evaluations[item.iteration]
            outcome: Outcome = "accepted" if speedup > 1.0 else "rejected"
            record_outcome(self.writer, self.history, self.on_event, item.iteration, outcome, f"{speedup}x",
                           item.proposal, commit=None, parity_ok=True, figures={"speedup": speedup})
            out.append(IterationOutcome(item.iteration, outcome, f"{speedup}x"))
        return out

    def cleanup(self, items: Sequence[Pending]) -> None:
        self.removed += [item.iteration for item in items if item.job is not None]

    def finish(self, i: int, outcome: Outcome, reason: str, proposal: Proposal | None) -> IterationOutcome:
        record_outcome(self.writer, self.history, self.on_event, i, outcome, reason, proposal, commit=None,
                       parity_ok=False)
        return IterationOutcome(i, outcome, reason)

    def slots(self) -> tuple[int, str]:
        return self.width, "no slots"

    def round_seconds(self, candidates: int) -> float:
        return self.seconds * candidates

    def reserve_seconds(self) -> float:
        return self.reserve

    def conclude(self, base_commit: str, accepted: list[int]) -> dict[str, Any]:
        self.calls.append(f"conclude {accepted}")
        return {"verdict": {"status": "improved" if accepted else "no-change"}}

    def ended(self, stop: str, branch: str) -> str:
        return stop


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[Any]:
    src = tmp_path / "src" / "vllm"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    ws = Workspace.create(tmp_path / "ws", serving={}, source=src)
    log = tmp_path / "log"
    with AuditWriter.open(log, campaign="toy", anchor_dir=tmp_path / "anchors") as writer:
        gate = Gatekeeper(policy=load_policy(Path("policies/default.yaml")), writer=writer, root=ws.root,
                          limits={"wall_seconds": 100.0})

        def make(script: list[float | str], **kw: Any) -> Toy:
            return Toy(campaign_id="toy", log_dir=log, writer=writer, gate=gate, workspace=ws,
                       proposer=Scripted(script), incumbent_ref=ws.head(), **kw)
        yield make


def _results(camp: Toy) -> list[tuple[int, str]]:
    return [(r["iteration"], payload_of(camp.log_dir, r)["outcome"]) for r in read_records(camp.log_dir)
            if r["kind"] == "iteration.result"]


def test_a_round_runs_its_steps_in_order_and_the_end_carries_the_engines_fields_and_the_targets(toy: Any) -> None:
    camp = toy([1.5, 0.9], width=2)
    stop = camp.run_to_end(base_commit="base", branch="b")
    assert stop == "iteration budget of 6 reached"
    # each round: the proposals one after another (the second sees the first as pending), then the round at once
    assert camp.calls[:6] == ["state 1 pending=[]", "prepare 1", "state 2 pending=[1]", "prepare 2",
                              "screen [1, 2]", "evaluate [1, 2]"]
    assert camp.calls[6] == "settle [1, 2]" and camp.calls[-1] == "conclude [1, 3, 5]"
    assert camp.removed == [1, 2, 3, 4, 5, 6]                      # every prepared job cleaned up
    assert _results(camp) == [(1, "accepted"), (2, "rejected"), (3, "accepted"), (4, "rejected"),
                              (5, "accepted"), (6, "rejected")]
    end = payload_of(camp.log_dir, next(r for r in read_records(camp.log_dir) if r["kind"] == "campaign.end"))
    assert end["accepted"] == [1, 3, 5] and end["iterations"] == 6 and end["verdict"] == {"status": "improved"}
    assert end["stop_reason"] == stop and "wall_seconds" in end["spent"]
    assert verify(camp.log_dir).ok


@pytest.mark.parametrize(("script", "stop", "iterations"), [
    (["out of ideas"], "proposer gave up: out of ideas", 3),                  # three give-ups in a row
    ([1.2, "out of ideas", "out of ideas", 1.1, "out of ideas", "out of ideas", "x"], "iteration budget", 6),
    (["search space exhausted (4 points tried)"], "proposer gave up: search space exhausted", 1),   # at once
])
def test_a_proposer_is_done_when_it_says_so_or_gives_up_three_times_in_a_row(
        toy: Any, script: list[float | str], stop: str, iterations: int) -> None:
    camp = toy(script)
    assert camp.run().startswith(stop)
    assert len(camp.history) == iterations


def test_a_resumed_engine_whose_proposer_was_done_stops_before_proposing(toy: Any) -> None:
    camp = toy(["search space exhausted"])
    camp.run()
    again = toy([1.5], history=list(camp.history), next_iteration=camp.next_iteration)
    assert again.run().startswith("proposer gave up: search space exhausted")
    assert again.calls == []


def test_the_wall_budget_shrinks_a_round_and_then_stops_the_loop_keeping_the_reserve(toy: Any) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    camp = toy([0.9], width=3, seconds=30.0, reserve=20.0, on_event=lambda k, d: events.append((k, d)))
    stop = camp.run()
    # 100 s left, 20 reserved: a round of 2 (60 s) fits, 3 (90 s) does not; the rounds take ~0 s here, so the
    # budget is left whole and every round shrinks to 2 until the iteration budget ends
    assert [c for c in camp.calls if c.startswith("evaluate")] == ["evaluate [1, 2]", "evaluate [3, 4]",
                                                                   "evaluate [5, 6]"]
    assert any("2 candidate(s) this round, not 3" in d.get("message", "") for k, d in events if k == "progress")
    assert stop == "iteration budget of 6 reached"
    tight = toy([0.9], seconds=90.0, reserve=20.0)
    assert tight.run() == ("wall-time budget: 100 s left, a round takes ~90 s and ~20 s stay reserved for the "
                           "final comparison")
    assert tight.calls == []


def test_a_budget_end_while_preparing_evaluates_what_the_round_prepared_then_stops(toy: Any) -> None:
    camp = toy([1.5], width=3, fail_prepare={2: BudgetExhausted("llm_tokens")})
    stop = camp.run_to_end(base_commit="base", branch="b")
    assert stop == "budget exhausted: llm_tokens"
    assert _results(camp) == [(1, "accepted"), (2, "failed")]          # iteration 3 never began
    assert camp.calls[-3:-1] == ["evaluate [1]", "settle [1, 2]"] and camp.removed == [1]


def test_an_unwritable_log_while_preparing_cleans_up_and_stops_the_campaign(toy: Any) -> None:
    camp = toy([1.5], width=2, fail_prepare={2: AuditError("disk full")})
    with pytest.raises(AuditError):
        camp.run()
    assert camp.removed == [1] and not any(c.startswith("evaluate") for c in camp.calls)


def test_an_error_while_preparing_is_that_iterations_outcome_and_the_round_goes_on(toy: Any) -> None:
    camp = toy([1.5], width=2, fail_prepare={1: RuntimeError("boom")})
    camp.round(1, 2)
    assert _results(camp) == [(1, "failed"), (2, "accepted")]
    errors = [payload_of(camp.log_dir, r) for r in read_records(camp.log_dir) if r["kind"] == "error"]
    assert errors and errors[0]["type"] == "RuntimeError"


def test_iterations_a_crash_cut_short_are_closed_once_as_interrupted(toy: Any) -> None:
    camp = toy([1.5])
    camp.close_interrupted([4, 5])
    assert _results(camp) == [(4, "failed"), (5, "failed")]
    assert [h.detail for h in camp.history] == [INTERRUPTED, INTERRUPTED]
