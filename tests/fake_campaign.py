"""A whole campaign without vLLM: a tiny vllm-source target, a spec, the search proposer, and the fake seam of
tests/fake_measurements.py. Used in-process by the unit tests, and as a child process by the crash tests:

    python -m tests.fake_campaign start SPEC LOG_ROOT WORKSPACES      a campaign to its end
    python -m tests.fake_campaign resume LOG_DIR [--wall-seconds S]   resume one

`--hold-s S` (before the command) keeps each measurement's fake servers up S seconds, so a test can kill what
runs one mid-A/B (tests/agent/test_ray_campaign.py kills a Ray worker).
In the child, `RATCHET_KILL_AT=NAME:N` SIGKILLs the process at the N-th call of one step (KILL_POINTS), and
`RATCHET_CALL_COUNTS=FILE` writes how often each step ran (for picking N).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.base import Proposer
from agent.campaign import CampaignEnd, resume_campaign, start_campaign
from agent.proposers.search import SearchProposer
from agent.spec import CampaignSpec, load_spec
from tests.conftest import TINY_MODEL
from tests.fake_measurements import FakeMeasurements

SERVING = {"max_num_seqs": 1, "enforce_eager": True}


def write_target(root: Path, *, space: str = "[4, 8, 16]", iterations: int = 3, extra: str = "",
                 search: str | None = None) -> Path:
    """A vllm-source checkout of three files, held prompts that cover the grid, and the spec; returns its path.
    `search` replaces the search proposer's settings (default: grid over max_num_seqs `space`)."""
    pkg = root / "src" / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model_executor" / "__init__.py").write_text("")
    (pkg / "model_executor" / "models" / "gemma4.py").write_text("# the fake Gemma 4 path\nSCALE = 1.0\n")
    prompts = root / "held.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"held-{i}", "prompt_token_ids": [5 + (i + j) % 200
                                                                                 for j in range(8 + i)]}) + "\n"
                               for i in range(6)))
    spec = root / "spec.yaml"
    spec.write_text(f"""
schema_version: 1
name: fake
server: {{model: {TINY_MODEL}, engine_args: {json.dumps(SERVING)}}}
benchmark: {{input_lens: [8], output_lens: [4], num_prompts: 8, max_concurrency: 4, repeats: 4}}
parity: {{prompts: {prompts}, max_tokens: 4}}
target: {{kind: vllm-source, source: {root / "src"}}}
sandbox: {{backend: unisolated}}
proposer: {{kind: search, search: {search or f"{{strategy: grid, space: {{max_num_seqs: {space}}}}}"}}}
budget: {{max_iterations: {iterations}, wall_seconds: 3600}}
{extra}
""")
    return spec


def start(spec_path: Path, log_root: Path, workspaces: Path, measure: FakeMeasurements | None = None,
          proposer: Proposer | None = None, **kw: Any) -> CampaignEnd:
    """`kw`: start_campaign's other arguments (e.g. `probe`, what the host is)."""
    spec = load_spec(spec_path)
    return start_campaign(spec, spec_path, proposer=proposer or SearchProposer(spec.proposer.search),
                          backend=None, log_root=log_root, workspace_root=workspaces,  # type: ignore[arg-type]
                          measure=measure or FakeMeasurements(), **kw)


def gemma4_patch(line: str) -> str:
    """A git diff of the fake gemma4.py that replaces its `SCALE = 1.0` line with `line`."""
    path = "vllm/model_executor/models/gemma4.py"
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,2 +1,2 @@\n"
            f" # the fake Gemma 4 path\n-SCALE = 1.0\n+{line}\n")


def resume(log_dir: Path, measure: FakeMeasurements | None = None, **kw: Any) -> CampaignEnd:
    """`kw`: resume_campaign's other arguments (`wall_seconds`, `probe`, `checkout`)."""
    def proposer_for(spec: CampaignSpec, kind: str) -> SearchProposer:
        return SearchProposer(spec.proposer.search)

    return resume_campaign(log_dir, proposer_for=proposer_for, backend_for=lambda spec: None,  # type: ignore[arg-type,return-value]
                           measure=measure or FakeMeasurements(), **kw)


# The steps a kill can land in: (module, attribute) of what to wrap. The fake's own servers step
# ("servers": its sleep processes are up, mid-benchmark) is counted inside FakeMeasurements.
KILL_POINTS: dict[str, tuple[str, str]] = {
    "propose": ("agent.proposers.search", "SearchProposer.propose"),      # while proposing
    "gate": ("agent.gatekeeper", "Gatekeeper.request"),                   # while gating (before its record)
    "apply": ("sandbox.workspace", "Workspace.apply_patch"),              # applying a patch
    "checkout": ("sandbox.workspace", "Workspace.checkout_copy"),         # preparing an evaluation's trees
    "commit": ("sandbox.workspace", "Workspace.commit"),                  # committing an accepted patch
    "append": ("audit.writer", "AuditWriter.append"),                     # before a record is written
    "fsync": ("os", "fsync"),                                             # a record written, not yet fsynced
    "servers": ("tests.fake_measurements", "FakeMeasurements._started"),  # servers up, mid-benchmark
}


def _install(counts: collections.Counter[str], kill: tuple[str, int] | None) -> None:
    import importlib

    for name, (module_name, attr) in KILL_POINTS.items():
        owner: Any = importlib.import_module(module_name)
        *path, leaf = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        original: Callable[..., Any] = getattr(owner, leaf)

        def wrapped(*args: Any, _name: str = name, _original: Callable[..., Any] = original, **kw: Any) -> Any:
            counts[_name] += 1
            if kill == (_name, counts[_name]):
                os.kill(os.getpid(), signal.SIGKILL)
            return _original(*args, **kw)

        setattr(owner, leaf, functools.wraps(original)(wrapped))


def killed_at(point: str | None, argv: list[str], *, counts_file: Path | None = None,
              entry: Callable[[list[str]], int] | None = None) -> int:
    """Run `argv` (as main() takes it) in a forked child that SIGKILLs itself at `point` (NAME:N); return the
    child's wait status as a negative signal number (-9) or its exit code. A fork, not a new interpreter: the
    child starts with everything imported, so a kill costs the campaign's time only. `entry`: another main
    (tests/kernel/test_kernel_resume.py's kernel campaigns), which reads RATCHET_KILL_AT itself."""
    pid = os.fork()
    if pid == 0:   # the child: never returns into the caller's (pytest's) frames
        code = 1
        try:
            os.environ.pop("RATCHET_KILL_AT", None)
            if point:
                os.environ["RATCHET_KILL_AT"] = point
            if counts_file:
                os.environ["RATCHET_CALL_COUNTS"] = str(counts_file)
            code = (entry or main)(argv)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.fake_campaign")
    parser.add_argument("--hold-s", type=float, default=0.0, help="keep each measurement's fake servers up S s")
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start")
    for name in ("spec", "log_root", "workspaces"):
        begin.add_argument(name, type=Path)
    again = commands.add_parser("resume")
    again.add_argument("log_dir", type=Path)
    again.add_argument("--wall-seconds", type=float)
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    counts: collections.Counter[str] = collections.Counter()
    kill_at = os.environ.get("RATCHET_KILL_AT")
    kill = (kill_at.split(":")[0], int(kill_at.split(":")[1])) if kill_at else None
    _install(counts, kill)
    measure = FakeMeasurements(hold_s=args.hold_s)
    try:
        if args.command == "start":
            start(args.spec, args.log_root, args.workspaces, measure)
        else:
            resume(args.log_dir, measure, wall_seconds=args.wall_seconds)
    finally:
        if os.environ.get("RATCHET_CALL_COUNTS"):
            Path(os.environ["RATCHET_CALL_COUNTS"]).write_text(json.dumps(dict(counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
