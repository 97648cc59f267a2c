"""What the sub-commands share: spec loading, workspace and backend set-up, one-line errors."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from agent.errors import CampaignError
from agent.spec import CampaignSpec, SpecError, load_spec
from agent.target import workspace_source
from harness.errors import HarnessError
from sandbox.base import Backend
from sandbox.errors import SandboxError
from sandbox.factory import backend_from_config
from sandbox.workspace import Workspace

__all__ = ["console", "err_console", "cli_errors", "open_spec", "ensure_workspace", "make_backend",
           "EXIT_USAGE", "EXIT_HARNESS"]

# Wide when piped (CI logs, files): rich's 80-column default truncates the grid tables.
console = Console(width=None if sys.stdout.isatty() else 180)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 180)
EXIT_USAGE = 2       # bad spec, bad arguments, missing files
EXIT_HARNESS = 3     # the measurement could not be completed (server, benchmark, sandbox)


def cli_errors(func: Callable[[Any], int]) -> Callable[[Any], int]:
    """Turn the project's own errors into one readable line and an exit code; never a traceback."""

    @functools.wraps(func)
    def wrapper(args: Any) -> int:
        try:
            return func(args)
        except (SpecError, CampaignError) as exc:
            err_console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
            return EXIT_USAGE
        except (HarnessError, SandboxError) as exc:
            err_console.print(f"[red]{type(exc).__name__}:[/red] {exc}", markup=True, highlight=False)
            return EXIT_HARNESS
        except KeyboardInterrupt:
            err_console.print("interrupted; servers were stopped")
            return 130

    return wrapper


def open_spec(path: str) -> CampaignSpec:
    return load_spec(Path(path))


def ensure_workspace(spec: CampaignSpec, *, workspace: str | None = None) -> Workspace:
    """The spec's workspace, created on first use from the installed (or source, or image's) vLLM tree. A
    vllm-image workspace is reused only while the spec's image is the one it was copied from."""
    root = Path(workspace).resolve() if workspace else spec.workspace_dir(Path.cwd())
    exists = (root / ".git").exists()
    if exists and spec.target.kind != "vllm-image":
        return Workspace.open(root, spec.target.package)
    source = workspace_source(spec)
    if exists:
        ws = Workspace.open(root, spec.target.package)
        if ws.source_description() != str(source):
            raise SpecError(f"workspace {root} was copied from {ws.source_description() or 'elsewhere'}, not from "
                            f"{source}; remove it (or pass another --workspace) to copy the image's vLLM again")
        return ws
    what = f"the {spec.target.package} package" if source is None or isinstance(source, Path) else str(source)
    err_console.print(f"creating workspace {root} (copies {what}; ~20 s)")
    return Workspace.create(root, serving=dict(spec.server.engine_args), package=spec.target.package, source=source)


def make_backend(spec: CampaignSpec) -> Backend:
    return backend_from_config(spec.sandbox)


def python_for_server() -> str:
    return sys.executable
