"""agent/records.py owns the log's record kinds: what agent/ writes and what audit/ reads are all in it."""

from __future__ import annotations

import ast
import re

import pytest

from agent import records
from tests.conftest import ROOT

_KIND = re.compile(r"^[a-z]+(\.[a-z_]+)+$")
_AUDITS_OWN = {"log.open", "checkpoint", "recovery"}


def _append_literals(package: str) -> list[tuple[str, str]]:
    """(where, kind) of every `.append("...")` whose first argument is a string literal."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.args[0].value))
    return found


def test_agent_writes_no_record_kind_by_its_literal() -> None:
    literals = [(where, kind) for where, kind in _append_literals("agent")
                if _KIND.match(kind) or kind in ("action", "error")]
    assert not literals, literals


def test_every_kind_audit_reads_is_a_kind_agent_writes() -> None:
    named = set()
    for path in sorted((ROOT / "audit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) for c in node.comparators):
                for c in node.comparators:
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and _KIND.match(c.value):
                        named.add(c.value)
    assert named, "audit/ compares record kinds somewhere (the report, the MLflow export)"
    assert named - _AUDITS_OWN <= records.KINDS, sorted(named - _AUDITS_OWN - records.KINDS)


def test_an_unknown_note_kind_is_refused() -> None:
    assert records.note_kind("try_patch") == "agent.try_patch"
    with pytest.raises(ValueError, match="unknown note kind"):
        records.note_kind("llm.telepathy")
