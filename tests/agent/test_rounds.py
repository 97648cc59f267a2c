"""The loop's rounds without vLLM: a fake executor stands in for the evaluations, so what the loop does
with parallel results (record in order, commit at most one, keep going after a lost worker) is checked
exactly and in a second."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.campaign import _limits
from agent.errors import ActionDenied
from agent.executor import EvalJob, EvalOutcome, WorkerLost
from agent.gatekeeper import Gatekeeper
from agent.measurements import HARNESS
from agent.proposers.search import SearchProposer
from agent.serving_campaign import Campaign
from agent.spec import load_spec
from audit import AuditWriter, verify
from audit.reader import payload_of, read_records
from harness.measure import ABResult, GridResult
from harness.parity import ParityReport
from harness.stats import SpeedupCI
from policies import load_policy
from sandbox.workspace import Workspace

SPEC = """
schema_version: 1
name: rounds
server: {model: m, engine_args: {max_num_seqs: 1}}
benchmark: {input_lens: [8], output_lens: [4], prefill: false}
parity: {prompts: p.jsonl}
proposer: {kind: search, search: {strategy: grid, space: {max_num_seqs: [1, 4, 8, 16, 32]}}}
profile_baseline: false
budget: {max_iterations: 4}
"""


class FakeExecutor:
    """Two slots; the 'measured' speedup of a candidate is looked up by its max_num_seqs."""

    name = "fake"
    slots = 2
    gpus_per_eval = 0.0

    def __init__(self, speedups: dict[int, SpeedupCI | BaseException | None],
                 confirmed: dict[int, SpeedupCI | BaseException | None] | None = None) -> None:
        self.speedups = speedups
        self.confirmed = confirmed or {}      # what a confirmation measures (default: the screen's figure)
        self.rounds: list[list[EvalJob]] = []
        self.confirmations: list[EvalJob] = []

    def run(self, jobs: list[EvalJob], *, on_retry: Callable[[EvalJob, BaseException], None],
            progress: Callable[[str], None]) -> list[EvalOutcome]:
        if all(job.purpose == "confirm" for job in jobs):
            self.confirmations += jobs
        else:
            self.rounds.append(jobs)
        outcomes = []
        for job in reversed(jobs):          # finish out of order, as parallel evaluations do
            seqs = int(job.b.engine_args["max_num_seqs"])  # type: ignore[call-overload]
            ci = self.confirmed.get(seqs, self.speedups[seqs]) if job.purpose == "confirm" else self.speedups[seqs]
            if isinstance(ci, BaseException):       # the evaluation itself raised
                outcomes.append(EvalOutcome(job.iteration, error=ci))
                continue
            if ci is None:
                on_retry(job, RuntimeError("worker died"))
                outcomes.append(EvalOutcome(job.iteration, error=WorkerLost("retries used up")))
                continue
            grid = GridResult(build=job.a, startup_s=1.0, evidence={})
            result = ABResult(a=grid, b=GridResult(build=job.b, startup_s=1.0, evidence={}),
                              parity=ParityReport((), "same", "same"), cells={"in8/out4": {"headline": ci}},
                              overall=ci)
            outcomes.append(EvalOutcome(job.iteration, result=result, placement={"node_id": f"n{job.iteration}"}))
        return outcomes

    def close(self) -> None:
        pass


@pytest.fixture
def campaign(tmp_path: Path) -> Iterator[Callable[[FakeExecutor], Campaign]]:
    (tmp_path / "spec.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "spec.yaml")
    src = tmp_path / "src" / "vllm"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    ws = Workspace.create(tmp_path / "ws", serving=dict(spec.server.engine_args), source=src)
    with AuditWriter.open(tmp_path / "log", campaign="rounds", anchor_dir=tmp_path / "anchors") as writer:
        gate = Gatekeeper(policy=load_policy(spec.policy), writer=writer, root=ws.root, limits=_limits(spec))

        def make(executor: FakeExecutor) -> Campaign:
            return Campaign(spec=spec, spec_path=tmp_path / "spec.yaml", campaign_id="rounds", log_dir=tmp_path / "log",
                            writer=writer, gate=gate, workspace=ws, backend=None,  # type: ignore[arg-type]
                            proposer=SearchProposer(spec.proposer.search), reference=[], baseline_rows=[],
                            incumbent_ref=ws.head(), incumbent_rows=[], executor=executor)  # type: ignore[arg-type]
        yield make


def test_a_round_commits_only_its_best_candidate_and_records_in_order(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    executor = FakeExecutor({4: SpeedupCI(1.5, 1.3, 1.7, 3), 8: SpeedupCI(2.0, 1.8, 2.2, 3),
                             16: SpeedupCI(1.01, 0.99, 1.03, 3), 32: None})
    camp = campaign(executor)
    stop = camp.run()
    assert stop == "iteration budget of 4 reached"
    # Round 1 proposed two distinct points against the same incumbent; round 2 two more from the winner.
    assert [[j.b.engine_args["max_num_seqs"] for j in r] for r in executor.rounds] == [[4, 8], [16, 32]]
    # only the round's best was confirmed, on fresh ports, with its own seeds and order
    (again,) = executor.confirmations
    assert again.iteration == 2 and again.bench.seed != executor.rounds[0][1].bench.seed
    assert again.work_dir == executor.rounds[0][1].work_dir / "confirm"
    for jobs in executor.rounds:                                       # a round's servers never share a port
        assert len({port for job in jobs for port in job.ports.values()}) == 2 * len(jobs)
    records = read_records(tmp_path / "log")
    results = [payload_of(tmp_path / "log", r) | {"it": r["iteration"]} for r in records
               if r["kind"] == "iteration.result"]
    assert [r["it"] for r in results] == [1, 2, 3, 4]                  # recorded in order, though finished reversed
    assert [r["outcome"] for r in results] == ["rejected", "accepted", "rejected", "failed"]
    assert str(results[0]["reason"]).startswith("superseded") and "iteration 2" in str(results[0]["reason"])
    assert "WorkerLost" in str(results[3]["reason"])
    assert [payload_of(tmp_path / "log", r)["attempt"] for r in records if r["kind"] == "iteration.retry"] == [1]
    assert results[1]["placement"] == {"node_id": "n2"}
    # both sides' medians of the same A/B are on record (the incumbent's are not the baseline grid's)
    assert [row["cell"] for row in results[1]["incumbent_rows"]] == [row["cell"] for row in results[1]["cells_rows"]]
    assert camp.workspace.serving_config()["max_num_seqs"] == 8       # only the best of round 1 was committed
    # compile caches are keyed by content: round 2's incumbent (A) is round 1's winner (B) to the byte, so it
    # finds the winner's compiled graphs; different candidates never share a cache
    (it1, it2), (it3, it4) = executor.rounds
    assert it1.a.cache_key == it2.a.cache_key == camp.workspace.tree_hash("HEAD~1")     # the baseline's content
    assert it3.a.cache_key == it4.a.cache_key == it2.b.cache_key == camp.workspace.tree_hash("HEAD")
    assert len({it1.b.cache_key, it2.b.cache_key, it3.b.cache_key, it4.b.cache_key, it1.a.cache_key}) == 5
    assert len(list(camp.workspace.repo.iter_commits())) == 2
    assert all(not j.b.tree.exists() for r in executor.rounds for j in r)   # trees cleaned up
    camp.writer.checkpoint()
    assert verify(tmp_path / "log").ok


class DeniedAt(SearchProposer):
    """A proposer whose look at the workspace is denied in one iteration (as a policy deny would)."""

    def __init__(self, config: object, deny_at: int) -> None:
        super().__init__(config)  # type: ignore[arg-type]
        self.deny_at = deny_at

    def propose(self, state, tools, *, rng):  # type: ignore[no-untyped-def]
        if state.iteration == self.deny_at:
            raise ActionDenied("deny-test", "reading serving.yaml denied in this test")
        return super().propose(state, tools, rng=rng)


def test_an_error_while_proposing_is_that_iterations_recorded_outcome(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    executor = FakeExecutor({4: SpeedupCI(1.0, 0.98, 1.02, 3), 8: SpeedupCI(1.0, 0.98, 1.02, 3),
                             16: SpeedupCI(1.0, 0.98, 1.02, 3)})
    camp = campaign(executor)
    camp.proposer = DeniedAt(camp.spec.proposer.search, deny_at=1)
    camp.run()
    results = {r["iteration"]: payload_of(tmp_path / "log", r) for r in read_records(tmp_path / "log")
               if r["kind"] == "iteration.result"}
    assert sorted(results) == [1, 2, 3, 4]
    assert results[1]["outcome"] == "denied" and "deny-test" in str(results[1]["reason"])
    assert [[j.iteration for j in r] for r in executor.rounds] == [[2], [3, 4]]


def test_a_candidate_may_not_switch_the_load_format(campaign: Callable[[FakeExecutor], Campaign],
                                                    tmp_path: Path) -> None:
    """Dummy weights are the spec's choice (speed only, parity elsewhere): flipping them is not an optimisation."""
    executor = FakeExecutor({})
    camp = campaign(executor)
    camp.proposer = SearchProposer(camp.spec.proposer.search.model_copy(
        update={"space": {"load_format": ["dummy"]}}))
    camp.spec = camp.spec.model_copy(update={"budget": camp.spec.budget.model_copy(update={"max_iterations": 1})})
    camp.run()
    results = [payload_of(tmp_path / "log", r) for r in read_records(tmp_path / "log")
               if r["kind"] == "iteration.result"]
    assert [r["outcome"] for r in results] == ["invalid"]
    assert "load_format is fixed by the spec" in str(results[0]["reason"])
    assert executor.rounds == []                                   # nothing was measured
    assert len(list(camp.workspace.repo.iter_commits())) == 1


def _results_of(log: Path) -> dict[int, dict[str, object]]:
    return {int(r["iteration"]): payload_of(log, r) for r in read_records(log) if r["kind"] == "iteration.result"}


def test_a_candidate_whose_confirmation_fails_the_bar_is_not_committed(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    """Winner's curse: the screen's 1.5x was luck; the fresh A/B measures 1.01x [0.97, 1.05]."""
    executor = FakeExecutor({4: SpeedupCI(1.5, 1.3, 1.7, 4), 8: SpeedupCI(1.0, 0.97, 1.03, 4),
                             16: SpeedupCI(1.0, 0.97, 1.03, 4), 32: SpeedupCI(1.0, 0.97, 1.03, 4)},
                            confirmed={4: SpeedupCI(1.01, 0.97, 1.05, 4)})
    camp = campaign(executor)
    camp.run()
    results = _results_of(tmp_path / "log")
    assert results[1]["outcome"] == "rejected" and str(results[1]["reason"]).startswith("not confirmed")
    assert results[1]["speedup_text"] == "1.010x [0.970, 1.050]"           # the evidence is the confirmation's
    assert results[1]["screen"]["speedup_text"] == "1.500x [1.300, 1.700]"   # type: ignore[index]
    assert len(list(camp.workspace.repo.iter_commits())) == 1                # nothing committed
    assert camp.workspace.serving_config()["max_num_seqs"] == 1
    kinds = [r["kind"] for r in read_records(tmp_path / "log")]
    assert kinds.index("iteration.confirm") < kinds.index("iteration.result")   # recorded before it ran


def test_only_the_confirmations_figures_go_into_the_trailers_and_incumbent_rows(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    executor = FakeExecutor({4: SpeedupCI(1.5, 1.3, 1.7, 4), 8: SpeedupCI(1.0, 0.97, 1.03, 4),
                             16: SpeedupCI(1.0, 0.97, 1.03, 4), 32: SpeedupCI(1.0, 0.97, 1.03, 4)},
                            confirmed={4: SpeedupCI(1.3, 1.2, 1.4, 4)})
    camp = campaign(executor)
    camp.run()
    results = _results_of(tmp_path / "log")
    assert results[1]["outcome"] == "accepted" and str(results[1]["reason"]).startswith("confirmed")
    head = camp.workspace.repo.head.commit.message
    assert "Ratchet-Speedup: 1.300x [1.200, 1.400]" in head and "1.500x" not in head
    assert results[1]["ci_low"] == 1.2 and results[1]["screen"]["ci_low"] == 1.3   # type: ignore[index]


def test_a_confirmation_that_cannot_run_leaves_the_candidate_uncommitted_and_says_why(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    executor = FakeExecutor({4: SpeedupCI(1.5, 1.3, 1.7, 4), 8: None})
    camp = campaign(executor)
    camp.spec = camp.spec.model_copy(update={"budget": camp.spec.budget.model_copy(update={"max_iterations": 2})})
    executor.confirmed = {4: None}                     # the confirmation's worker dies, retries used up
    camp.run()
    results = _results_of(tmp_path / "log")
    assert results[1]["outcome"] == "rejected"
    assert "not confirmed: the confirmation failed" in str(results[1]["reason"]) and "left uncommitted" in \
        str(results[1]["reason"])
    assert len(list(camp.workspace.repo.iter_commits())) == 1


def test_no_confirmation_starts_when_the_wall_budget_cannot_hold_it_and_the_final(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    executor = FakeExecutor({4: SpeedupCI(1.5, 1.3, 1.7, 4), 8: SpeedupCI(1.0, 0.97, 1.03, 4)})
    camp = campaign(executor)
    camp.spec = camp.spec.model_copy(update={"budget": camp.spec.budget.model_copy(update={"max_iterations": 2})})
    camp._eval_seconds = 1e9                           # an evaluation "takes" longer than the budget has
    camp.round(1, 2)
    results = _results_of(tmp_path / "log")
    assert results[1]["outcome"] == "rejected" and "wall budget" in str(results[1]["reason"])
    assert executor.confirmations == [] and len(list(camp.workspace.repo.iter_commits())) == 1


def test_a_tampered_measurement_is_a_recorded_outcome_and_the_campaign_goes_on(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    from harness.errors import MeasurementTampered

    tampered = MeasurementTampered("the measurement path changed while the builds were served and measured: "
                                   "site-packages/vllm/benchmarks/serve.py")
    executor = FakeExecutor({4: tampered, 8: SpeedupCI(1.5, 1.3, 1.7, 4), 16: SpeedupCI(1.0, 0.97, 1.03, 4),
                             32: SpeedupCI(1.0, 0.97, 1.03, 4)})
    camp = campaign(executor)
    camp.run()
    results = _results_of(tmp_path / "log")
    assert results[1]["outcome"] == "tampered" and "serve.py" in str(results[1]["reason"])
    assert results[2]["outcome"] == "accepted"            # the next candidate was measured and judged as usual


@pytest.mark.parametrize("space", [{"dtype": ["bfloat16"]}, {"kv_cache_dtype": ["fp8"]},
                                   {"gpu_memory_utilization": [0.95]}])
def test_a_candidate_may_not_lower_the_precision_or_take_the_other_builds_memory(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path, space: dict[str, list[object]]) -> None:
    """A bf16 or fp8 candidate can pass greedy parity on a checkpoint trained for >= 1-nat margins."""
    executor = FakeExecutor({})
    camp = campaign(executor)
    camp.proposer = SearchProposer(camp.spec.proposer.search.model_copy(update={"space": space}))
    camp.spec = camp.spec.model_copy(update={"budget": camp.spec.budget.model_copy(update={"max_iterations": 1})})
    camp.run()
    (result,) = [payload_of(tmp_path / "log", r) for r in read_records(tmp_path / "log")
                 if r["kind"] == "iteration.result"]
    assert result["outcome"] == "invalid" and f"{next(iter(space))} is fixed by the spec" in str(result["reason"])
    assert executor.rounds == []


def test_a_spec_may_hand_the_precision_to_candidates_by_name(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    executor = FakeExecutor({1: SpeedupCI(1.0, 0.97, 1.03, 4)})
    camp = campaign(executor)
    camp.proposer = SearchProposer(camp.spec.proposer.search.model_copy(update={"space": {"dtype": ["bfloat16"]}}))
    server = camp.spec.server.model_copy(update={"candidate_may_change": ["dtype"]})
    camp.spec = camp.spec.model_copy(update={"server": server, "budget": camp.spec.budget.model_copy(
        update={"max_iterations": 1})})
    camp.run()
    assert [j.b.engine_args["dtype"] for r in executor.rounds for j in r] == ["bfloat16"]


def test_a_confirmation_whose_port_was_taken_by_another_campaign_picks_new_ports(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    from harness.errors import PortInUse

    class TakenOnce(FakeExecutor):
        def run(self, jobs, *, on_retry, progress):  # type: ignore[no-untyped-def]
            if jobs[0].purpose == "confirm" and not self.confirmations:
                self.confirmations += jobs
                return [EvalOutcome(jobs[0].iteration, error=PortInUse("port 8002 is leased by another ratchet "
                                                                       "server on this host"))]
            return super().run(jobs, on_retry=on_retry, progress=progress)

    executor = TakenOnce({4: SpeedupCI(1.5, 1.3, 1.7, 4), 8: SpeedupCI(1.0, 0.97, 1.03, 4)})
    camp = campaign(executor)
    camp.spec = camp.spec.model_copy(update={"budget": camp.spec.budget.model_copy(update={"max_iterations": 2})})
    camp.run()
    assert _results_of(tmp_path / "log")[1]["outcome"] == "accepted"
    assert [j.work_dir.name for j in executor.confirmations] == ["confirm", "confirm2"]


def test_a_screen_whose_port_was_taken_by_another_campaign_runs_again_on_new_ports(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    from harness.errors import PortInUse

    class TakenOnce(FakeExecutor):
        taken = False

        def run(self, jobs, *, on_retry, progress):  # type: ignore[no-untyped-def]
            if jobs[0].purpose == "screen" and not self.taken:   # the round's second job loses its B port
                self.taken = True
                self.rounds.append(jobs)
                first = super().run(jobs[:1], on_retry=on_retry, progress=progress)
                self.rounds.pop()
                return first + [EvalOutcome(jobs[1].iteration, error=PortInUse(
                    "port 8003 is leased by another ratchet server on this host"))]
            return super().run(jobs, on_retry=on_retry, progress=progress)

    executor = TakenOnce({4: SpeedupCI(1.0, 0.97, 1.03, 4), 8: SpeedupCI(1.5, 1.3, 1.7, 4)})
    camp = campaign(executor)
    camp.spec = camp.spec.model_copy(update={"budget": camp.spec.budget.model_copy(update={"max_iterations": 2})})
    camp.run()
    results = _results_of(tmp_path / "log")
    assert [results[i]["outcome"] for i in (1, 2)] == ["rejected", "accepted"]   # not "failed: PortInUse"
    (again,) = executor.rounds[-1]
    assert again.iteration == 2 and again.work_dir.name == "ports2"
    records = read_records(tmp_path / "log")
    (retry,) = [payload_of(tmp_path / "log", r) for r in records if r["kind"] == "iteration.port_retry"]
    assert "leased by another" in retry["error"] and sorted(retry["ports"].values()) == sorted(again.ports.values())


@pytest.mark.parametrize(("profile_baseline", "reads_profile", "profiled_once"), [
    (None, True, True),       # the default: profiled for a proposer that reads profiles (llm) ...
    (None, False, False),     # ... and not for one that does not (search): it costs a server start
    (True, False, True),      # the spec's word wins either way
    (False, True, False),
])
def test_an_accepted_patch_has_the_new_incumbent_profiled_and_the_next_proposal_sees_it(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        profile_baseline: bool | None, reads_profile: bool, profiled_once: bool) -> None:
    from harness.config import Cell
    from harness.profiling import OpTime, Profile

    profiled: list[dict[str, object]] = []

    def profile_cell(backend: object, *, tree: Path, engine_args: dict[str, object], cell: Cell,
                     **kw: object) -> list[Profile]:
        profiled.append({"serving": dict(engine_args), "cell": cell.label})
        op = OpTime(name=f"op-at-{engine_args['max_num_seqs']}", category="cpu_op", self_ms=1.0, calls=1, share=1.0)
        return [Profile(phase="end-to-end", cell=cell, ops=(op,), trace_files=())]

    monkeypatch.setattr(HARNESS, "profile", profile_cell)
    camp = campaign(FakeExecutor({4: SpeedupCI(1.5, 1.3, 1.7, 3), 8: SpeedupCI(1.1, 1.05, 1.2, 3),
                                  16: SpeedupCI(1.0, 0.9, 1.1, 3), 32: SpeedupCI(1.0, 0.9, 1.1, 3)}))
    camp.spec = camp.spec.model_copy(update={"profile_baseline": profile_baseline})
    monkeypatch.setattr(camp.proposer, "reads_profile", reads_profile)
    camp.profile = "baseline ops"
    camp.run()
    if not profiled_once:
        assert profiled == [] and camp.profile == "baseline ops"
        assert "incumbent.profile" not in {r["kind"] for r in read_records(tmp_path / "log")}
        return
    # one profile, of the round's winner, at the grid's cell; recorded after that iteration's result
    assert profiled == [{"serving": {"max_num_seqs": 4}, "cell": "in8/out4"}]
    records = read_records(tmp_path / "log")
    kinds = [(r["kind"], r.get("iteration")) for r in records]
    assert kinds.index(("incumbent.profile", 1)) > kinds.index(("iteration.result", 2))
    body = payload_of(tmp_path / "log", next(r for r in records if r["kind"] == "incumbent.profile"))
    assert "op-at-4" in str(body["text"]) and body["incumbent"] == camp.incumbent_ref
    assert camp.profile is not None and "op-at-4" in camp.profile


def test_a_confirmation_is_estimated_as_an_ab_of_two_builds_with_one_start_up(
        campaign: Callable[[FakeExecutor], Campaign]) -> None:
    # The H200 round of 2026-12-03: servers ready after ~178 s, A and two candidates measured in 579 s at 4 pairs.
    # A confirmation (and the final comparison) is A and one candidate at 8 pairs: one start-up, and two builds'
    # share of the benchmark doubled, ~713 s; the whole round scaled by the repeats would have said ~1,158 s.
    camp = campaign(FakeExecutor({}))
    bench = camp.spec.benchmark.model_copy(update={"repeats": 4, "confirm_repeats": 8})
    camp.spec = camp.spec.model_copy(update={"benchmark": bench})
    camp.round_basis = (178.0, 150.0)
    camp._eval_seconds = camp._ab_seconds(579.0, builds=3)
    assert camp._eval_seconds == pytest.approx(178 + 401 * 2 / 3)
    assert camp._strong_seconds == pytest.approx(178 + 401 * 2 / 3 * 2)
    # with no start-up known (a resumed log without one), the whole evaluation scales, as it did before
    camp.round_basis = (0.0, 0.0)
    camp._eval_seconds = camp._ab_seconds(600.0, builds=2)
    assert camp._strong_seconds == pytest.approx(1200.0)


def test_once_a_confirmation_ran_its_own_time_is_what_the_next_one_and_the_final_are_planned_with(
        campaign: Callable[[FakeExecutor], Campaign]) -> None:
    # main job run 8: one disturbed screen (877 s) set the estimate at ~1,657 s; the confirmation took 938 s
    class SlowConfirmation(FakeExecutor):
        def run(self, jobs: list[EvalJob], **kw: Any) -> list[EvalOutcome]:
            if jobs[0].purpose == "confirm":
                time.sleep(0.3)
            return super().run(jobs, **kw)

    executor = SlowConfirmation({4: SpeedupCI(1.5, 1.3, 1.7, 3), 8: SpeedupCI(1.01, 0.99, 1.03, 3)})
    camp = campaign(executor)
    camp.round_basis = (50.0, 0.0)
    camp._eval_seconds = camp._ab_seconds(877.0, builds=2)
    assert camp._strong_seconds == pytest.approx(50 + 827 * 2)
    camp.round(1, 2)
    assert len(executor.confirmations) == 1
    assert 0.3 <= camp._strong_seconds < 5.0 and camp._strong_seconds == camp._confirm_seconds


def test_a_marginal_screen_pass_spends_no_confirmation(
        campaign: Callable[[FakeExecutor], Campaign], tmp_path: Path) -> None:
    """The main job's run 9: 1.021x [0.987, 1.055] at 4 pairs clears the screen's 80 % bound, but a confirmation of
    8 pairs would clear 1.02 about 1 % of the time: the loop rejects it at the screen and keeps the wall time for a
    candidate a confirmation can confirm (here 1.3x, confirmed)."""
    t3 = 3.182446305284263                                         # t(0.975, 3 df)
    marginal = SpeedupCI(1.021, 0.987, 1.055, 4, se_log=math.log(1.055 / 0.987) / (2 * t3), df=3)
    strong = SpeedupCI(1.3, 1.2, 1.41, 4, se_log=math.log(1.41 / 1.2) / (2 * t3), df=3)
    flat = SpeedupCI(1.0, 0.97, 1.03, 4, se_log=math.log(1.03 / 0.97) / (2 * t3), df=3)
    executor = FakeExecutor({4: marginal, 8: flat, 16: strong, 32: flat})
    camp = campaign(executor)
    camp.run()
    results = _results_of(tmp_path / "log")
    (marginal_it,) = [i for i, r in results.items() if r.get("speedup_text") == str(marginal)]
    assert results[marginal_it]["outcome"] == "rejected"
    assert "not worth its time" in str(results[marginal_it]["reason"])
    confirmed = [int(job.b.engine_args["max_num_seqs"]) for job in executor.confirmations]  # type: ignore[call-overload]
    assert confirmed == [16]                                        # only the strong one took a confirmation
    assert any(r["outcome"] == "accepted" for r in results.values())
