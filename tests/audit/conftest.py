"""Fixtures for audit tests: a real campaign-like log written by the real writer and the real gate,
and an attacker's rewrite (re-chain, re-sign with any key) to prove what verify catches."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from audit import AuditWriter
from audit.canon import genesis, sha256_hex
from audit.keys import (
    PUBKEY_NAME,
    key_id,
    load_or_create_key,
    public_pem,
    sign,
    signed_message,
)
from policies import Ledger, action_payload, decide, load_policy, parse_action, policy_sha256

POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"

ACTIONS = [
    {"kind": "read_file", "path": "vllm/model_executor/models/gemma4.py"},
    {"kind": "write_file", "path": "tests/test_parity.py"},
    {"kind": "run_command", "argv": ["bash", "-c", "pip install x"]},
    {"kind": "write_file", "path": "vllm/model_executor/layers/layernorm.py"},
    {"kind": "network", "host": "example.com", "port": 443},
    {"kind": "spend", "resource": "llm_tokens", "amount": 1000},
]


@dataclass(frozen=True)
class LogSetup:
    dir: Path
    key: Path
    anchors: Path
    campaign: str

    @property
    def anchor(self) -> Path:
        return self.anchors / f"{self.campaign}.json"


def write_campaign(setup: LogSetup, *, iterations: int = 3, policy_name: str = "default.yaml") -> None:
    """A small campaign: per iteration, every action in ACTIONS decided and recorded, then a result."""
    policy = load_policy(POLICY_DIR / policy_name)
    sha = policy_sha256(policy)
    with AuditWriter.open(
        setup.dir, campaign=setup.campaign, key_path=setup.key, anchor_dir=setup.anchors
    ) as log:
        log.append("campaign.spec", payload={"spec": "experiments/gemma4-tiny-cpu.yaml"}, policy_sha256=sha)
        for iteration in range(iterations):
            for number, raw in enumerate(ACTIONS):
                action = parse_action(json.dumps(raw))
                ledger = Ledger(spent={"llm_tokens": 1000.0 * iteration})
                decision = decide(policy, action, ledger)
                log.append(
                    "action",
                    iteration=iteration,
                    action_id=f"{iteration}.{number}",
                    payload=action_payload(action, ledger, decision=decision),
                    decision=decision.verdict,
                    rule=decision.rule,
                    policy_sha256=sha,
                )
            log.append(
                "iteration.result",
                iteration=iteration,
                payload={
                    "accepted": iteration % 2 == 1,
                    "parity_ok": iteration != 2,
                    "throughput_tok_s": 100.0 + 7 * iteration,
                    "incumbent_tok_s": 100.0,
                    "speedup": 1.0 + 0.07 * iteration,
                    "ci_low": 1.0 + 0.05 * iteration,
                    "ci_high": 1.0 + 0.09 * iteration,
                    "reason": f"iteration {iteration}",
                },
            )
            if iteration == 0:
                log.checkpoint()


def lines_of(directory: Path) -> list[bytes]:
    return (directory / "log.jsonl").read_bytes().splitlines(keepends=True)


def records_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines_of(directory)]


def write_lines(directory: Path, lines: list[bytes]) -> None:
    (directory / "log.jsonl").write_bytes(b"".join(lines))


def rewrite(directory: Path, records: list[dict[str, Any]], *, key_path: Path) -> None:
    """What an attacker with write access and `key_path` can do: renumber, re-chain, re-sign."""
    key = load_or_create_key(key_path)
    prev = genesis(records[0]["campaign"])
    out: list[bytes] = []
    for seq, record in enumerate(records):
        record = dict(record, seq=seq, prev=prev)
        if record["kind"] == "checkpoint":
            message = signed_message(
                purpose="checkpoint", campaign=record["campaign"], seq=seq - 1, sha256=prev
            )
            record["payload"] = {
                "covers_seq": seq - 1,
                "covers_sha256": prev,
                "key_id": key_id(key.public_key()),
                "signature": sign(key, message),
            }
        line = rfc8785.dumps(record) + b"\n"
        out.append(line)
        prev = sha256_hex(line)
    write_lines(directory, out)
    (directory / PUBKEY_NAME).write_bytes(public_pem(key.public_key()))


@pytest.fixture(autouse=True)
def _hermetic_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch ~/.config/ratchet: the default key and anchors live under tmp_path."""
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "default-home" / "audit-key.ed25519"))


@pytest.fixture
def setup(tmp_path: Path) -> LogSetup:
    return LogSetup(
        dir=tmp_path / "audit_logs" / "c1",
        key=tmp_path / "home" / "audit-key.ed25519",
        anchors=tmp_path / "home" / "anchors",
        campaign="c1",
    )


@pytest.fixture
def campaign(setup: LogSetup) -> LogSetup:
    write_campaign(setup)
    return setup


@pytest.fixture
def tools() -> dict[str, Callable[..., Any]]:
    return {
        "lines": lines_of,
        "records": records_of,
        "write": write_lines,
        "rewrite": rewrite,
        "campaign": write_campaign,
    }


RUN1_ARCHIVE = Path(__file__).resolve().parents[2] / "experiments" / "results" / "main-job-run1-log.tgz"


def unpack_run1(dest: Path) -> Path:
    """The log of a real campaign (the README's main job, run 1: iteration 3 accepted, a final comparison)."""
    import tarfile

    with tarfile.open(RUN1_ARCHIVE) as tar:
        tar.extractall(dest, filter="data")
    (log,) = dest.glob("gemma4-tiny-cpu-*")
    return log
