"""The measurement path, hashed: what the pristine benchmark client, the harness and the interpreter run.

A candidate's server that can write the host (the unisolated local backend runs it as the same user)
could rewrite the installed `vllm/benchmarks/serve.py`, a `.pth` file the client's interpreter runs at
start-up, or the harness itself, and the comparison would go on and report normally. So every A/B takes
a digest before its first server starts and after its last benchmark run, and both must equal the digest
taken when the campaign (or command) began; any difference is `MeasurementTampered`, naming the files.

Python sources, `.pth` files, every file of the harness package (300 KB) and every file of the installed vLLM
package (its compiled extensions are hard-linked into the workspace trees, so a candidate could write through a
link) are hashed by content; every other file (torch and the rest: 3 GB in the CPU venv) by size, mtime and
inode. The harness by content because a checkout is often copied again with the same bytes (a sync, a `git
checkout` of the same commit): by stat, a re-copied harness/README.md voided a GPU host's A/B as tampered.
Not ctime: making a hard link changes it, and the trees link vLLM's .so files (the first version of this
check called every A/B of a campaign tampered for that reason).
"""

from __future__ import annotations

import hashlib
import os
import site
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import MeasurementTampered

__all__ = ["MeasurementDigest", "measurement_roots", "digest_roots", "check_unchanged"]

_CONTENT = (".py", ".pth")


@dataclass(frozen=True)
class MeasurementDigest:
    sha256: str
    files: dict[str, str]          # path -> per-file digest, to name what changed

    def changed(self, other: MeasurementDigest) -> list[str]:
        keys = set(self.files) | set(other.files)
        return sorted(k for k in keys if self.files.get(k) != other.files.get(k))


def measurement_roots(python: str = sys.executable) -> list[Path]:
    """The harness package, the interpreter, and the site-packages the pristine client imports from."""
    roots = [Path(__file__).resolve().parent, Path(os.path.realpath(python))]
    if Path(python).resolve() == Path(sys.executable).resolve():
        roots += [Path(p) for p in site.getsitepackages()]
    return [r for r in dict.fromkeys(roots) if r.exists()]


def _file_digest(path: Path, *, content: bool) -> str:
    if content or path.suffix in _CONTENT:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    st = path.stat()
    return f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _in_vllm(path: Path, root: Path) -> bool:
    rel = path.relative_to(root).parts if root.is_dir() else ()
    return bool(rel) and rel[0] == "vllm"


_HARNESS = Path(__file__).resolve().parent


def _by_content(path: Path, root: Path) -> bool:
    return root == _HARNESS or _in_vllm(path, root)


def _walk(root: Path) -> Iterable[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            yield Path(dirpath) / name


def digest_roots(roots: Iterable[Path]) -> MeasurementDigest:
    files: dict[str, str] = {}
    for root in roots:
        for path in _walk(root):
            try:
                files[str(path)] = _file_digest(path, content=_by_content(path, root))
            except OSError:          # vanished while walking: that is a change too
                files[str(path)] = "unreadable"
    total = hashlib.sha256()
    for name in sorted(files):
        total.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return MeasurementDigest(total.hexdigest(), files)


def check_unchanged(expected: MeasurementDigest, roots: Iterable[Path], *, when: str) -> None:
    now = digest_roots(roots)
    if now.sha256 != expected.sha256:
        changed = expected.changed(now)
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise MeasurementTampered(f"the measurement path changed {when}: {shown}; the comparison is void. "
                                  "Restore the installed packages (reinstall the venv) before measuring again")
