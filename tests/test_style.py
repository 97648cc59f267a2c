"""House rules that a reviewer should not have to check by hand: lint clean, strict types on the leaves."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_finds_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_policies_and_audit_pass_mypy_strict() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "policies", "audit"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
