"""Offline install bundles for GPU hosts without a package index: wheels resolved here, chunked, reassembled there.

    build  (here, needs `packaging` and pip with network): resolve what the host lacks from the wheels'
           Requires-Dist (markers evaluated for the target Python/platform), download with
           `pip download --no-deps --only-binary=:all:`, drop named files from wheels, write the wheels
           as one byte stream cut into chunks of --chunk-mb MiB, plus manifest.json and this file
           copied as install_bundle.py.
    install (there, stdlib only): `python3 install_bundle.py install DIR [--chunks DIR ...] [--target T]`
           checks every chunk's sha256, reassembles the stream, checks every wheel's sha256, then runs
           `pip install --no-index --no-deps --no-compile` (into --target, else the interpreter's env).

Manifest (format "ratchet-bundle/1"): target {python, implementation, platforms}, roots, chunk_bytes,
wheels [{name, version, file, offset, size, sha256, dropped, reason}], chunks [{file, offset, size,
sha256}], skipped [{name, why}], install {argv, command}. Wheel offsets index the concatenated stream.

This module imports only the standard library at import time: the install half runs on hosts where
ratchet and its dependencies are not installed. Errors are `BundleError` (exit code 2 from main()).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["BundleError", "Target", "HostPackages", "Resolved", "resolve", "drop_files", "write_chunks",
           "reassemble", "build", "install", "main", "MANIFEST", "FORMAT"]

MANIFEST = "manifest.json"
FORMAT = "ratchet-bundle/1"
INSTALLER = "install_bundle.py"
_BUF = 1 << 20


class BundleError(Exception):
    """A bundle could not be built, verified or installed; the message says what to do next."""


def normalize(name: str) -> str:
    """PEP 503 project-name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_BUF):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- build


@dataclass(frozen=True)
class Target:
    python: str = "3.12"                                  # "3.12" or "3.12.3"
    platforms: tuple[str, ...] = ("manylinux_2_28_x86_64",)
    implementation: str = "cp"

    @property
    def py_tuple(self) -> tuple[int, int]:
        major, minor = self.python.split(".")[:2]
        return int(major), int(minor)

    def marker_env(self) -> dict[str, str]:
        full = self.python if self.python.count(".") == 2 else self.python + ".0"
        machine = "aarch64" if any("aarch64" in p for p in self.platforms) else "x86_64"
        return {"python_version": ".".join(map(str, self.py_tuple)), "python_full_version": full,
                "implementation_name": "cpython", "implementation_version": full,
                "platform_python_implementation": "CPython", "os_name": "posix", "sys_platform": "linux",
                "platform_system": "Linux", "platform_machine": machine, "platform_release": "",
                "platform_version": "", "extra": ""}

    def pip_platforms(self) -> list[str]:
        """pip matches manylinux_2_N exactly: each given manylinux_2_N with all its older aliases."""
        plats: list[str] = []
        for p in self.platforms:
            m = re.match(r"manylinux_(\d+)_(\d+)_(\w+)", p)
            more = [p]
            if m:
                more = [f"manylinux_{m[1]}_{n}_{m[3]}" for n in range(int(m[2]), 4, -1)]
                more += [f"manylinux2014_{m[3]}", f"manylinux2010_{m[3]}", f"manylinux1_{m[3]}"]
            plats += [q for q in more if q not in plats]
        return plats

    def supported_tags(self) -> set[Any]:
        from packaging import tags

        interp = f"{self.implementation}{self.py_tuple[0]}{self.py_tuple[1]}"
        plats = self.pip_platforms()
        found = set(tags.cpython_tags(self.py_tuple, platforms=plats))
        found |= set(tags.compatible_tags(self.py_tuple, interpreter=interp, platforms=plats))
        return found


@dataclass(frozen=True)
class HostPackages:
    """What the target host already has: name -> version, or None when only the name is known."""

    versions: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> HostPackages:
        """`pip freeze` / `pip list --format=freeze` lines; bare names mean "present, any version"."""
        out: dict[str, str | None] = {}
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            if " @ " in line:
                out[normalize(line.split(" @ ", 1)[0])] = None
            elif "==" in line:
                name, version = line.split("==", 1)
                out[normalize(name)] = version.strip()
            else:
                out[normalize(line)] = None
        return cls(versions=out)

    def satisfies(self, req: Any) -> bool:
        name = normalize(req.name)
        if name not in self.versions:
            return False
        version = self.versions[name]
        return version is None or req.specifier.contains(version, prereleases=True)


@dataclass
class Resolved:
    wheels: dict[str, Path] = field(default_factory=dict)              # normalized name -> wheel file
    reasons: dict[str, str] = field(default_factory=dict)              # name -> who asked for it
    skipped: dict[str, str] = field(default_factory=dict)              # name -> why not bundled


Fetch = Callable[[str, Path], Path]      # (requirement string, directory) -> downloaded wheel


def pip_fetch(target: Target) -> Fetch:
    """Download one wheel for the target with pip (network); returns its path."""

    def fetch(requirement: str, dest: Path) -> Path:
        before = set(dest.glob("*.whl"))
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", target.python, "--implementation", target.implementation, "-d", str(dest)]
        for plat in target.pip_platforms():
            argv += ["--platform", plat]
        proc = subprocess.run([*argv, requirement], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise BundleError(f"pip download {requirement!r} failed: {proc.stderr.strip()[-800:]}; add a "
                              f"--platform, pin another version with --pin, or --exclude it")
        new = set(dest.glob("*.whl")) - before
        return max(new or _matching(dest, requirement), key=lambda p: p.stat().st_mtime)

    return fetch


def _matching(directory: Path, requirement: str) -> list[Path]:
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    req = Requirement(requirement)
    out = []
    for path in directory.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(path.name)
        if normalize(name) == normalize(req.name) and req.specifier.contains(version, prereleases=True):
            out.append(path)
    return out


def _requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if meta is None:
            raise BundleError(f"{wheel.name} has no .dist-info/METADATA; is it a wheel?")
        text = zf.read(meta).decode("utf-8", errors="replace")
    header = text.split("\n\n", 1)[0]
    return [line.split(":", 1)[1].strip() for line in header.splitlines() if line.startswith("Requires-Dist:")]


def _wanted(req: Any, env: dict[str, str], extras: Iterable[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras))


def resolve(roots: list[str], *, target: Target, host: HostPackages, cache: Path, fetch: Fetch,
            pins: dict[str, str] | None = None, exclude: Iterable[str] = (),
            log: Callable[[str], None] = lambda _: None) -> Resolved:
    """Breadth-first over Requires-Dist. A package already on the host at a satisfying version is
    skipped (its own requirements are the host's business); a pinned name uses the pinned version."""
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    pins = {normalize(k): v for k, v in (pins or {}).items()}
    excluded = {normalize(n) for n in exclude}
    env, tags = target.marker_env(), target.supported_tags()
    cache.mkdir(parents=True, exist_ok=True)
    out = Resolved()
    extras_done: dict[str, set[str]] = {}
    queue: list[tuple[Any, str]] = [(Requirement(r), "root") for r in roots]
    while queue:
        req, parent = queue.pop(0)
        name = normalize(req.name)
        if name in excluded:
            out.skipped.setdefault(name, "excluded")
            continue
        if name not in out.wheels and host.satisfies(req):
            out.skipped.setdefault(name, f"host has {host.versions[name] or 'it'}")
            continue
        if name not in out.wheels:
            spec = f"=={pins[name]}" if name in pins else str(req.specifier)
            if name in pins and not req.specifier.contains(pins[name], prereleases=True):
                raise BundleError(f"pin {name}=={pins[name]} conflicts with {req} (asked by {parent})")
            candidates = [p for p in _matching(cache, f"{name}{spec}")
                          if tags & set(parse_wheel_filename(p.name)[3])]
            wheel = (max(candidates, key=lambda p: parse_wheel_filename(p.name)[1]) if candidates
                     else fetch(f"{name}{spec}", cache))
            if not tags & set(parse_wheel_filename(wheel.name)[3]):
                raise BundleError(f"{wheel.name} does not fit Python {target.python} on {target.platforms}")
            out.wheels[name], out.reasons[name] = wheel, parent
            log(f"+ {wheel.name}  (for {parent})")
        else:
            version = str(parse_wheel_filename(out.wheels[name].name)[1])
            if not req.specifier.contains(version, prereleases=True):
                log(f"! {name} {version} does not satisfy {req} (asked by {parent}); keeping {version}")
        new_extras = set(req.extras) - extras_done.get(name, set())
        if name in extras_done and not new_extras:
            continue
        first = name not in extras_done
        extras_done.setdefault(name, set()).update(req.extras)
        for dep in _requires_dist(out.wheels[name]):
            dreq = Requirement(dep)
            if first and _wanted(dreq, env, extras_done[name]) or (
                    not first and _wanted(dreq, env, new_extras) and not _wanted(dreq, env, ())):
                queue.append((dreq, name))
    return out


def drop_files(wheel: Path, patterns: Iterable[str], dest: Path) -> list[str]:
    """Copy `wheel` to `dest` without the members matching `patterns` (fnmatch, path from the wheel
    root); their RECORD lines go too. Returns the dropped member names (empty: `dest` not written)."""
    patterns = list(patterns)
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        dropped = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not dropped:
            return []
        gone = set(dropped)
        with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for info in src.infolist():
                if info.filename in gone:
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if line.split(",", 1)[0] not in gone).encode()
                out.writestr(info, data, compress_type=info.compress_type)
    return dropped


def write_chunks(files: list[Path], out_dir: Path,
                 chunk_bytes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Concatenate `files` into one stream cut into `chunk_bytes` pieces, each in its own folder
    part-NNN/ (so each can be carried to the host on its own). Returns (file records with offsets, chunk records)."""
    if chunk_bytes <= 0:
        raise BundleError("chunk size must be positive")
    records: list[dict[str, Any]] = []
    chunks: list[dict[str, Any]] = []
    current: BinaryIO | None = None
    offset, index, written, h = 0, 0, 0, hashlib.sha256()

    def close() -> None:
        nonlocal current, index, written, h
        if current is not None:
            current.close()
            chunks.append({"file": f"part-{index:03d}/chunk-{index:03d}.bin", "offset": offset - written,
                           "size": written, "sha256": h.hexdigest()})
            index, current, written, h = index + 1, None, 0, hashlib.sha256()

    for path in files:
        fh = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            while data := f.read(_BUF):
                fh.update(data)
                while data:
                    if current is None:
                        (out_dir / f"part-{index:03d}").mkdir(parents=True, exist_ok=True)
                        current = open(out_dir / f"part-{index:03d}" / f"chunk-{index:03d}.bin", "wb")  # noqa: SIM115
                    take = data[: chunk_bytes - written]
                    current.write(take)
                    h.update(take)
                    written += len(take)
                    offset += len(take)
                    size += len(take)
                    data = data[len(take):]
                    if written == chunk_bytes:
                        close()
        records.append({"file": path.name, "offset": offset - size, "size": size, "sha256": fh.hexdigest()})
    close()
    return records, chunks


def build(roots: list[str], *, out: Path, target: Target, host: HostPackages, cache: Path, fetch: Fetch,
          drop: Iterable[str] = (), chunk_mb: float = 60, pins: dict[str, str] | None = None,
          exclude: Iterable[str] = (), log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; remove it or choose another --out")
    resolved = resolve(roots, target=target, host=host, cache=cache, fetch=fetch, pins=pins, exclude=exclude, log=log)
    staging = out / ".staging"
    staging.mkdir(parents=True)
    files, dropped_by = [], {}
    for name in sorted(resolved.wheels):
        wheel = resolved.wheels[name]
        trimmed = staging / wheel.name
        dropped = drop_files(wheel, drop, trimmed) if drop else []
        if dropped:
            log(f"- {wheel.name}: dropped {len(dropped)} files")
        files.append(trimmed if dropped else wheel)
        dropped_by[wheel.name] = dropped
    records, chunks = write_chunks(files, out, int(chunk_mb * (1 << 20)))
    shutil.rmtree(staging)
    from packaging.utils import parse_wheel_filename

    for rec in records:
        name, version, _, _ = parse_wheel_filename(rec["file"])
        rec.update(name=normalize(name), version=str(version), dropped=dropped_by[rec["file"]],
                   reason=resolved.reasons[normalize(name)])
    shutil.copy2(Path(__file__), out / INSTALLER)
    manifest = {"format": FORMAT, "target": asdict(target), "roots": roots, "chunk_bytes": int(chunk_mb * (1 << 20)),
                "wheels": records, "chunks": chunks,
                "skipped": [{"name": n, "why": w} for n, w in sorted(resolved.skipped.items())],
                "total_bytes": sum(r["size"] for r in records),
                "install": {"argv": ["python3", INSTALLER, "install", ".", "--target", "SITE"],
                            "command": f"python3 {INSTALLER} install DIR [--chunks DIR ...] [--target SITE]; "
                                       "then PYTHONPATH=SITE (or omit --target to install into python3's env)"}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# -------------------------------------------------------------------------------------------- install


def _find(name: str, roots: list[Path]) -> Path:
    base = Path(name).name
    for root in roots:
        for candidate in (root / name, root / base):
            if candidate.is_file():
                return candidate
        for candidate in root.rglob(base):
            if candidate.is_file():
                return candidate
    raise BundleError(f"chunk {name} not found under {', '.join(map(str, roots))}; copy its part folder there "
                      "or pass its folder with --chunks")


def reassemble(bundle: Path, *, chunk_dirs: Iterable[Path] = (), work: Path) -> list[Path]:
    """Verify chunks, rebuild the wheels into `work`, verify the wheels; returns the wheel paths."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{bundle / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    roots = [bundle, *chunk_dirs]
    paths = [_find(c["file"], roots) for c in manifest["chunks"]]
    for chunk, path in zip(manifest["chunks"], paths, strict=True):
        if path.stat().st_size != chunk["size"] or sha256_file(path) != chunk["sha256"]:
            raise BundleError(f"chunk {path} is corrupt (size or sha256 differs from the manifest); "
                              "transfer that part again")
    work.mkdir(parents=True, exist_ok=True)
    stream = _ChunkReader(paths)
    wheels = []
    try:
        for rec in manifest["wheels"]:
            dest = work / rec["file"]
            h = hashlib.sha256()
            with open(dest, "wb") as f:
                for data in stream.read_range(rec["offset"], rec["size"]):
                    f.write(data)
                    h.update(data)
            if h.hexdigest() != rec["sha256"]:
                raise BundleError(f"wheel {rec['file']} reassembled with a wrong sha256; rebuild the bundle")
            wheels.append(dest)
    finally:
        stream.close()
    return wheels


class _ChunkReader:
    """Sequential reads across the chunk files as one stream."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths, self.index, self.pos = paths, 0, 0
        self.fh: BinaryIO | None = None

    def read_range(self, offset: int, size: int) -> Iterable[bytes]:
        if offset != self.pos:
            raise BundleError(f"manifest offsets are not sequential at byte {offset}; rebuild the bundle")
        while size > 0:
            if self.fh is None:
                if self.index >= len(self.paths):
                    raise BundleError("the chunks end before the last wheel; a chunk is missing")
                self.fh = open(self.paths[self.index], "rb")  # noqa: SIM115
            data = self.fh.read(min(size, _BUF))
            if not data:
                self.fh.close()
                self.fh, self.index = None, self.index + 1
                continue
            size -= len(data)
            self.pos += len(data)
            yield data

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def install(bundle: Path, *, chunk_dirs: Iterable[Path] = (), target: Path | None = None,
            python: str = sys.executable, work: Path | None = None, dry_run: bool = False) -> list[str]:
    """Reassemble and verify, then pip-install the wheels offline. Returns the pip argv."""
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bundle-", dir=work))
    try:
        wheels = reassemble(bundle, chunk_dirs=chunk_dirs, work=tmp)
        argv = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                "--no-cache-dir", "--upgrade"]
        if target is not None:
            argv += ["--target", str(target)]
        argv += [str(w) for w in wheels]
        if not dry_run:
            proc = subprocess.run(argv, timeout=1800)
            if proc.returncode != 0:
                raise BundleError(f"pip install exited with {proc.returncode}; read its output above")
        return argv
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ CLI


def add_arguments(sub: Any) -> None:
    b = sub.add_parser("build", help="resolve, download, trim and chunk wheels for an offline host")
    b.add_argument("--vllm", required=True, help="vLLM version, e.g. 0.26.0")
    b.add_argument("--python", default="3.12")
    b.add_argument("--platform", action="append", dest="platforms",
                   help="pip --platform tag (repeatable); default manylinux_2_28_x86_64")
    b.add_argument("--host-packages", help="the host's `pip freeze` (bare names: present, any version)")
    b.add_argument("--drop", nargs="*", default=[], help="wheel member paths (fnmatch) to remove")
    b.add_argument("--extra", nargs="*", default=[], help="more root requirements, e.g. transformers==5.5.3")
    b.add_argument("--pin", help="file of name==version (or wheel file names) to use when a name is needed")
    b.add_argument("--exclude", nargs="*", default=[], help="names never bundled (e.g. optional kernels)")
    b.add_argument("--cache", help="wheel cache folder reused across builds (default OUT/../.wheel-cache)")
    b.add_argument("--chunk-mb", type=float, default=60)
    b.add_argument("--out", required=True)
    i = sub.add_parser("install", help="verify, reassemble and pip-install a bundle (stdlib only)")
    i.add_argument("bundle", help="folder holding manifest.json")
    i.add_argument("--chunks", action="append", default=[], help="more folders to look for chunks in")
    i.add_argument("--target", help="pip --target folder (then PYTHONPATH=it); default: this python's env")
    i.add_argument("--work", help="where to reassemble (default: the system temp folder)")
    i.add_argument("--dry-run", action="store_true", help="verify and reassemble only")


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for token in path.read_text().split():
        if token.endswith(".whl"):
            parts = token.split("-")
            pins[normalize(parts[0])] = parts[1]
        elif "==" in token:
            name, version = token.split("==", 1)
            pins[normalize(name)] = version
    return pins


def run_args(args: argparse.Namespace) -> int:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.action == "install":
            argv = install(Path(args.bundle), chunk_dirs=[Path(c) for c in args.chunks],
                           target=Path(args.target) if args.target else None,
                           work=Path(args.work) if args.work else None, dry_run=args.dry_run)
            count = sum(a.endswith(".whl") for a in argv)
            print(f"{'verified' if args.dry_run else 'installed'} {count} wheels"
                  + (f" into {args.target}" if args.target else ""))
            return 0
        target = Target(python=args.python, platforms=tuple(args.platforms or ("manylinux_2_28_x86_64",)))
        host = HostPackages.parse(Path(args.host_packages).read_text()) if args.host_packages else HostPackages()
        out = Path(args.out)
        cache = Path(args.cache) if args.cache else out.parent / ".wheel-cache"
        manifest = build([f"vllm=={args.vllm}", *args.extra], out=out, target=target, host=host, cache=cache,
                         fetch=pip_fetch(target), drop=args.drop, chunk_mb=args.chunk_mb,
                         pins=read_pins(Path(args.pin)) if args.pin else None, exclude=args.exclude, log=log)
        print(f"{len(manifest['wheels'])} wheels, {manifest['total_bytes'] / 2**20:.1f} MiB in "
              f"{len(manifest['chunks'])} chunks under {out}; {len(manifest['skipped'])} names skipped")
        return 0
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bundle", description=__doc__.split("\n\n")[0])
    add_arguments(parser.add_subparsers(dest="action", required=True))
    return run_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
