"""The `ratchet` command line. Each sub-command lives in agent/commands/<name>.py and exposes
`register(subparsers)`; the contract (names, flags, exit codes) is in ../shared/DESIGN.md."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

__all__ = ["main"]

# Order is the order shown in --help.
_COMMAND_MODULES = ("run", "kernel", "resume", "replay", "measure", "parity", "profile", "compare", "claim", "policy",
                    "audit", "export", "sandbox", "bundle")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratchet",
        description="Audited, policy-gated optimization campaigns for LLM serving (vLLM Gemma 4).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"agent.commands.{name}")
        module.register(sub)
    return parser


def _stop_on_terminate() -> None:
    """SIGTERM (a scheduler, `docker stop`, `kill`) and SIGINT stop a command the way Ctrl-C does: servers
    stopped, the audit log checkpointed. A shell starts background jobs with SIGINT ignored; undo that."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    _stop_on_terminate()
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
