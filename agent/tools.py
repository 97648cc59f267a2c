"""`Tools` for proposers: every look at the workspace and every patch check passes the gate and is
audited before it happens. Reads come from the incumbent tree (the workspace at the campaign branch's
head, kept clean between iterations); nothing here writes to it."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from agent import records
from agent.errors import ActionDenied
from agent.gatekeeper import Gatekeeper
from sandbox.errors import PatchRejected
from sandbox.patches import check_patch_paths

__all__ = ["GatedTools", "TrialRunner", "changes_nothing", "to_unified_diff"]

_MAX_READ_BYTES = 400_000
_MAX_RESULTS = 200


def to_unified_diff(root: Path, patch: str, patch_format: str) -> str:
    """SEARCH/REPLACE blocks become a unified diff against `root` (the gate only reads diffs)."""
    if patch_format == "diff":
        return patch
    if patch_format == "search_replace":
        from sandbox.search_replace import blocks_to_diff  # type: ignore[import-not-found]

        return str(blocks_to_diff(root, patch))
    raise PatchRejected(f"unknown patch format {patch_format!r}; use 'diff' or 'search_replace'")


class TrialRunner(Protocol):
    """What runs a checked patch as a trial (agent/trial.py's IterationTrials; for kernel campaigns
    agent/kernel_campaign.py's KernelChecks, whose names are shapes instead of cells)."""

    def check_cells(self, cells: list[str] | None) -> None: ...   # ValueError naming the valid names
    def run(self, diff: str, cells: list[str] | None) -> str: ...  # the text the agent reads


def changes_nothing(diff: str) -> bool:
    """Whether every hunk of a (parseable, checked) diff leaves its lines as they were, and it adds, removes or
    renames no file. Small models propose such diffs (Qwen2.5-Coder-1.5B did, on the real workspace)."""
    try:
        patch = PatchSet(diff)
    except UnidiffParseError:
        return False                      # the gate has its own verdict on malformed diffs
    if not patch:
        return False
    for changed in patch:
        if changed.is_added_file or changed.is_removed_file or changed.is_rename:
            return False
        for hunk in changed:
            if [line.value for line in hunk.source_lines()] != [line.value for line in hunk.target_lines()]:
                return False
    return True


@dataclass
class GatedTools:
    gate: Gatekeeper
    root: Path
    iteration: int
    trial: TrialRunner | None = None          # serving campaigns' try_patch
    kernel_check: TrialRunner | None = None   # kernel campaigns' check_kernel

    def _read_allowed(self, path: str) -> Path:
        self.gate.require({"kind": "read_file", "path": path}, iteration=self.iteration)
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root.resolve()):  # the gate normalises; this is belt and braces
            raise ActionDenied("builtin-path", f"{path} leaves the workspace")
        return target

    def read_file(self, path: str) -> str:
        target = self._read_allowed(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path}: no such file in the workspace")
        data = target.read_bytes()[:_MAX_READ_BYTES]
        return data.decode(errors="replace")

    def list_files(self, directory: str) -> list[str]:
        target = self._read_allowed(directory.rstrip("/") or ".")
        if not target.is_dir():
            raise FileNotFoundError(f"{directory}: no such directory in the workspace")
        out = []
        for child in sorted(target.iterdir()):
            if child.name.startswith(".") or child.name == "__pycache__":
                continue
            rel = child.relative_to(self.root).as_posix()
            out.append(rel + ("/" if child.is_dir() else ""))
        return out[:_MAX_RESULTS]

    def search(self, pattern: str, directory: str = "vllm") -> list[str]:
        """`path:line: text` for lines matching a regex, Python files under `directory`."""
        target = self._read_allowed(directory)
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"bad regex {pattern!r}: {exc}") from exc
        hits: list[str] = []
        for path in sorted(target.rglob("*.py")):
            rel = path.relative_to(self.root).as_posix()
            if fnmatch.fnmatch(rel, "*__pycache__*"):
                continue
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if regex.search(line):
                    hits.append(f"{rel}:{lineno}: {line.strip()[:160]}")
                    if len(hits) >= _MAX_RESULTS:
                        return hits
        return hits

    def check_patch(self, patch: str, patch_format: str = "diff") -> str:
        """Gate the patch, then `git apply --check` it against the incumbent; returns the unified diff."""
        diff = to_unified_diff(self.root, patch, patch_format)
        check_patch_paths(diff)
        self.gate.require({"kind": "patch", "diff": diff}, iteration=self.iteration)
        proc = subprocess.run(["git", "apply", "--check", "--whitespace=nowarn", "-"], cwd=self.root,
                              input=diff.encode(), capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise PatchRejected(f"git apply --check failed: {proc.stderr.decode(errors='replace').strip()}")
        if changes_nothing(diff):   # an A/B of the incumbent against itself is minutes spent on nothing
            raise PatchRejected("the patch changes nothing: each hunk's - and + lines are identical; change the "
                                "lines that should differ")
        return diff

    def try_patch(self, patch: str, patch_format: str = "diff", cells: list[str] | None = None) -> str:
        """Gate and check the patch, take one of `budget.trials` (refused, not a campaign stop, when none is
        left), then run it as a trial: a hint for the agent, never a verdict."""
        if self.trial is None:
            raise ActionDenied("builtin-trials", "this campaign runs no trials (try_patch is for serving campaigns)")
        self.trial.check_cells(cells)
        diff = self.check_patch(patch, patch_format)
        self.gate.reserve("trials", 1, iteration=self.iteration)
        return self.trial.run(diff, cells)

    def check_kernel(self, patch: str, patch_format: str = "diff", shapes: list[str] | None = None) -> str:
        """The same for a kernel campaign: the kernel harness's checks and timing of the patched kernel."""
        if self.kernel_check is None:
            raise ActionDenied("builtin-trials", "this campaign checks no kernels (check_kernel is for kernel "
                                                 "campaigns; try_patch for serving campaigns)")
        self.kernel_check.check_cells(shapes)
        diff = self.check_patch(patch, patch_format)
        self.gate.reserve("trials", 1, iteration=self.iteration)
        return self.kernel_check.run(diff, shapes)

    def charge(self, resource: str, amount: float) -> None:
        self.gate.spend(resource, amount, iteration=self.iteration)

    def budget_left(self, resource: str) -> float:
        return self.gate.left(resource)

    def note(self, kind: str, payload: dict[str, object]) -> None:
        self.gate.writer.append(records.note_kind(kind), payload=payload, iteration=self.iteration)
