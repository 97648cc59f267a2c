"""The `patches` proposer: given patch files, proposed in order, one per iteration.

For changes written elsewhere — by hand, by another tool, or a vendor's patch behind a claimed speedup — put
through the same gate, checks, measurement and verdict as an agent's. Each file is a unified diff against the
workspace (paths relative to its root); a file that no longer applies to the incumbent is the iteration's
recorded `invalid` outcome, and the next file is proposed next. The hypothesis is the file's leading comment
lines (`# ...` before the diff), else its name. Stateless like the other proposers: what was tried is read from
the history (`source` names the file and its content hash).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

from agent.base import CampaignState, GiveUp, Proposal, Tools

__all__ = ["PatchFilesProposer", "patch_diff", "patch_source"]


def patch_source(path: Path, text: str) -> str:
    return f"patch-file:{path.name}:{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _header(text: str) -> list[str]:
    """The leading comment lines (the author's words before the diff)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _hypothesis(path: Path, text: str) -> str:
    said = " ".join(line.lstrip("#").strip() for line in _header(text)).strip()
    return said or f"the change in {path.name}"


def patch_diff(text: str) -> str:
    """The diff the gate sees: the file without its leading comment lines."""
    return "\n".join(text.splitlines()[len(_header(text)):]).lstrip("\n") + "\n"


class PatchFilesProposer:
    name = "patches"
    reads_profile = False

    def __init__(self, paths: Sequence[Path]) -> None:
        if not paths:
            raise ValueError("the patches proposer needs at least one patch file")
        self.paths = [Path(p) for p in paths]

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp:
        tried = {entry.source for entry in state.history}
        for path in self.paths:
            text = path.read_text()
            source = patch_source(path, text)
            if source in tried:
                continue
            return Proposal(hypothesis=_hypothesis(path, text), patch=patch_diff(text), source=source,
                            patch_format="diff")
        return GiveUp(reason=f"every patch file was proposed ({len(self.paths)}): the list is exhausted")
