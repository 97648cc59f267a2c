"""`ratchet replay DIR`: CI re-verification of a campaign's accepted patches.

Exit codes: 0 every claim holds; 10 the log does not verify; 11 a patch does not apply (or rebuilds a
different tree); 12 parity broken; 13 a speedup is gone (replayed CI does not overlap the recorded one);
14 the environment differs (vLLM/torch/Python/hardware; allowed with --allow-env-drift);
2 bad input (missing or partial log folder); 3 the harness failed (server did not start...).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from agent.commands._common import cli_errors, console, err_console, make_backend
from agent.replay import Exit, replay, to_json, write_junit, write_summary
from harness.stats import check_repeats

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("replay", help="re-verify a campaign's accepted patches (for CI)")
    p.add_argument("dir", help="the campaign's log folder (audit_logs/<campaign-id>)")
    p.add_argument("--pubkey", help="trusted public key of the campaign's signer (default: the log's own)")
    p.add_argument("--cells", help="comma-separated cell labels to re-measure, e.g. in512/out64,in512/out1")
    p.add_argument("--repeats", type=int, default=4, help="interleaved pairs per cell (even, at least 4; default 4)")
    p.add_argument("--tolerance", type=float, default=0.05, help="relative widening of the recorded CI")
    p.add_argument("--allow-env-drift", action="store_true", help="replay on other vLLM/torch/hardware anyway")
    p.add_argument("--work-dir", help="where the clean workspace goes (default: a temporary folder)")
    p.add_argument("--junit", help="write JUnit XML here (default: .ratchet/replay/<campaign>/junit.xml)")
    p.add_argument("--summary", help="write a markdown summary here (default: .ratchet/replay/<campaign>/summary.md)")
    p.set_defaults(func=run)


@cli_errors
def run(args: argparse.Namespace) -> int:
    log_dir = Path(args.dir)
    if not (log_dir / "log.jsonl").is_file():
        err_console.print(f"[red]error:[/red] {log_dir} holds no log.jsonl; pass audit_logs/<campaign-id>")
        return int(Exit.USAGE)
    try:
        check_repeats(args.repeats)
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] --repeats: {exc}")
        return int(Exit.USAGE)
    cells = [c.strip() for c in args.cells.split(",")] if args.cells else None
    with tempfile.TemporaryDirectory(prefix="ratchet-replay-") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        result = replay(log_dir, backend_for=make_backend, work_dir=work,
                        pubkey=Path(args.pubkey) if args.pubkey else None, cells=cells, repeats=args.repeats,
                        tolerance=args.tolerance, allow_env_drift=args.allow_env_drift,
                        progress=lambda msg: err_console.print(msg, highlight=False))
    out = Path(".ratchet") / "replay" / log_dir.resolve().name
    out.mkdir(parents=True, exist_ok=True)
    junit = Path(args.junit) if args.junit else out / "junit.xml"
    summary = Path(args.summary) if args.summary else out / "summary.md"
    write_junit(result, junit)
    write_summary(result, summary)
    console.print(to_json(result))
    console.print(f"exit {int(result.exit_code)} ({result.exit_code.name}); junit: {junit}; summary: {summary}")
    return int(result.exit_code)
