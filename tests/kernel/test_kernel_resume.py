"""`ratchet resume` of a kernel campaign (agent/kernel_resume.py): the campaign runs in a forked child that SIGKILLs
itself at one point of its life (tests/fake_campaign.py's `killed_at`), then it is resumed from its log. The kernel
stage runs the real kernel runner on the plain-torch stand-ins of tests/kernel/; a two-stage campaign's serving
stage goes through the fake measurement seam (tests/fake_measurements.py), whose "servers" are real processes.

After each resume: nothing recorded was lost or changed, each iteration has exactly the records it should (one
result, the interruption recorded once), the chain verifies with every decision re-decided, the branch head is the
log's last accepted commit, nothing the killed run started is still running, and the campaign reached the ending a
live one writes (final comparison, serving stage, campaign.end, each once)."""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

import agent.engine
import agent.kernel_campaign
import agent.measurements
import audit.writer
from agent.cli import main
from agent.commands.kernel import kernel_proposer
from agent.errors import CampaignError
from agent.iteration import INTERRUPTED
from agent.kernel_resume import check_resumable, resume_kernel_campaign
from agent.kernel_spec import load_kernel_spec
from agent.proposers.kernel_search import KernelSearchProposer
from agent.rebuild import open_or_rebuild
from audit import AuditWriter, anchor_path, default_anchor_dir, default_key_path, verify
from audit.reader import payload_of, read_records
from policies import load_policy, redecider
from sandbox.workspace import Workspace
from tests.conftest import processes_under
from tests.fake_campaign import killed_at
from tests.fake_measurements import FakeMeasurements
from tests.kernel import vllm_fakes
from tests.kernel.kernel_fakes import write_tree
from tests.kernel.test_serving_stage import KernelRunnerAndFakeServing, two_stage_spec

# One small shape: the runner's start (~1.5 s of imports) is most of each evaluation, so rounds are nearly free
# (with 6, one slow round once left a 3x gain's final comparison at 2.04x [0.91, 4.54], rejected; with 12 rounds of
# 3 calls of ~0.1-0.4 ms, a whole build's timing lasted ~15 ms, and once the best timed at 395.6 us against the
# stock's 450.3: 1.258x [0.882, 1.792], rejected. 20 rounds of 20 calls: ~0.1 s a build). The search tries
# REPEATS 1 (about 4x faster) and is then exhausted: baseline, an accepted iteration, a give-up, the final comparison.
SPEC = """
schema_version: 1
name: kernel-resume-test
hardware: cpu
target: {kind: kernel, source: src/torchattn, module: attention.py}
device: cpu
dtype: float32
shapes:
  - {name: decode, batch: 2, q_len: 1, kv_len: 64, head_dim: 16, sliding_window: 24}
timing: {rounds: 20, calls_per_round: 20, warmup_calls: 1, flush_l2: false}
roofline: null
proposer: {kind: search, search: {strategy: grid, space: {REPEATS: [4, 1]}}}
budget: {max_iterations: 2, wall_seconds: 600}
runner_timeout_s: 120
"""

# The two-stage campaign of tests/kernel/test_serving_stage.py, with one small shape and fewer rounds
TWO_STAGE = vllm_fakes.CAMPAIGN_SPEC.replace(
    "name: vllm-kernel-test", "name: vllm-kernel-resume-test").replace(
    "  - {name: decode, batch: 2, q_len: 1, kv_len: 256, head_dim: 32, sliding_window: 128}\n", "").replace(
    "timing: {rounds: 20, calls_per_round: 20", "timing: {rounds: 20, calls_per_round: 10") + "serving: serving.yaml\n"
assert "rounds: 20, calls_per_round: 10" in TWO_STAGE   # the replacements above matched

# Per kill point: the killed log's last record, and what each iteration holds after the resume: (outcome,
# hypotheses, patches), one result each.
ACCEPTED_THEN_EXHAUSTED = {1: ("accepted", 1, 1), 2: ("invalid", 0, 0)}
INTERRUPTED_THEN_ACCEPTED = {1: ("failed", 1, 1), 2: ("accepted", 1, 1)}
CASES: dict[str, tuple[str, dict[int, tuple[str, int, int]]]] = {
    "propose:1": ("action", ACCEPTED_THEN_EXHAUSTED),        # while proposing: nothing of it recorded
    "hypothesis:1": ("iteration.hypothesis", {1: ("failed", 1, 0), 2: ("accepted", 1, 1)}),   # nothing after it
    "runner:1": ("action", ACCEPTED_THEN_EXHAUSTED),         # mid-baseline: its runner is up, nothing measured
    "runner:2": ("action", INTERRUPTED_THEN_ACCEPTED),       # mid-measurement: iteration 1's runner is up
    "runner:3": ("action", INTERRUPTED_THEN_ACCEPTED),       # mid-confirmation: accepted once, nothing committed
    "commit:1": ("kernel.evaluation", INTERRUPTED_THEN_ACCEPTED),   # committed, its result not recorded
    "fsync:1": ("iteration.result", ACCEPTED_THEN_EXHAUSTED),       # its result written, not yet fsynced
}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _wrap(owner: Any, attr: str, *, before: Callable[..., None] = lambda *a, **k: None,
          after: Callable[[], None] = lambda: None) -> None:
    original = getattr(owner, attr)

    @functools.wraps(original)
    def wrapped(*args: Any, **kw: Any) -> Any:
        before(*args, **kw)
        result = original(*args, **kw)
        after()
        return result

    setattr(owner, attr, wrapped)


def _die_once_a_child_runs() -> None:
    """SIGKILL this process as soon as a child process it starts from now is running (the kernel runner)."""
    me = psutil.Process()
    known = {c.pid for c in me.children()}

    def watch() -> None:
        while not any(c.pid not in known for c in me.children()):
            time.sleep(0.01)
        _die()

    threading.Thread(target=watch, daemon=True).start()


def _arm(point: str) -> None:
    """In the child: SIGKILL at the N-th passage through one point of a campaign (`name:N`)."""
    name, n = point.split(":")
    calls = collections.Counter[str]()

    def hit(*_: Any, **__: Any) -> bool:
        calls[name] += 1
        return calls[name] == int(n)

    def die_at_hit(*args: Any, **kw: Any) -> None:
        if hit():
            _die()

    def fsync_kills(fd: int, data: bytes) -> None:
        if json.loads(data)["kind"] == "iteration.result" and hit():
            os.fsync = lambda _fd: _die()   # type: ignore[assignment]  # the line is written; its fsync never runs

    if name == "propose":
        _wrap(KernelSearchProposer, "propose", before=die_at_hit)
    elif name == "hypothesis":
        _wrap(agent.engine, "propose", after=lambda: hit() and _die())
    elif name == "runner":
        _wrap(agent.measurements, "run_evaluation", before=lambda *a, **k: hit() and _die_once_a_child_runs())
    elif name == "commit":
        _wrap(Workspace, "commit", after=lambda: hit() and _die())
    elif name == "fsync":
        _wrap(audit.writer, "append_durably", before=fsync_kills)
    elif name == "serving":   # the serving stage's (fake) servers are up, mid-A/B
        _wrap(FakeMeasurements, "_started", before=die_at_hit)
    else:
        raise ValueError(point)


def _child(argv: list[str]) -> int:
    """The forked child's main: a kernel campaign (SPEC LOG_ROOT WORKSPACES) killed at $RATCHET_KILL_AT."""
    _arm(os.environ["RATCHET_KILL_AT"])
    spec_path, log_root, workspaces = map(Path, argv)
    agent.kernel_campaign.start_kernel_campaign(load_kernel_spec(spec_path), spec_path, log_root=log_root,
                                                workspace_root=workspaces, measure=KernelRunnerAndFakeServing())
    return 0


def _killed(case: Path, spec_path: Path, point: str) -> Path:
    """The campaign killed at `point`; its log folder."""
    code = killed_at(point, [str(spec_path), str(case / "logs"), str(case / "ws")], entry=_child)
    assert code == -signal.SIGKILL, (point, code)
    (log_dir,) = (case / "logs").iterdir()
    return log_dir


def _payloads(log_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [payload_of(log_dir, r) for r in read_records(log_dir) if r["kind"] == kind]


def _check_resumed(log_dir: Path, before: list[dict[str, Any]], expected: dict[int, tuple[str, int, int]],
                   where: str) -> None:
    after = read_records(log_dir)
    assert after[: len(before)] == before, where                          # nothing recorded was lost or changed
    assert [r["seq"] for r in after] == list(range(len(after))), where    # no gap, no duplicate
    start = payload_of(log_dir, next(r for r in after if r["kind"] == "campaign.start"))
    policy = load_kernel_spec(Path(start["spec_path"])).policy_file
    anchor = anchor_path(default_anchor_dir(default_key_path()), after[0]["campaign"])
    checked = verify(log_dir, redecide=redecider([load_policy(policy)]), anchor=anchor)
    assert checked.ok, (where, checked)

    per: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in after:
        if r["kind"].startswith("iteration.") and r.get("iteration"):
            per[r["iteration"]][r["kind"]] += 1
    outcomes = {r["iteration"]: payload_of(log_dir, r) for r in after if r["kind"] == "iteration.result"}
    got = {i: (outcomes[i]["outcome"], per[i]["iteration.hypothesis"], per[i]["iteration.patch"]) for i in outcomes}
    assert got == expected, (where, got)
    assert all(per[i]["iteration.result"] == 1 for i in per), (where, per)     # each iteration decided once
    interrupted = [i for i, p in outcomes.items() if p["reason"] == INTERRUPTED]
    assert interrupted == [i for i, (o, _, _) in expected.items() if o == "failed"], (where, interrupted)
    for kind in ("campaign.resume", "final.result", "campaign.end"):
        assert sum(r["kind"] == kind for r in after) == 1, (where, kind)

    # the branch holds exactly the accepted iterations, its head the last accepted commit, nothing else in the tree
    end = _payloads(log_dir, "campaign.end")[0]
    accepted = [p["commit"] for p in outcomes.values() if p["accepted"]]
    ws = Workspace.open(Path(start["workspace"]), load_kernel_spec(Path(start["spec_path"])).target.package)
    assert ws.head() == accepted[-1] == end["incumbent"], where
    assert ws.repo.active_branch.name == start["branch"] and ws.is_clean() and not ws.copies(), where
    on_branch = [c.hexsha for c in ws.repo.iter_commits(f"{start['base_commit']}..{start['branch']}")]
    prelude = [p["commit"] for p in _payloads(log_dir, "prelude.result") if p.get("commit")]
    assert list(reversed(on_branch)) == prelude + accepted, where
    assert _payloads(log_dir, "final.result")[0]["outcome"] == "accepted", where
    assert not processes_under(log_dir), where                           # the dead run's runner and servers are gone


@pytest.fixture
def audit_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    key = tmp_path / "keys" / "audit-key.ed25519"
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(key))
    return key


def _spec(case: Path) -> Path:
    write_tree(case / "src", repeats=4)
    path = case / "spec.yaml"
    path.write_text(SPEC)
    return path


@pytest.mark.timeout(600)
def test_a_kernel_campaign_killed_at_each_point_resumes_to_its_ending_losing_and_duplicating_nothing(
        tmp_path: Path, audit_key: Path) -> None:
    for point, (last, expected) in CASES.items():
        case = tmp_path / point.replace(":", "-")
        log_dir = _killed(case, _spec(case), point)
        before = read_records(log_dir)
        assert before[-1]["kind"] == last, (point, before[-1])
        if point == "runner:3":   # killed in the confirmation: the screen on record, the confirmation not
            assert [p["name"] for p in _payloads(log_dir, "kernel.evaluation")] == ["baseline", "it001"], point
        left = processes_under(log_dir)
        assert bool(left) == point.startswith("runner"), (point, left)   # the runner outlived the campaign
        out = case / "summary.json"
        assert main(["resume", str(log_dir), "--out", str(out)]) == 0, point
        _check_resumed(log_dir, before, expected, point)
        resumed = _payloads(log_dir, "campaign.resume")[0]
        assert bool(resumed["reaped_pids"]) == point.startswith("runner"), (point, resumed)
        assert resumed["interrupted"] == [i for i, (o, _, _) in expected.items() if o == "failed"], point
        if point.startswith("commit"):   # the commit the log never recorded was dropped, with the branch reset
            assert resumed["discarded"]["head"] not in (None, resumed["incumbent"]), resumed
        summary = json.loads(out.read_text())
        assert summary["audit_verify"]["ok"] and summary["tunables_after"]["REPEATS"] == 1, (point, summary)
        with pytest.raises(CampaignError, match="is finished"):
            check_resumable(log_dir)


@pytest.mark.timeout(300)
def test_a_two_stage_campaign_killed_in_its_serving_stage_serves_again_and_ends_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_path = two_stage_spec(tmp_path, monkeypatch, kernel_gain=1.4, kernel_spec=TWO_STAGE)
    log_dir = _killed(tmp_path, spec_path, "serving:1")
    before = read_records(log_dir)
    assert [p["outcome"] for p in _payloads(log_dir, "final.result")] == ["accepted"]
    assert not _payloads(log_dir, "serving.result") and processes_under(log_dir)   # its servers outlived it
    measure = KernelRunnerAndFakeServing()
    end = resume_kernel_campaign(log_dir, proposer_for=kernel_proposer, measure=measure)
    _check_resumed(log_dir, before, ACCEPTED_THEN_EXHAUSTED, "serving:1")
    assert measure.calls == ["ab"]                 # only the serving stage ran again, not the kernel stage's final
    (served,) = _payloads(log_dir, "serving.result")
    assert end.serving == served and served["verdict"]["status"] == "improved" and served["parity_ok"]
    assert end.final is not None and end.final == _payloads(log_dir, "final.result")[0]
    assert _payloads(log_dir, "campaign.end")[0]["serving_verdict"]["status"] == "improved"


def test_a_log_that_cannot_be_resumed_is_refused_with_why(tmp_path: Path, audit_key: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["resume", str(empty)]) == 2
    assert "holds no log.jsonl" in " ".join(capsys.readouterr().err.split())

    serving = tmp_path / "serving-log"       # a serving campaign's log goes to the serving resume
    with AuditWriter.open(serving, campaign="c-1") as w:
        w.append("campaign.start", payload={"spec_path": "/s.yaml", "spec": {"name": "s"}, "workspace": "/ws",
                                            "branch": "ratchet/c-1", "proposer": "search", "base_commit": "b0"})
    with pytest.raises(CampaignError, match="not a kernel campaign's log"):
        check_resumable(serving)

    # a campaign killed in its first iteration: a changed record, and a missing workspace, are refused
    case = tmp_path / "case"
    log_dir = _killed(case, _spec(case), "hypothesis:1")
    start = _payloads(log_dir, "campaign.start")[0]
    changed = tmp_path / "changed" / log_dir.name
    shutil.copytree(log_dir, changed)
    lines = (changed / "log.jsonl").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"kind":"baseline.result"' in line)
    lines[at] = lines[at].replace('"median_us":', '"median_us":1', 1)
    (changed / "log.jsonl").write_text("".join(lines))
    with pytest.raises(CampaignError, match=f"does not verify \\(seq {at}"):
        check_resumable(changed)
    # a missing workspace is no longer a refusal: the log rebuilds it (agent/rebuild.py), the same base commit
    Path(start["workspace"]).rename(tmp_path / "elsewhere")
    journal, spec, here = check_resumable(log_dir)
    assert journal.open_iterations == [1] and here.workspace == Path(start["workspace"])
    ws, done = open_or_rebuild(journal, here.workspace, package=spec.target.package, serving={},
                               source=lambda: spec.target.source_dir)
    assert done["rebuilt"] and ws.head() == start["base_commit"] and ws.repo.active_branch.name == journal.branch
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a workspace")
    with pytest.raises(CampaignError, match="holds something else"):
        open_or_rebuild(journal, tmp_path / "other", package=spec.target.package, serving={},
                        source=lambda: spec.target.source_dir)


@pytest.mark.timeout(300)
def test_a_campaign_killed_in_its_prelude_measures_it_again_and_keeps_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first runner a two-stage campaign starts is its prelude's A/B (stock vs stock with the launch parameters
    named): killed with it up, the resume measures the prelude again, keeps it once, and the campaign runs on."""
    spec_path = two_stage_spec(tmp_path, monkeypatch, kernel_gain=1.4, kernel_spec=TWO_STAGE)
    log_dir = _killed(tmp_path, spec_path, "runner:1")
    before = read_records(log_dir)
    assert not _payloads(log_dir, "prelude.result") and processes_under(log_dir)   # its runner outlived it
    end = resume_kernel_campaign(log_dir, proposer_for=kernel_proposer, measure=KernelRunnerAndFakeServing())
    _check_resumed(log_dir, before, ACCEPTED_THEN_EXHAUSTED, "runner:1 (prelude)")
    (prelude,) = _payloads(log_dir, "prelude.result")
    assert prelude["kept"] and prelude["tunables"] == {"GEMMA4_PASSES": 0}
    assert len(_payloads(log_dir, "baseline.result")) == 1 and len(_payloads(log_dir, "serving.result")) == 1
    assert end.serving is not None and end.serving["verdict"]["status"] == "improved"
