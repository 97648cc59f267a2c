"""`ratchet policy check|hash|digest` through argparse, with real files (exit codes documented)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agent.commands import policy as policy_command

POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ratchet")
    sub = parser.add_subparsers(dest="command", required=True)
    policy_command.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _action(tmp_path: Path, action: dict[str, object]) -> str:
    path = tmp_path / "action.json"
    path.write_text(json.dumps(action))
    return str(path)


@pytest.mark.parametrize(
    ("policy", "action", "code", "verdict"),
    [
        ("default.yaml", {"kind": "read_file", "path": "vllm/config.py"}, 0, "allow"),
        ("default.yaml", {"kind": "write_file", "path": "tests/x.py"}, 1, "deny"),
        ("default.yaml", {"kind": "run_command", "argv": ["bash", "-c", "id"]}, 1, "deny"),
        ("default.yaml", {"kind": "teleport"}, 1, "deny"),
        ("default.yaml", {"kind": "read_file", "path": "a", "extra": 1}, 1, "deny"),
        ("ask-example.yaml", {"kind": "network", "host": "huggingface.co", "port": 443}, 3, "ask"),
    ],
)
def test_check_prints_the_decision_and_exits_with_its_code(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    policy: str,
    action: dict[str, object],
    code: int,
    verdict: str,
) -> None:
    assert _main(["policy", "check", str(POLICY_DIR / policy), _action(tmp_path, action)]) == code
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"decision", "rule", "reason"}
    assert printed["decision"] == verdict


def test_check_resolves_ask_to_deny_under_ci(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    action = _action(tmp_path, {"kind": "network", "host": "huggingface.co", "port": 443})
    assert _main(["policy", "check", "--resolve", str(POLICY_DIR / "ask-example.yaml"), action]) == 1


def test_check_with_root_denies_writes_through_symlinks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ws"
    (root / "vllm/model_executor").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "vllm/model_executor/layers").symlink_to(root / "tests")
    action = _action(tmp_path, {"kind": "write_file", "path": "vllm/model_executor/layers/x.py"})
    assert _main(["policy", "check", "--root", str(root), str(POLICY_DIR / "default.yaml"), action]) == 1
    assert json.loads(capsys.readouterr().out)["rule"] == "builtin-symlink"


def test_check_with_a_ledger_denies_over_budget(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"spent": {"llm_usd": 49.9}}))
    action = _action(tmp_path, {"kind": "spend", "resource": "llm_usd", "amount": 1})
    assert _main(["policy", "check", "--ledger", str(ledger), str(POLICY_DIR / "default.yaml"), action]) == 1


def test_an_invalid_policy_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: x\nbogus: 1\n")
    assert _main(["policy", "check", str(bad), _action(tmp_path, {"kind": "read_file", "path": "a"})]) == 4
    assert "bogus" in capsys.readouterr().err


def test_hash_and_digest_print_hex(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["policy", "hash", str(POLICY_DIR / "default.yaml")]) == 0
    assert _main(["policy", "digest", _action(tmp_path, {"kind": "read_file", "path": "a"})]) == 0
    first, second = capsys.readouterr().out.split()
    assert len(first) == len(second) == 64
