"""`ratchet audit verify|show|report DIR`.

Exit codes: verify 0 "verified N records", 1 tampered/invalid (prints the first bad seq and reason),
4 a --policy/--pubkey file cannot be loaded; show 0, 1 when DIR has no log; report 0 written and the
log verifies, 1 written but verification failed, 4 unusable input. 2 is argparse's usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from audit import VerifyResult, anchor_path, default_anchor_dir, default_key_path, show, verify, write_report
from policies import Policy, PolicyError, redecider
from policies.known import known_policies

__all__ = ["register"]



def _campaign(directory: Path) -> str | None:
    try:
        with (directory / "log.jsonl").open("rb") as handle:
            first = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    campaign = first.get("campaign") if isinstance(first, dict) else None
    return campaign if isinstance(campaign, str) else None


def _anchor(args: argparse.Namespace) -> Path | None:
    if args.no_anchor:
        return None
    if args.anchor is not None:
        return Path(args.anchor)
    campaign = _campaign(args.dir)
    if campaign is None:
        return None
    default = anchor_path(default_anchor_dir(default_key_path()), campaign)
    return default if default.exists() else None


def _policies(extra: list[Path]) -> list[Policy]:
    return known_policies(extra)


def _verify_result(args: argparse.Namespace) -> VerifyResult:
    redecide = None if args.no_redecide else redecider(_policies(args.policy))
    anchor = _anchor(args)
    if anchor is not None:
        print(f"using head anchor {anchor}", file=sys.stderr)
    return verify(args.dir, pubkey=args.pubkey, redecide=redecide, anchor=anchor, expect_seq=args.expect_seq)


def _verify(args: argparse.Namespace) -> int:
    try:
        result = _verify_result(args)
    except PolicyError as error:
        print(f"ratchet audit verify: {error}", file=sys.stderr)
        return 4
    print(result.summary())
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if result.key_source:
        print(f"key: {result.key_source}", file=sys.stderr)
    return 0 if result.ok else 1


def _show(args: argparse.Namespace) -> int:
    if not (args.dir / "log.jsonl").is_file():
        print(f"ratchet audit show: no log.jsonl in {args.dir}", file=sys.stderr)
        return 1
    show(args.dir, last=args.last)
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        result = _verify_result(args)
    except PolicyError as error:
        print(f"ratchet audit report: {error}", file=sys.stderr)
        return 4
    html, markdown = write_report(args.dir, out_dir=args.out, verification=result)
    print(f"{result.summary()}\nwrote {html}\nwrote {markdown}")
    return 0 if result.ok else 1


def _verify_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, metavar="DIR")
    parser.add_argument("--pubkey", type=Path, help="trusted public key (PEM); default: the log's own copy")
    parser.add_argument("--anchor", type=Path, help="head anchor file (default: next to the signing key)")
    parser.add_argument("--no-anchor", action="store_true", help="do not use the default head anchor")
    parser.add_argument("--expect-seq", type=int, help="fail unless the log reaches this seq")
    parser.add_argument(
        "--policy", type=Path, action="append", default=[], help="extra policy file for re-decisions"
    )
    parser.add_argument("--no-redecide", action="store_true", help="skip re-deciding recorded decisions")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("audit", help="verify, show and report an audit log")
    sub = parser.add_subparsers(dest="audit_command", required=True, metavar="SUBCOMMAND")
    verify_p = sub.add_parser("verify", help='exit 0 and "verified N records", else 1 and the first bad seq')
    _verify_flags(verify_p)
    verify_p.set_defaults(func=_verify)
    show_p = sub.add_parser("show", help="timeline of a log in the terminal")
    show_p.add_argument("dir", type=Path, metavar="DIR")
    show_p.add_argument("--last", type=int, help="only the last N records")
    show_p.set_defaults(func=_show)
    report_p = sub.add_parser("report", help="write report.html (inline SVG) and summary.md")
    _verify_flags(report_p)
    report_p.add_argument("--out", type=Path, help="output folder (default: DIR)")
    report_p.set_defaults(func=_report)
