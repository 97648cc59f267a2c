"""Policy files: strict schema with field paths, duplicate keys, hashes; the shipped files load."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import load_policy, policy_sha256
from policies.errors import PolicyLoadError

POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"
MINIMAL = "schema_version: 1\nname: t\n"


@pytest.mark.parametrize("name", ["default.yaml", "strict.yaml", "ask-example.yaml", "multimodal.yaml"])
def test_shipped_policies_load(name: str) -> None:
    policy = load_policy(POLICY_DIR / name)
    assert len(policy_sha256(policy)) == 64


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    load_policy(path)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (MINIMAL + "surprise: 1\n", "surprise"),
        (MINIMAL + "gpu: {max_devices: 1, max_gpus: 3}\n", "gpu.max_gpus"),
        (MINIMAL + "gpu: {max_devices: '1'}\n", "gpu.max_devices"),
        (MINIMAL + "paths: [{id: a, effect: allow, ops: [write], globs: [x], extra: 1}]\n", "paths.0.extra"),
        (MINIMAL + "paths: [{id: a, effect: maybe, ops: [write], globs: [x]}]\n", "paths.0.effect"),
        (MINIMAL + "content: [{id: a, pattern: '(unclosed'}]\n", "content.0.pattern"),
        (MINIMAL + "budget: {llm_tokens: 10, dollars: 3}\n", "budget.dollars"),
        ("schema_version: 2\nname: t\n", "schema_version"),
        ("name: t\n", "schema_version"),
        (MINIMAL + "network: [{id: a, effect: allow, host: h, ports: [70000]}]\n", "network.0.ports.0"),
    ],
)
def test_invalid_policies_are_rejected_with_the_field_path(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(PolicyLoadError) as caught:
        _load(tmp_path, text)
    assert where in str(caught.value)
    assert "p.yaml" in str(caught.value)


def test_duplicate_yaml_keys_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="duplicate key"):
        _load(tmp_path, MINIMAL + "gpu: {max_devices: 0}\ngpu: {max_devices: 8}\n")


def test_duplicate_rule_ids_are_rejected(tmp_path: Path) -> None:
    rule = "{id: a, effect: allow, ops: [read], globs: [x]}"
    with pytest.raises(PolicyLoadError, match="used twice"):
        _load(tmp_path, MINIMAL + f"paths: [{rule}, {rule}]\n")


def test_a_missing_policy_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")


def test_the_policy_hash_is_stable_and_changes_with_the_policy(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    second = tmp_path / "b.yaml"
    first.write_text(MINIMAL + "gpu: {max_devices: 1}\n")
    second.write_text("# same policy, other spelling\nname: t\nschema_version: 1\ngpu:\n  max_devices: 1\n")
    assert policy_sha256(load_policy(first)) == policy_sha256(load_policy(second))
    second.write_text(MINIMAL + "gpu: {max_devices: 2}\n")
    assert policy_sha256(load_policy(first)) != policy_sha256(load_policy(second))


def test_an_empty_policy_denies_everything(tmp_path: Path) -> None:
    from policies import Ledger, decide, parse_action

    path = tmp_path / "empty.yaml"
    path.write_text(MINIMAL)
    policy = load_policy(path)
    for action in (
        '{"kind": "read_file", "path": "a.py"}',
        '{"kind": "run_command", "argv": ["git", "status"]}',
        '{"kind": "network", "host": "127.0.0.1", "port": 8000}',
        '{"kind": "use_gpu", "devices": 1, "minutes": 1}',
        '{"kind": "spend", "resource": "llm_tokens", "amount": 1}',
    ):
        assert decide(policy, parse_action(action), Ledger()).verdict == "deny"
