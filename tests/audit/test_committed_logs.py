"""Every audit log committed under experiments/results verifies, each decision re-decided under a policy
ratchet shipped: changing a shipped policy must keep its old text in policies/history/."""

from __future__ import annotations

import tarfile
from pathlib import Path

from audit import verify
from policies import load_policy, redecider
from policies.known import known_policies
from tests.conftest import ROOT

RESULTS = ROOT / "experiments" / "results"


def _logs(tmp: Path) -> list[Path]:
    logs = [p.parent for p in RESULTS.glob("*/*/log.jsonl")]
    for archive in sorted(RESULTS.glob("*-log.tgz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / archive.stem, filter="data")
        logs += [p.parent for p in (tmp / archive.stem).rglob("log.jsonl")]
    return logs


def test_committed_logs_verify_under_known_policies(tmp_path: Path) -> None:
    logs = _logs(tmp_path)
    assert len(logs) >= 3                      # the replay demo, the H200 kernel and serving campaigns
    redecide = redecider(known_policies())
    for log in logs:
        result = verify(log, redecide=redecide)
        assert result.ok, f"{log}: {result.reason}"


def test_without_the_old_policy_the_replay_demo_log_is_refused(tmp_path: Path) -> None:
    """What CI hit when default.yaml changed and its old text was not kept: the check can fail."""
    (log,) = [p for p in _logs(tmp_path) if p.name.startswith("replay-demo")]
    result = verify(log, redecide=redecider([load_policy(ROOT / "policies" / "default.yaml")]))
    assert not result.ok and "matches no known policy" in result.reason
