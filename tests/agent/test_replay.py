"""Replay's refusals and failure codes that need no vLLM server: an unverifiable log, a different
environment, a patch that no longer applies, a base that is not the recorded one."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from agent.environment import describe_environment
from agent.replay import Claim, Exit, replay, speedup_holds, write_junit, write_summary
from audit import AuditWriter
from harness.stats import SpeedupCI
from sandbox.workspace import Workspace
from tests.conftest import ROOT

SPEC = {"schema_version": 1, "name": "r", "server": {"model": str(ROOT / "experiments/models/gemma4-tiny")},
        "benchmark": {"input_lens": [8], "output_lens": [4]},
        "parity": {"prompts": str(ROOT / "experiments/prompts/gemma4-tiny-parity.jsonl")},
        "policy": str(ROOT / "policies/default.yaml")}


def _no_backend(spec: object) -> object:
    raise AssertionError("replay must stop before starting any server")


def _forge(tmp_path: Path, *, environment: dict[str, object] | None = None, base_tree: str | None = None,
           diff: str = "", tree: str = "t") -> Path:
    """A validly signed log of a campaign that accepted one patch (what a campaign runner could write)."""
    log = tmp_path / "log"
    with AuditWriter.open(log, campaign="r-1", key_path=tmp_path / "key", anchor_dir=tmp_path / "anchors") as w:
        w.append("campaign.start", payload={"spec_path": "/x", "spec": SPEC, "workspace": "/ws", "branch": "b",
                                            "proposer": "search", "base_commit": "c0",
                                            "base_tree": base_tree or "0" * 40,
                                            "environment": environment or describe_environment()})
        w.append("baseline.result", iteration=0, payload={"cells": [], "reference_file": "parity-reference.json",
                                                          "reference_sha256": "0" * 64})
        w.append("iteration.hypothesis", iteration=1, payload={"hypothesis": "h"})
        w.append("iteration.patch", iteration=1, payload={"diff": diff, "base": "c0"})
        w.append("iteration.result", iteration=1, payload={"outcome": "accepted", "accepted": True, "commit": "c1",
                                                           "tree": tree, "speedup": 2.0, "ci_low": 1.9,
                                                           "ci_high": 2.1, "reason": "ok"})
    return log


def _replay(log: Path, tmp_path: Path, **kw: object) -> object:
    return replay(log, backend_for=_no_backend, work_dir=tmp_path / "work", pubkey=log / "audit-key.pub",
                  **kw)  # type: ignore[arg-type]


def test_a_tampered_log_is_refused_before_anything_runs(tmp_path: Path) -> None:
    log = _forge(tmp_path)
    lines = (log / "log.jsonl").read_text().splitlines(keepends=True)
    lines[5] = lines[5].replace('"speedup":2', '"speedup":9')
    (log / "log.jsonl").write_text("".join(lines))
    result = _replay(log, tmp_path)
    assert result.exit_code == Exit.LOG_UNVERIFIED
    assert "first bad seq" in result.checks[0].detail


def test_another_environment_is_an_error_unless_allowed(tmp_path: Path) -> None:
    env = {**describe_environment(), "vllm": "0.1.0", "cpu": "some other CPU"}
    log = _forge(tmp_path, environment=env)
    result = _replay(log, tmp_path)
    assert result.exit_code == Exit.ENV_DIFFERS
    assert "vllm: recorded '0.1.0'" in result.checks[-1].detail
    allowed = _replay(log, tmp_path, allow_env_drift=True)
    assert allowed.checks[1].ok and "allowed" in allowed.checks[1].detail
    assert allowed.exit_code == Exit.PATCH_FAILED       # it went on, to the (forged) base tree


def test_a_patch_that_no_longer_applies_exits_11(tmp_path: Path) -> None:
    base = Workspace.create(tmp_path / "probe", serving={}).tree_hash()
    diff = ("diff --git a/vllm/model_executor/models/gemma4.py b/vllm/model_executor/models/gemma4.py\n"
            "--- a/vllm/model_executor/models/gemma4.py\n+++ b/vllm/model_executor/models/gemma4.py\n"
            "@@ -1,1 +1,1 @@\n-this line is not in the file\n+nor this one\n")
    log = _forge(tmp_path, base_tree=base, diff=diff)
    result = _replay(log, tmp_path)
    assert result.exit_code == Exit.PATCH_FAILED
    assert "patch of iteration 1 applies" in [c.name for c in result.checks]


def test_reports_are_junit_and_markdown(tmp_path: Path) -> None:
    log = _forge(tmp_path, environment={**describe_environment(), "torch": "0"})
    result = _replay(log, tmp_path)
    write_junit(result, tmp_path / "j.xml")
    write_summary(result, tmp_path / "s.md")
    xml = (tmp_path / "j.xml").read_text()
    assert 'failures="1"' in xml and "<failure" in xml and 'name="environment matches"' in xml
    assert "ENV_DIFFERS" in (tmp_path / "s.md").read_text()


def test_a_missing_log_folder_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "replay", str(tmp_path / "nope")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "holds no log.jsonl" in proc.stderr


def _claim() -> Claim:
    # the committed demo's iteration 1: a 2.53x geo-mean of a slow prefill cell and a fast decode cell
    return Claim(iteration=1, diff="", tree="t", ratio=2.533, low=1.849, high=4.819, hypothesis="",
                 cells={"in128/out1": {"ratio": 1.407, "low": 1.215, "high": 2.986, "n": 3},
                        "in128/out32": {"ratio": 4.560, "low": 2.507, "high": 7.775, "n": 3}})


def test_a_replay_of_some_cells_is_judged_against_those_cells_not_the_grids_geo_mean() -> None:
    fast = SpeedupCI(5.338, 5.305, 5.379, 3)           # what CI measured on in128/out32 alone
    ok, detail = speedup_holds(_claim(), fast, {"in128/out32": fast}, 0.05)
    assert ok and "in128/out32: replayed 5.338x" in detail and "recorded 4.560x" in detail
    gone = SpeedupCI(1.01, 0.99, 1.03, 3)
    ok, detail = speedup_holds(_claim(), gone, {"in128/out32": gone}, 0.05)
    assert not ok and "(disagrees)" in detail
    ok, detail = speedup_holds(_claim(), fast, {"in999/out32": fast}, 0.05)
    assert not ok and "not a cell of the campaign's grid" in detail
    inflated = dataclasses.replace(_claim(), ratio=9.0, low=8.5, high=9.5)   # the headline forged, not the cells
    ok, detail = speedup_holds(inflated, fast, {"in128/out32": fast}, 0.05)
    assert not ok and "recorded 9.000x [8.500, 9.500] is not the geo-mean of its recorded cells (2.533x)" in detail


def test_a_replay_of_the_whole_grid_is_judged_on_the_geo_mean() -> None:
    cells = {"in128/out1": SpeedupCI(1.2, 1.1, 1.3, 3), "in128/out32": SpeedupCI(5.3, 5.2, 5.4, 3)}
    ok, detail = speedup_holds(_claim(), SpeedupCI(2.5, 2.4, 2.6, 3), cells, 0.05)
    assert ok and "recorded 2.533x [1.849, 4.819]" in detail
    ok, _ = speedup_holds(_claim(), SpeedupCI(1.0, 0.98, 1.02, 3), cells, 0.05)
    assert not ok


def _small_claim(ratio: float, low: float, high: float) -> Claim:
    return Claim(iteration=1, diff="", tree="t", ratio=ratio, low=low, high=high, hypothesis="",
                 cells={"in128/out32": {"ratio": ratio, "low": low, "high": high, "n": 4}})


def test_a_replay_whose_gain_vanished_fails_though_the_intervals_touch() -> None:
    """Recorded 1.05x [1.021, 1.080], replayed 0.985x [0.975, 0.995]: the 5 % tolerance makes the intervals
    overlap, which used to pass; the replayed lower bound is below 1.0, so the gain is gone."""
    claim = _small_claim(1.050, 1.021, 1.080)
    gone = SpeedupCI(0.985, 0.975, 0.995, 4)
    ok, detail = speedup_holds(claim, gone, {"in128/out32": gone}, 0.05)
    assert not ok and "below 1.0: no gain shown" in detail
    dropped = SpeedupCI(0.98, 0.95, 1.01, 4)                    # recorded 1.05x, replayed 0.98x
    assert not speedup_holds(claim, dropped, {"in128/out32": dropped}, 0.05)[0]


def test_a_replay_whose_gain_shrank_outside_the_claim_fails() -> None:
    claim = _small_claim(1.30, 1.25, 1.35)
    shrunk = SpeedupCI(1.08, 1.04, 1.12, 4)                     # still a gain, but not the one claimed
    ok, detail = speedup_holds(claim, shrunk, {"in128/out32": shrunk}, 0.05)
    assert not ok and "disagrees" in detail and "no gain shown" not in detail


def test_a_replay_that_shows_the_claimed_gain_holds() -> None:
    claim = _small_claim(1.050, 1.021, 1.080)
    again = SpeedupCI(1.04, 1.01, 1.07, 4)
    assert speedup_holds(claim, again, {"in128/out32": again}, 0.05)[0]


def test_replay_refuses_too_few_repeats_before_it_starts() -> None:
    (log,) = (ROOT / "experiments" / "results" / "replay-demo").iterdir()
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "replay", str(log), "--repeats", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "set repeats: 4" in " ".join(proc.stderr.split()), proc.stderr[-2000:]
