"""Replay against real vLLM: the committed campaign's claims hold, and a log that accepts a parity-breaking
patch fails with its own exit code. The lying log is validly signed (as a compromised or buggy campaign runner
would write it): only re-measurement can catch it. A log that lies about a speedup is caught the same way
(exit SPEEDUP_GONE): that verdict is tested through the fake measurement seam
(tests/agent/test_fake_campaign.py) and its rule on recorded figures in tests/agent/test_replay.py, while the
committed campaign's replay above is the real re-measurement."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.replay import Exit
from audit import AuditWriter
from audit.reader import payload_of, read_records
from sandbox.workspace import Workspace
from tests.conftest import ROOT, TINY_MODEL

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
COMMITTED = ROOT / "experiments" / "results" / "replay-demo"


def _committed_log() -> Path:
    logs = sorted(p.parent for p in COMMITTED.glob("*/log.jsonl"))
    assert logs, f"no committed campaign under {COMMITTED}; run experiments/replay_demo.sh"
    return logs[-1]


def _replay(log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "replay", str(log), "--cells", "in128/out32",
                           "--repeats", "4", "--allow-env-drift", *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)


def _relog(source: Path, dest: Path, key_dir: Path, edit: Any) -> Path:
    """Rewrite a campaign's claims into a new, validly signed log; `edit(kind, payload)` may change them."""
    records = read_records(source)
    campaign = str(records[0]["campaign"])
    keep = ("campaign.start", "baseline.result", "iteration.hypothesis", "iteration.patch", "iteration.result")
    with AuditWriter.open(dest, campaign=campaign, key_path=key_dir / "key", anchor_dir=key_dir / "anchors") as w:
        for record in records:
            if record["kind"] in keep:
                w.append(record["kind"], iteration=record.get("iteration"),
                         payload=edit(record["kind"], payload_of(source, record)))
    shutil.copy(source / "parity-reference.json", dest / "parity-reference.json")
    return dest


def test_the_committed_campaign_replays(tmp_path: Path) -> None:
    log = _committed_log()
    proc = _replay(log, "--pubkey", str(log / "audit-key.pub"), "--junit", str(tmp_path / "j.xml"),
                   "--summary", str(tmp_path / "s.md"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'failures="0"' in (tmp_path / "j.xml").read_text()


def test_an_accepted_patch_that_breaks_parity_is_caught(tmp_path: Path) -> None:
    planted = (TINY_MODEL / "planted" / "ple-scale-changed.patch").read_text()
    source = _committed_log()
    first = next(int(r["iteration"]) for r in read_records(source)
                 if r["kind"] == "iteration.result" and payload_of(source, r).get("accepted"))
    start = payload_of(source, next(r for r in read_records(source) if r["kind"] == "campaign.start"))
    probe = Workspace.create(tmp_path / "probe", serving=dict(start["spec"]["server"]["engine_args"]))
    probe.apply_patch(planted)
    tree = probe.repo.git.write_tree()

    def plant(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if kind == "iteration.patch" and body.get("base") == start["base_commit"]:
            return {**body, "diff": planted}
        if kind == "iteration.result" and body.get("accepted"):
            return {**body, "tree": tree}
        return body

    log = _relog(source, tmp_path / "log", tmp_path, plant)
    proc = _replay(log, "--pubkey", str(log / "audit-key.pub"))
    assert proc.returncode == Exit.PARITY_BROKEN, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"parity of iteration {first}" in proc.stdout and "real divergence" in proc.stdout
