"""Whole campaigns through the fake measurement seam (tests/fake_measurements.py): start to end, replay, and
SIGKILL at random points of a campaign followed by `resume`, in the unit suite, without vLLM."""

from __future__ import annotations

import fcntl
import json
import os
import random
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import git
import pytest

from agent.errors import CampaignError
from agent.replay import Exit, replay
from audit.errors import LogLockedError
from audit.reader import payload_of, read_records
from audit.verify import verify
from harness.measure import ABResult, Build
from tests.conftest import processes_under
from tests.fake_campaign import KILL_POINTS, gemma4_patch, killed_at, resume, start, write_target
from tests.fake_measurements import SPEED, FakeMeasurements
from tests.fakes import FakeProposer


def _branch_commits(log_dir: Path) -> list[git.Commit]:
    start_rec = payload_of(log_dir, next(r for r in read_records(log_dir) if r["kind"] == "campaign.start"))
    repo = git.Repo(start_rec["workspace"])
    return list(repo.iter_commits(f"{start_rec['base_commit']}..{start_rec['branch']}"))


def _iteration_of(commit: git.Commit) -> int:
    return int(str(commit.message).split("Ratchet-Iteration: ")[1].split("\n")[0])


def test_a_whole_campaign_runs_through_the_seam_and_its_claims_replay(tmp_path: Path) -> None:
    spec = write_target(tmp_path)
    measure = FakeMeasurements()
    end = start(spec, tmp_path / "logs", tmp_path / "ws", measure)
    # max_num_seqs 4 (1.5x) is accepted, then 8 (2.0x); 16 (1.9x) does not beat 8 and is rejected
    assert end.verdict.status == "improved" and end.stop_reason == "iteration budget of 3 reached"
    assert end.final is not None and end.final.overall is not None and 1.9 < end.final.overall.ratio < 2.1
    records = read_records(end.log_dir)
    outcomes = [payload_of(end.log_dir, r)["outcome"] for r in records if r["kind"] == "iteration.result"]
    assert outcomes == ["accepted", "accepted", "rejected"]
    assert verify(end.log_dir).ok
    assert [_iteration_of(c) for c in _branch_commits(end.log_dir)] == [2, 1]
    assert measure.calls.count("grid") == 1 and "profile" not in measure.calls   # search reads no profile
    assert not processes_under(end.log_dir)

    ok = replay(end.log_dir, backend_for=lambda s: None, work_dir=tmp_path / "replay",  # type: ignore[arg-type,return-value]
                measure=FakeMeasurements())
    assert ok.exit_code == 0 and len(ok.checks) >= 6, ok.checks
    assert [c.name for c in ok.checks if c.name.startswith("speedup")] == ["speedup of iteration 1",
                                                                           "speedup of iteration 2"]


def test_a_replay_whose_speedup_is_gone_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    end = start(write_target(tmp_path, space="[4]", iterations=1), tmp_path / "logs", tmp_path / "ws")
    assert end.verdict.status == "improved"
    monkeypatch.setitem(SPEED, 4, 1.0)     # the same patch no longer makes anything faster
    result = replay(end.log_dir, backend_for=lambda s: None, work_dir=tmp_path / "replay",  # type: ignore[arg-type,return-value]
                    measure=FakeMeasurements())
    failed = [c for c in result.checks if not c.ok]
    assert [c.name for c in failed] == ["speedup of iteration 1"], result.checks
    assert result.exit_code == Exit.SPEEDUP_GONE


def test_a_code_patch_that_breaks_parity_is_rejected_and_one_that_speeds_up_is_kept(tmp_path: Path) -> None:
    from agent.base import GiveUp, Proposal

    proposer = FakeProposer([
        Proposal("fold a scale", gemma4_patch("SCALE = 1.0  # BREAKS_PARITY"), predicted_speedup=1.3, source="fake:1"),
        Proposal("a faster kernel", gemma4_patch("SPEED = 1.6"), predicted_speedup=1.5, source="fake:2"),
    ], when_done=GiveUp("nothing left"))
    end = start(write_target(tmp_path, iterations=4), tmp_path / "logs", tmp_path / "ws", proposer=proposer)
    records = read_records(end.log_dir)
    results = [payload_of(end.log_dir, r) for r in records if r["kind"] == "iteration.result"]
    assert [r["outcome"] for r in results[:2]] == ["parity-broken", "accepted"], results
    assert "real divergence" in str(results[0]["reason"])
    assert end.verdict.status == "improved" and end.final is not None and end.final.overall is not None
    assert 1.5 < end.final.overall.ratio < 1.7
    commits = _branch_commits(end.log_dir)
    assert [_iteration_of(c) for c in commits] == [2]
    shown = commits[0].repo.git.show(f"{commits[0].hexsha}:vllm/model_executor/models/gemma4.py")
    assert "SPEED = 1.6" in shown and "BREAKS_PARITY" not in shown
    # the second proposal saw the first's rejection and its reason
    assert proposer.seen[1].history[0].outcome == "parity-broken"
    # the kept change carries its parity certificate: in its result, its commit's trailer and the summary
    cert = results[1]["certificate"]
    assert cert["ok"] and cert["held"]["identical"] == cert["held"]["prompts"] > 0
    assert cert["tolerance_basis"].endswith("(experiments/results/workload-logprobs.md)")
    assert f"Ratchet-Parity-Certificate: {cert['line']}" in commits[0].message
    assert set(cert["roofline"]) and all(set(f) == {"mfu", "mbu", "roofline"} and 0 < f["roofline"] < 1
                                         for f in cert["roofline"].values())
    assert not results[0]["certificate"]["ok"] and results[0]["certificate"]["held"]["mismatches"] > 0
    summary = (end.log_dir / "summary.md").read_text()
    assert "Parity certificate:" in summary and f"- tolerance basis: {cert['tolerance_basis']}" in summary
    assert "Parity certificate of the final comparison:" in summary


class SeenBuilds(FakeMeasurements):
    """Keeps the builds of every A/B, as the harness would get them."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[Build, Build]] = []

    def ab(self, backend: Any, a: Build, b: Build, **kw: Any) -> ABResult:
        self.pairs.append((a, b))
        return super().ab(backend, a, b, **kw)


def test_a_serving_only_candidate_is_known_to_run_the_incumbents_code_and_a_code_patch_is_not(
        tmp_path: Path) -> None:
    # the harness seeds B's cold cache folder from A's only when both code keys are known and equal
    from agent.base import GiveUp, Proposal

    serving = ("diff --git a/serving.yaml b/serving.yaml\n--- a/serving.yaml\n+++ b/serving.yaml\n"
               "@@ -1,2 +1,3 @@\n enforce_eager: true\n max_num_seqs: 1\n+stream_interval: 8\n")
    proposer = FakeProposer([
        Proposal("a faster kernel", gemma4_patch("SPEED = 1.1"), predicted_speedup=1.1, source="fake:1"),
        Proposal("stream in chunks", serving, predicted_speedup=1.05, source="fake:2"),
    ], when_done=GiveUp("nothing left"))
    measure = SeenBuilds()
    start(write_target(tmp_path, iterations=2), tmp_path / "logs", tmp_path / "ws", measure, proposer=proposer)
    code_a, code_b = next(pair for pair in measure.pairs if "stream_interval" not in pair[1].engine_args)
    serving_a, serving_b = next(pair for pair in measure.pairs if "stream_interval" in pair[1].engine_args)
    assert code_a.code_key and code_b.code_key == ""                       # a code patch: its own caches
    assert serving_a.code_key and serving_b.code_key == serving_a.code_key    # the same code, other engine args
    assert serving_b.cache_key != serving_a.cache_key                         # its own folder, started as a copy


IMAGE_CELLS = """benchmark: {input_lens: [8], output_lens: [4], num_prompts: 8, max_concurrency: 4, repeats: 4,
            images: {input_lens: [8], output_lens: [4], size: 96}}
"""


def test_a_change_that_speeds_text_but_slows_pictures_is_rejected_and_a_final_comparison_judges_both(
        tmp_path: Path) -> None:
    """A grid with image cells: the text cells' headline is the claim, the image cells' is guarded. Held prompts
    with pictures are required; this spec says why it has none (parity.images_uncovered)."""
    from agent.base import GiveUp, Proposal

    spec = write_target(tmp_path, iterations=3)
    spec.write_text(spec.read_text().replace(
        "benchmark: {input_lens: [8], output_lens: [4], num_prompts: 8, max_concurrency: 4, repeats: 4}\n",
        IMAGE_CELLS).replace("max_tokens: 4}", "max_tokens: 4, images_uncovered: the fake generates no pictures}"))
    proposer = FakeProposer([
        Proposal("trade pictures for text", gemma4_patch("SPEED = 1.6").replace("+1,2 @@", "+1,3 @@")
                 + "+IMAGE_SPEED = 0.5\n", predicted_speedup=1.5, source="fake:1"),
        Proposal("a faster kernel", gemma4_patch("SPEED = 1.4"), predicted_speedup=1.4, source="fake:2"),
    ], when_done=GiveUp("nothing left"))
    end = start(spec, tmp_path / "logs", tmp_path / "ws", proposer=proposer)
    results = [payload_of(end.log_dir, r) for r in read_records(end.log_dir) if r["kind"] == "iteration.result"]
    assert [r["outcome"] for r in results[:2]] == ["rejected", "accepted"], results
    assert "image cells" in str(results[0]["reason"])
    final = end.final
    assert end.verdict.status == "improved" and final is not None and final.overall is not None
    assert final.images is not None and 1.3 < final.images.ratio < 1.5 and 1.3 < final.overall.ratio < 1.5
    assert "in8/out4/img1x96" in final.cells and verify(end.log_dir).ok
    summary = (end.log_dir / "summary.md").read_text()           # the report names both headlines
    assert "| **text cells (geo-mean)** |" in summary and "| **image cells (geo-mean)** |" in summary
    assert "counts text and image tokens" in summary
    assert end.report is not None and "image cells (geo-mean)" in end.report.read_text()
    ok = replay(end.log_dir, backend_for=lambda s: None, work_dir=tmp_path / "replay",  # type: ignore[arg-type,return-value]
                measure=FakeMeasurements())
    assert ok.exit_code == 0, ok.checks


def _kill_points(tmp_path: Path, n: int = 24) -> list[tuple[str, int]]:
    """Points drawn at random (seeded) over every step and the whole length of an unkilled campaign."""
    counts_file = tmp_path / "counts.json"
    spec = write_target(tmp_path / "dry")
    code = killed_at(None, ["start", str(spec), str(tmp_path / "dry" / "logs"), str(tmp_path / "dry" / "ws")],
                     counts_file=counts_file)
    assert code == 0
    counts = json.loads(counts_file.read_text())
    assert set(counts) == set(KILL_POINTS), counts       # every step is reached by an unkilled campaign
    rng = random.Random(0)
    names = sorted(counts)
    points = [(name, rng.randint(1, counts[name])) for name in names]           # each step at least once
    points += [(name, rng.randint(1, counts[name])) for name in rng.choices(names, k=n - len(names))]
    return sorted(set(points))


@pytest.mark.timeout(900)
def test_sigkill_at_random_points_then_resume_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    points = _kill_points(tmp_path, n=30)
    resumed = []
    for name, n in points:
        case = tmp_path / f"{name}-{n}"
        spec = write_target(case)
        code = killed_at(f"{name}:{n}", ["start", str(spec), str(case / "logs"), str(case / "ws")])
        assert code == -9, (name, n, code)
        logs = list((case / "logs").glob("*/log.jsonl"))
        if not logs or '"campaign.start"' not in logs[0].read_text():
            continue   # killed before the campaign existed: nothing to resume (and nothing claimed)
        log_dir = logs[0].parent
        before = read_records(log_dir)
        if any(r["kind"] == "campaign.end" for r in before):
            continue   # killed after it ended (writing its report): resume rightly refuses
        end = resume(log_dir)
        resumed.append(f"{name}:{n}")
        after = read_records(log_dir)
        where = f"killed at {name}:{n}"
        assert after[: len(before)] == before, where                         # nothing recorded was lost or changed
        assert [r["seq"] for r in after] == list(range(len(after))), where   # no gap, no duplicate
        assert verify(log_dir).ok, where
        results = [r["iteration"] for r in after if r["kind"] == "iteration.result"]
        assert len(results) == len(set(results)), (where, results)          # each iteration decided once
        # the branch holds exactly the accepted iterations, in order, and nothing of the killed attempt
        accepted = payload_of(log_dir, next(r for r in after if r["kind"] == "campaign.end"))["accepted"]
        on_branch = [_iteration_of(c) for c in reversed(_branch_commits(log_dir))]
        assert on_branch == accepted, (where, on_branch, accepted)
        assert end.verdict.ok, (where, end.verdict)
        assert not processes_under(log_dir), where                           # the dead run's servers were reaped
    assert len(resumed) >= 20, resumed
    assert {p.split(":")[0] for p in resumed} == set(KILL_POINTS), resumed   # every step, killed and resumed


def test_a_resume_acts_only_on_an_intact_log_it_holds_the_lock_of(tmp_path: Path) -> None:
    """Killed with its servers up: a resume of its log with a record changed, or while another writer holds the
    log's lock (a campaign still running), is refused with nothing written and nothing killed; once the log is
    whole and free, the resume reaps those servers and runs to the end."""
    spec = write_target(tmp_path)
    code = killed_at("servers:1", ["--hold-s", "120", "start", str(spec), str(tmp_path / "logs"),
                                   str(tmp_path / "ws")])
    assert code == -9
    (log_dir,) = [p.parent for p in (tmp_path / "logs").glob("*/log.jsonl")]
    servers = processes_under(log_dir)
    assert servers, "the kill was meant to leave the fake's servers up"
    text = (log_dir / "log.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    # a record with records after it (the last, unsigned one of a killed log cannot be proven unedited)
    at = next(i for i, line in enumerate(lines) if '"kind":"executor.start"' in line)
    assert at < len(lines) - 1
    edited = lines[:at] + [lines[at].replace('"slots":1', '"slots":9', 1)] + lines[at + 1:]
    assert edited[at] != lines[at]
    (log_dir / "log.jsonl").write_text("".join(edited))
    with pytest.raises(CampaignError, match=f"does not verify \\(seq {at}"):
        resume(log_dir)
    assert (log_dir / "log.jsonl").read_text() == "".join(edited)          # nothing written
    assert all(s.is_running() for s in servers)                             # nothing killed

    (log_dir / "log.jsonl").write_text(text)
    held = os.open(log_dir / "log.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)                    # a live writer's lock
        with pytest.raises(LogLockedError):
            resume(log_dir)
        assert (log_dir / "log.jsonl").read_text() == text
        assert all(s.is_running() for s in servers)                         # a live campaign's servers are its own
    finally:
        os.close(held)

    end = resume(log_dir)
    assert end.verdict.ok and verify(log_dir).ok
    assert not processes_under(log_dir)
    resumed = [payload_of(log_dir, r) for r in read_records(log_dir) if r["kind"] == "campaign.resume"]
    assert len(resumed) == 1 and sorted(resumed[0]["reaped_pids"]) == sorted(s.pid for s in servers)


def test_a_serving_change_vllm_resolves_to_the_args_in_force_is_refused_before_any_server(tmp_path: Path) -> None:
    # The fake resolves async_scheduling to off whatever serving.yaml asks (as vLLM on CPU does): proposing it
    # is a no-op that would cost a whole A/B of noise. max_num_seqs 4 is a real change (1.5x).
    spec = write_target(tmp_path, iterations=2,
                        search="{strategy: random, space: {async_scheduling: [true], max_num_seqs: [4]}}")
    measure = FakeMeasurements()
    end = start(spec, tmp_path / "logs", tmp_path / "ws", measure)
    records = read_records(end.log_dir)
    results = [payload_of(end.log_dir, r) for r in records if r["kind"] == "iteration.result"]
    by_outcome = {r["outcome"]: r for r in results}
    assert set(by_outcome) == {"invalid", "accepted"}, results
    reason = str(by_outcome["invalid"]["reason"])
    assert "no-op" in reason and "async_scheduling: (unset) -> True" in reason and "async_scheduling=False" in reason
    # the baseline grid, the accepted candidate's screen and confirmation, the final comparison: no A/B for the no-op
    assert measure.calls.count("ab") == 3, measure.calls
    assert end.verdict.status == "improved" and verify(end.log_dir).ok


class SlowResolution(FakeMeasurements):
    """vLLM's resolution of a serving config takes a while (a fresh process: ~23 s on an H200 host). Each call
    lasts until `together` calls are in flight at once, or 5 s: resolutions run one after another never get
    there, and ones started together do however slowly a loaded host starts their threads (a fixed 0.5 s sleep
    saw only 2 of 3 overlap on a busy 2-core machine)."""

    def __init__(self, together: int) -> None:
        super().__init__()
        self.together = together
        self.resolving = 0
        self.most_at_once = 0
        self.cond = threading.Condition()

    def engine_defaults(self, model: Path, serving: Mapping[str, object], *, env: Mapping[str, str]
                        ) -> dict[str, object]:
        with self.cond:
            self.resolving += 1
            self.most_at_once = max(self.most_at_once, self.resolving)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.most_at_once >= self.together, timeout=5)
            self.resolving -= 1
        return super().engine_defaults(model, serving, env=env)


def test_a_rounds_candidates_are_resolved_together_and_its_no_op_is_refused_before_the_servers(
        tmp_path: Path) -> None:
    # three serving.yaml-only candidates in one round: their no-op checks run at once, not one after another;
    # async_scheduling (forced off, as on vLLM CPU) is refused, the other two are screened together
    spec = write_target(tmp_path, iterations=3, extra="executor: {kind: local, slots: 3}",
                        search="{strategy: ordered, space: {max_num_seqs: [4], async_scheduling: [true], "
                               "enable_chunked_prefill: [false]}}")
    measure = SlowResolution(together=3)
    end = start(spec, tmp_path / "logs", tmp_path / "ws", measure)
    assert measure.most_at_once == 3, measure.most_at_once
    results = {r["iteration"]: payload_of(end.log_dir, r) for r in read_records(end.log_dir)
               if r["kind"] == "iteration.result"}
    assert results[2]["outcome"] == "invalid" and "no-op" in str(results[2]["reason"]), results[2]
    assert {results[1]["outcome"], results[3]["outcome"]} <= {"accepted", "rejected"}, results
    assert measure.calls.count("arms2") == 1, measure.calls       # the two real changes, against one incumbent
    assert not (end.log_dir / "runs" / "it002" / "tree-B").exists()   # the refused candidate's trees are gone
    assert verify(end.log_dir).ok


def test_a_round_of_candidates_is_screened_together_against_one_incumbent_and_only_its_best_is_confirmed(
        tmp_path: Path) -> None:
    # executor.slots 3 on one host: the round's three candidates are one comparison (one incumbent server, one
    # start-up), then the best of them gets its own fresh confirmation A/B; 8 seqs is the fastest (2.0x)
    spec = write_target(tmp_path, space="[2, 4, 8]", iterations=3, extra="executor: {kind: local, slots: 3}")
    measure = FakeMeasurements()
    end = start(spec, tmp_path / "logs", tmp_path / "ws", measure)
    assert measure.calls.count("arms3") == 1, measure.calls
    # the confirmation and the final comparison are ordinary A/Bs; no candidate had an A/B of its own to screen it
    assert measure.calls.count("ab") == 2, measure.calls
    records = read_records(end.log_dir)
    results = {r["iteration"]: payload_of(end.log_dir, r) for r in records if r["kind"] == "iteration.result"}
    assert sorted(results) == [1, 2, 3]
    by_source = {r["source"]: r for r in results.values()}
    outcomes = {r["source"]: r["outcome"] for r in results.values()}
    assert len(outcomes) == 3, outcomes
    winner = next(src for src in outcomes if '"max_num_seqs": 8' in src)
    assert outcomes[winner] == "accepted"
    assert sorted(outcomes.values()) == ["accepted", "rejected", "rejected"]
    for source, r in by_source.items():
        if source != winner:   # passed its screen, but the round commits one candidate only
            assert "superseded" in str(r["reason"]), r
    # each candidate's record says it was screened together, with its share of the comparison's time;
    # the winner's evidence is its confirmation (an A/B of its own), its screen is kept beside it
    assert by_source[winner]["screen"]["placement"]["screened_together"] == [1, 2, 3]
    for source, r in by_source.items():
        if source != winner:
            assert r["placement"]["screened_together"] == [1, 2, 3]
            assert r["placement"]["seconds"] * 3 == pytest.approx(r["placement"]["comparison_seconds"], abs=0.2)
            assert r["evidence"]["B"] == {"fake": True} and r["cells_rows"], r
    assert end.verdict.status == "improved" and verify(end.log_dir).ok


def test_a_round_shrinks_to_the_candidates_the_wall_budget_holds(tmp_path: Path) -> None:
    # The baseline reports a 100 s start-up and 5 s per run (8 runs: a 40 s grid): a round of 3 is planned at
    # 1.2 x (100 + 4 x 40) = 312 s, a round of 2 at 264 s; 300 s of wall budget hold 2. The next round is planned
    # from the first one's own time (a second here), so it takes the 3 that are left.
    spec = write_target(tmp_path, space="[2, 4, 8, 16, 32]", iterations=5,
                        extra="executor: {kind: local, slots: 3}")
    spec.write_text(spec.read_text().replace("wall_seconds: 3600", "wall_seconds: 300"))
    measure = FakeMeasurements(startup_s=100.0, run_s=5.0)
    end = start(spec, tmp_path / "logs", tmp_path / "ws", measure)
    assert [c for c in measure.calls if c.startswith("arms")] == ["arms2", "arms3"], measure.calls
    records = read_records(end.log_dir)
    assert sorted(r["iteration"] for r in records if r["kind"] == "iteration.result") == [1, 2, 3, 4, 5]
    baseline = next(payload_of(end.log_dir, r) for r in records if r["kind"] == "baseline.result")
    assert (baseline["startup_s"], baseline["grid_s"]) == (100.0, 40.0)   # recorded: a resume plans with it too
