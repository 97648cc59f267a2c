"""`ratchet policy check POLICY ACTION.json` (+ `policy hash`, `policy digest`).

Exit codes of `check`: 0 allow, 1 deny, 3 ask (2 is argparse's usage error), 4 the policy (or
ledger/approvals file) cannot be loaded. An action JSON that fails its schema is a deny (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from policies import (
    Decision,
    FsWorkspace,
    Ledger,
    PolicyError,
    action_digest,
    decide,
    load_approvals,
    load_policy,
    parse_action,
    policy_sha256,
    resolve_ask,
    tty_prompt,
)
from policies.errors import ActionError

__all__ = ["EXIT_ALLOW", "EXIT_ASK", "EXIT_DENY", "EXIT_UNUSABLE", "register"]

EXIT_ALLOW, EXIT_DENY, EXIT_ASK, EXIT_UNUSABLE = 0, 1, 3, 4
_EXIT = {"allow": EXIT_ALLOW, "deny": EXIT_DENY, "ask": EXIT_ASK}


def _ledger(path: Path | None, root: Path | None) -> Ledger:
    data: dict[str, Any] = {}
    if path is not None:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or set(data) - {"spent", "gpus_in_use"}:
            raise PolicyError(f"{path}: a ledger is {{'spent': {{resource: amount}}, 'gpus_in_use': n}}")
    spent = {str(k): float(v) for k, v in dict(data.get("spent", {})).items()}
    workspace = FsWorkspace(root.resolve()) if root is not None else None
    return Ledger(spent=spent, gpus_in_use=int(data.get("gpus_in_use", 0)), workspace=workspace)


def _print(decision: Decision) -> int:
    print(json.dumps(decision.as_json(), sort_keys=True))
    return _EXIT[decision.verdict]


def _check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
        ledger = _ledger(args.ledger, args.root)
        approvals = load_approvals(args.approvals) if args.approvals else None
    except (PolicyError, OSError, ValueError) as error:
        print(f"ratchet policy check: {error}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        action = parse_action(args.action.read_bytes(), where=str(args.action))
    except (ActionError, OSError) as error:
        return _print(Decision("deny", "builtin-action", f"action rejected: {error}"))
    decision = decide(policy, action, ledger)
    if args.resolve:
        decision = resolve_ask(
            decision,
            action,
            policy_sha256=policy_sha256(policy),
            env=os.environ,
            approvals=approvals,
            prompt=tty_prompt(),
        )
    return _print(decision)


def _hash(args: argparse.Namespace) -> int:
    try:
        print(policy_sha256(load_policy(args.policy)))
    except PolicyError as error:
        print(f"ratchet policy hash: {error}", file=sys.stderr)
        return EXIT_UNUSABLE
    return 0


def _digest(args: argparse.Namespace) -> int:
    try:
        print(action_digest(parse_action(args.action.read_bytes(), where=str(args.action))))
    except (ActionError, OSError) as error:
        print(f"ratchet policy digest: {error}", file=sys.stderr)
        return EXIT_DENY
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("policy", help="check actions against a policy file")
    sub = parser.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    check = sub.add_parser(
        "check",
        help="decide one action: prints {decision, rule, reason}; exit 0 allow, 1 deny, 3 ask, 4 bad policy",
    )
    check.add_argument("policy", type=Path, metavar="POLICY")
    check.add_argument("action", type=Path, metavar="ACTION.json")
    check.add_argument("--root", type=Path, help="workspace root: enables the symlink check")
    check.add_argument("--ledger", type=Path, help="JSON {spent: {resource: amount}, gpus_in_use: n}")
    check.add_argument(
        "--resolve", action="store_true", help="resolve ask (CI -> deny, approvals, TTY prompt)"
    )
    check.add_argument("--approvals", type=Path, help="approvals file (YAML/JSON) used with --resolve")
    check.set_defaults(func=_check)
    hash_ = sub.add_parser("hash", help="print the policy's sha256 (as recorded in the audit log)")
    hash_.add_argument("policy", type=Path, metavar="POLICY")
    hash_.set_defaults(func=_hash)
    digest = sub.add_parser("digest", help="print an action's digest (what an approvals file lists)")
    digest.add_argument("action", type=Path, metavar="ACTION.json")
    digest.set_defaults(func=_digest)
