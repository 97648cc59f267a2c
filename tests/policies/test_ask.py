"""Resolving ask: CI denies, an approvals file allows by digest, a TTY prompt decides, else deny."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies import (
    Ledger,
    Policy,
    action_digest,
    decide,
    load_approvals,
    parse_action,
    policy_sha256,
    resolve_ask,
)
from policies.errors import ApprovalsError

LAYER_WRITE = '{"kind": "write_file", "path": "vllm/model_executor/layers/layernorm.py"}'


def _asked(policy: Policy) -> tuple[object, object]:
    action = parse_action(LAYER_WRITE)
    decision = decide(policy, action, Ledger())
    assert (decision.verdict, decision.rule) == ("ask", "ask-layers")
    return action, decision


def test_ask_under_ci_is_a_deny_even_with_an_approval(ask_policy: Policy, tmp_path: Path) -> None:
    action, decision = _asked(ask_policy)
    approvals = tmp_path / "approvals.json"
    approvals.write_text(json.dumps({"schema_version": 1, "approved": [{"digest": action_digest(action)}]}))
    resolved = resolve_ask(
        decision,
        action,
        policy_sha256=policy_sha256(ask_policy),
        env={"CI": "true"},  # type: ignore[arg-type]
        approvals=load_approvals(approvals),
        prompt=lambda _: "y",
    )
    assert resolved.verdict == "deny"


def test_an_approvals_file_allows_the_listed_digest_only(ask_policy: Policy, tmp_path: Path) -> None:
    action, decision = _asked(ask_policy)
    digest = action_digest(action)  # type: ignore[arg-type]
    approvals = tmp_path / "approvals.yaml"
    approvals.write_text(f"schema_version: 1\napproved:\n  - digest: {digest}\n    note: reviewed by ana\n")
    sha = policy_sha256(ask_policy)
    allowed = resolve_ask(decision, action, policy_sha256=sha, env={}, approvals=load_approvals(approvals))  # type: ignore[arg-type]
    assert allowed.verdict == "allow"
    other = parse_action('{"kind": "write_file", "path": "vllm/model_executor/layers/linear.py"}')
    other_decision = decide(ask_policy, other, Ledger())
    denied = resolve_ask(
        other_decision, other, policy_sha256=sha, env={}, approvals=load_approvals(approvals)
    )
    assert denied.verdict == "deny"


def test_an_approval_bound_to_another_policy_does_not_apply(ask_policy: Policy, tmp_path: Path) -> None:
    action, decision = _asked(ask_policy)
    approvals = tmp_path / "approvals.json"
    entry = {"digest": action_digest(action), "policy_sha256": "0" * 64}  # type: ignore[arg-type]
    approvals.write_text(json.dumps({"schema_version": 1, "approved": [entry]}))
    resolved = resolve_ask(
        decision,
        action,
        policy_sha256=policy_sha256(ask_policy),
        env={},  # type: ignore[arg-type]
        approvals=load_approvals(approvals),
    )
    assert resolved.verdict == "deny"


@pytest.mark.parametrize(
    ("answer", "verdict"), [("y\n", "allow"), ("yes\n", "allow"), ("\n", "deny"), ("n\n", "deny")]
)
def test_a_tty_answer_decides(ask_policy: Policy, answer: str, verdict: str) -> None:
    action, decision = _asked(ask_policy)
    questions: list[str] = []

    def prompt(question: str) -> str:
        questions.append(question)
        return answer

    resolved = resolve_ask(decision, action, policy_sha256="x", env={}, prompt=prompt)  # type: ignore[arg-type]
    assert resolved.verdict == verdict
    assert "digest" in questions[0]


def test_ask_without_tty_or_approval_is_a_deny(ask_policy: Policy) -> None:
    action, decision = _asked(ask_policy)
    assert resolve_ask(decision, action, policy_sha256="x", env={}).verdict == "deny"  # type: ignore[arg-type]


def test_allow_and_deny_pass_through_unchanged(default_policy: Policy) -> None:
    action = parse_action(LAYER_WRITE)
    decision = decide(default_policy, action, Ledger())
    assert resolve_ask(decision, action, policy_sha256="x", env={"CI": "1"}) == decision


def test_a_malformed_approvals_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("schema_version: 1\napproved: [{digest: nothex}]\n")
    with pytest.raises(ApprovalsError, match="approved.0.digest"):
        load_approvals(path)


def test_the_digest_ignores_the_action_id_but_not_its_content() -> None:
    first = parse_action('{"kind": "network", "host": "huggingface.co", "port": 443, "id": "it1.a3"}')
    second = parse_action('{"kind": "network", "host": "huggingface.co", "port": 443, "id": "it9.a1"}')
    third = parse_action('{"kind": "network", "host": "huggingface.co", "port": 80}')
    assert action_digest(first) == action_digest(second) != action_digest(third)
