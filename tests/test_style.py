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


def test_a_campaign_measures_only_through_the_measurements_seam() -> None:
    """agent/measurements.py is the one door to the harness's measuring functions for campaigns (a fake
    replaces it in the unit suite); the stand-alone commands (agent/commands/) call the harness directly."""
    import ast

    measuring = {"ab_compare", "measure_grid", "profile_cell", "effective_engine_args", "digest_roots",
                 "run_evaluation", "served_ceilings", "measure_ceilings"}
    offenders = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "commands" or rel.name == "measurements.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & measuring:
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders
