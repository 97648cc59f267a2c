"""Loading a kernel module from a tree (a workspace checkout), with evidence: a standalone file under a name of
its own, or a module of the package the tree holds (vLLM's kernel, whose imports name its siblings).

Evidence that the candidate ran: the sha256 of the file as it was imported. The campaign compares it with the
file it checked out, so a runner that silently loaded another kernel (OpenEvolve's benchmark that never
loaded the evolved one) fails the iteration instead of measuring the wrong code.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from harness.kernel.correctness import KernelFn

__all__ = ["LoadedKernel", "KernelLoadError", "load_kernel", "file_sha256"]


class KernelLoadError(Exception):
    """The module is missing, outside its tree, fails to import, or has no callable entry."""


@dataclass(frozen=True)
class LoadedKernel:
    fn: KernelFn
    module: ModuleType
    file: Path
    sha256: str


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _frames(path: Path, exc: Exception) -> str:
    """The frames, so whoever wrote the kernel sees the line (a SyntaxError shows its caret)."""
    frames = "".join(traceback.format_exception(exc, limit=-4))[-3000:]
    return f"importing {path} raised {type(exc).__name__}: {exc}\n{frames}"


def _import_file(path: Path, name: str) -> ModuleType:
    """A standalone kernel file, under a name of its own."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod        # Triton's JIT looks functions' modules up by name
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        raise KernelLoadError(_frames(path, exc)) from exc
    return mod


def _import_from_package(tree: Path, module: str, path: Path) -> ModuleType:
    """A module of a package the tree holds (vLLM's kernel imports its siblings as `vllm.…`): the tree goes
    first on sys.path and the module is imported by its dotted name; it must then be the tree's own file."""
    name = module.removesuffix(".py").replace("/", ".")
    top = name.split(".")[0]
    if top in sys.modules:
        raise KernelLoadError(f"package {top} was imported before the kernel's tree {tree} was put first")
    sys.path.insert(0, str(tree))
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        raise KernelLoadError(_frames(path, exc)) from exc
    got = Path(mod.__file__ or "").resolve()
    if got != path:
        raise KernelLoadError(f"importing {name} loaded {got}, not the tree's {path}")
    return mod


def load_kernel(tree: Path, module: str, entry: str, *, tag: str, as_package: bool = False) -> LoadedKernel:
    """`as_package`: import `module` (a path like vllm/v1/…/x.py) as a module of the package the tree holds,
    instead of as a standalone file."""
    tree = tree.resolve()
    path = (tree / module).resolve()
    if not path.is_relative_to(tree) or path.suffix != ".py":
        raise KernelLoadError(f"{module} is not a .py file inside {tree}")
    if not path.is_file():
        raise KernelLoadError(f"{path} not found; target.module names the kernel file inside target.source")
    digest = file_sha256(path)
    mod = (_import_from_package(tree, module, path) if as_package
           else _import_file(path, f"ratchet_kernel_{tag}_{digest[:12]}"))
    fn = getattr(mod, entry, None)
    if not callable(fn):
        raise KernelLoadError(f"{path} has no callable {entry!r}; target.entry names the entry function")
    if file_sha256(path) != digest:
        raise KernelLoadError(f"{path} changed while it was imported")
    return LoadedKernel(fn=fn, module=mod, file=path, sha256=digest)
