"""The workspace of a resumed campaign: the one it ran in when it is there, else rebuilt from the log (a fresh host,
a checkout at another path).

A rebuild copies the target's source as the campaign did (its tree must hash to the recorded base tree), writes the
recorded base commit again, then applies each commit of the branch in order (the prelude a kernel campaign kept, the
accepted iterations): its recorded diff, then its recorded raw commit object, which is written only over the very
tree it names. The branch `ratchet/<campaign-id>` so comes back with the same commits, hashes and all, and every
reference the log holds (base commit, incumbent, accepted commits) stays true. It is built beside its place and
moved there once whole, so a failed rebuild leaves nothing half made.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import CampaignError
from agent.journal import Journal
from sandbox.errors import SandboxError
from sandbox.workspace import PackageSource, Workspace

__all__ = ["open_or_rebuild"]


def open_or_rebuild(journal: Journal, root: Path, *, package: str, serving: Mapping[str, object],
                    source: Callable[[], Path | PackageSource | None]) -> tuple[Workspace, dict[str, Any]]:
    """The campaign's workspace at `root` (the recorded path, moved under this host's checkout), and what was done
    for it (for campaign.resume): opened as it is, or rebuilt from the log where `root` does not exist (from
    `source()`: the target's package, located only then)."""
    if (root / ".git").exists():
        ws = Workspace.open(root, package)
        missing = [ref for ref in (journal.branch, journal.incumbent_ref) if not _has(ws, ref)]
        if missing:
            raise CampaignError(f"the workspace {root} is not this campaign's (it lacks {', '.join(missing)}): move it "
                                "away and resume again, and the workspace is rebuilt there from the log")
        return ws, {"path": str(root), "rebuilt": False}
    if root.exists() and any(root.iterdir()):
        raise CampaignError(f"{root}, where the campaign's workspace belongs, holds something else (no .git): move it "
                            "away and resume again, and the workspace is rebuilt there from the log")
    return rebuild(journal, root, package=package, serving=serving, source=source()), {
        "path": str(root), "rebuilt": True, "commits": [c.commit for c in journal.branch_commits]}


def _has(ws: Workspace, ref: str) -> bool:
    try:
        ws.resolve(ref)
    except SandboxError:
        return False
    return True


def _unrecorded(journal: Journal) -> list[str]:
    gaps = [] if journal.start.get("base_commit_object") else ["the base commit"]
    gaps += [c.label for c in journal.branch_commits if not c.raw or not c.diff]
    return gaps


def rebuild(journal: Journal, root: Path, *, package: str, serving: Mapping[str, object],
            source: Path | PackageSource | None) -> Workspace:
    gaps = _unrecorded(journal)
    if gaps:
        raise CampaignError(f"the campaign's workspace {root} is missing, and the log cannot rebuild it: it does not "
                            f"record the raw commit of {', '.join(gaps)} (a log written before ratchet recorded "
                            "them). Copy the workspace from the host it ran on to that path, and resume again")
    scratch = root.with_name(f".{root.name}.rebuilding-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        _build(journal, scratch, package=package, serving=serving, source=source)
        root.parent.mkdir(parents=True, exist_ok=True)
        if root.exists():
            root.rmdir()   # an empty folder (checked by the caller)
        scratch.rename(root)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Workspace.open(root, package)


def _build(journal: Journal, root: Path, *, package: str, serving: Mapping[str, object],
           source: Path | PackageSource | None) -> None:
    try:
        ws = Workspace.create(root, serving=dict(serving), package=package, source=source)
    except (SandboxError, OSError) as exc:
        raise CampaignError(f"cannot rebuild the campaign's workspace from its source: {exc}") from None
    base_tree = str(journal.start.get("base_tree", ""))
    if ws.tree_hash() != base_tree:
        raise CampaignError(f"the target's source here ({source or f'the installed {package}'}) is not the tree the "
                            f"campaign began with (tree {ws.tree_hash()[:12]}, recorded {base_tree[:12]}): install the "
                            "same version (and check out the same source) as on the host it started on")
    try:
        base = ws.write_commit(str(journal.start["base_commit_object"]))
        _expect(base, journal.base_commit, "the base commit")
        ws.repo.git.checkout("-q", "-B", journal.branch, base)
        ws.repo.git.branch("-f", "main", base)   # where Workspace.create left its own copy of the base
        for step in journal.branch_commits:
            ws.apply_patch(step.diff)
            written = ws.write_commit(str(step.raw))
            _expect(written, step.commit, step.label)
            ws.reset(written)
    except SandboxError as exc:
        raise CampaignError(f"rebuilding the campaign's workspace from its log failed: {exc}") from None


def _expect(written: str, recorded: str, label: str) -> None:
    if written != recorded:
        raise CampaignError(f"rebuilding the workspace: {label} was written as {written[:12]}, the log records "
                            f"{recorded[:12]}")
