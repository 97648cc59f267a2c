"""`ratchet audit verify|show|report` through argparse: exit codes and printed lines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from agent.commands import audit as audit_command


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ratchet")
    sub = parser.add_subparsers(dest="command", required=True)
    audit_command.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_verify_prints_verified_n_records(campaign: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = _main(
        [
            "audit",
            "verify",
            str(campaign.dir),
            "--pubkey",
            str(campaign.key),
            "--anchor",
            str(campaign.anchor),
        ]
    )
    assert (code, capsys.readouterr().out) == (0, "verified 25 records\n")


def test_verify_prints_the_first_bad_seq(
    campaign: Any, tools: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tools["lines"](campaign.dir)
    lines[3] = lines[3].replace(b'"decision":"deny"', b'"decision":"allow"')
    tools["write"](campaign.dir, lines)
    assert _main(["audit", "verify", str(campaign.dir)]) == 1
    assert capsys.readouterr().out.startswith("FAILED at seq 3: ")


def test_verify_uses_the_default_anchor_next_to_the_key(
    campaign: Any, tools: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(campaign.key))
    records = tools["records"](campaign.dir)
    first = next(i for i, r in enumerate(records) if r["kind"] == "checkpoint")
    tools["write"](campaign.dir, tools["lines"](campaign.dir)[: first + 1])
    assert _main(["audit", "verify", str(campaign.dir)]) == 1
    assert "truncated" in capsys.readouterr().out
    assert _main(["audit", "verify", str(campaign.dir), "--no-anchor"]) == 0


def test_verify_rejects_decisions_under_an_unknown_policy(
    setup: Any, tools: dict[str, Any], tmp_path: Path
) -> None:
    forged = tmp_path / "forged.yaml"
    forged.write_text("schema_version: 1\nname: default\n")
    tools["campaign"](setup, iterations=1, policy_name=str(forged))
    assert _main(["audit", "verify", str(setup.dir), "--no-anchor"]) == 1
    assert _main(["audit", "verify", str(setup.dir), "--no-anchor", "--policy", str(forged)]) == 0
    assert _main(["audit", "verify", str(setup.dir), "--no-anchor", "--no-redecide"]) == 0


def test_show_and_report(campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["audit", "show", str(campaign.dir), "--last", "5"]) == 0
    assert _main(["audit", "report", str(campaign.dir), "--out", str(tmp_path / "r"), "--no-anchor"]) == 0
    assert (tmp_path / "r" / "report.html").is_file() and (tmp_path / "r" / "summary.md").is_file()
    assert _main(["audit", "show", str(tmp_path / "nothing")]) == 1
