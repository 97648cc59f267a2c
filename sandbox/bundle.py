"""Offline install bundles for GPU hosts without a package index: wheels resolved here, chunked, reassembled there.

    build  (here, needs `packaging` and pip with network; sandbox/bundle_build.py): resolve what the host lacks
           from the wheels' Requires-Dist (markers evaluated for the target Python/platform), download with
           `pip download --no-deps --only-binary=:all:`, drop named files from wheels, pack them (`--pack xz`:
           each wheel stored, then xz), add carried files (`--file`, e.g. .deb packages the host lacks), write
           it all as one byte stream cut into chunks of --chunk-mb MiB, plus manifest.json and this file copied
           as install_bundle.py.
    install (there, stdlib only): `python3 install_bundle.py install DIR [--chunks DIR ...] [--target T]`
           checks every chunk's sha256, reassembles the stream (unpacking xz with the stdlib's lzma), checks
           every restored file's sha256, then runs `pip install --no-index --no-deps --no-compile` (into
           --target, else the interpreter's env) and copies the carried files to --files-to (DIR/files).

Manifest (format "ratchet-bundle/2"; "/1", written before packing and carried files, still installs): target
{python, implementation, platforms}, roots, chunk_bytes, packing, wheels [{name, version, file, offset, size,
sha256, unpacked_size, packed, dropped, reason}], files [{file, offset, size, sha256, unpacked_size, packed}],
chunks [{file, offset, size, sha256}], skipped [{name, why}], install {argv, command}. Offsets and sizes index
the concatenated stream (packed bytes); sha256 is the restored file's.

This module imports only the standard library: the install half runs on hosts where ratchet and its
dependencies are not installed. Errors are `BundleError` (exit code 2 from main()).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["BundleError", "reassemble", "install", "main", "MANIFEST", "FORMAT", "PACKINGS", "normalize",
           "sha256_file"]

MANIFEST = "manifest.json"
FORMAT = "ratchet-bundle/2"
_READS = ("ratchet-bundle/1", FORMAT)
PACKINGS = ("none", "xz")
INSTALLER = "install_bundle.py"
_BUF = 1 << 20


class BundleError(Exception):
    """A bundle could not be built, verified or installed; the message says what to do next."""


def normalize(name: str) -> str:
    """PEP 503 project-name normalisation."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_BUF):
            h.update(chunk)
    return h.hexdigest()


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


def read_manifest(bundle: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") not in _READS:
        raise BundleError(f"{bundle / MANIFEST}: format {manifest.get('format')!r}, expected one of {_READS}")
    return manifest


def verify_chunks(bundle: Path, *, chunk_dirs: Iterable[Path] = ()) -> list[Path]:
    """Every chunk found (bundle folder first, then chunk_dirs) with the size and sha256 the manifest says."""
    manifest = read_manifest(bundle)
    roots = [bundle, *chunk_dirs]
    paths = [_find(c["file"], roots) for c in manifest["chunks"]]
    for chunk, path in zip(manifest["chunks"], paths, strict=True):
        if path.stat().st_size != chunk["size"] or sha256_file(path) != chunk["sha256"]:
            raise BundleError(f"chunk {path} is corrupt (size or sha256 differs from the manifest); "
                              "transfer that part again")
    return paths


def _restore(data: Iterable[bytes], packed: str) -> Iterator[bytes]:
    if packed == "none":
        yield from data
        return
    if packed != "xz":
        raise BundleError(f"packing {packed!r} is unknown to this installer; use the install_bundle.py of the bundle")
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    for piece in data:
        yield dec.decompress(piece)
    if not dec.eof:
        raise BundleError("an xz member ends early; rebuild the bundle")


def reassemble(bundle: Path, *, chunk_dirs: Iterable[Path] = (), work: Path) -> list[Path]:
    """Verify chunks, restore the wheels and carried files into `work`, verify each; returns their paths
    (wheels first, in the manifest's order)."""
    manifest = read_manifest(bundle)
    paths = verify_chunks(bundle, chunk_dirs=chunk_dirs)
    work.mkdir(parents=True, exist_ok=True)
    stream = _ChunkReader(paths)
    out = []
    try:
        for rec in [*manifest["wheels"], *manifest.get("files", [])]:
            dest = work / rec["file"]
            h = hashlib.sha256()
            with open(dest, "wb") as f:
                for data in _restore(stream.read_range(rec["offset"], rec["size"]), rec.get("packed", "none")):
                    f.write(data)
                    h.update(data)
            if h.hexdigest() != rec["sha256"]:
                raise BundleError(f"{rec['file']} reassembled with a wrong sha256; rebuild the bundle")
            out.append(dest)
    finally:
        stream.close()
    return out


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
                    raise BundleError("the chunks end before the last file; a chunk is missing")
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
            python: str = sys.executable, work: Path | None = None, dry_run: bool = False,
            files_to: Path | None = None) -> list[str]:
    """Reassemble and verify, then pip-install the wheels offline and copy the carried files to `files_to`
    (default BUNDLE/files). Returns the pip argv."""
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bundle-", dir=work))
    try:
        restored = reassemble(bundle, chunk_dirs=chunk_dirs, work=tmp)
        wheels = [p for p in restored if p.suffix == ".whl"]
        argv = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                "--no-cache-dir", "--upgrade"]
        if target is not None:
            argv += ["--target", str(target)]
        argv += [str(w) for w in wheels]
        if not dry_run:
            proc = subprocess.run(argv, timeout=1800)
            if proc.returncode != 0:
                raise BundleError(f"pip install exited with {proc.returncode}; read its output above")
            carried = [p for p in restored if p.suffix != ".whl"]
            if carried:
                dest = files_to or bundle / "files"
                dest.mkdir(parents=True, exist_ok=True)
                for path in carried:
                    shutil.move(str(path), dest / path.name)
        return argv
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ CLI


def add_arguments(sub: Any) -> None:
    b = sub.add_parser("build", help="resolve, download, trim, pack and chunk wheels for an offline host")
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
    b.add_argument("--file", nargs="*", default=[], dest="files",
                   help="other files the host lacks, carried in the stream (e.g. .deb packages)")
    b.add_argument("--pack", choices=PACKINGS, default="none",
                   help="xz: each wheel stored, then xz (smaller; unpacked by the stdlib on the host)")
    b.add_argument("--chunk-mb", type=float, default=60)
    b.add_argument("--out", required=True)
    i = sub.add_parser("install", help="verify, reassemble and pip-install a bundle (stdlib only)")
    i.add_argument("bundle", help="folder holding manifest.json")
    i.add_argument("--chunks", action="append", default=[], help="more folders to look for chunks in")
    i.add_argument("--target", help="pip --target folder (then PYTHONPATH=it); default: this python's env")
    i.add_argument("--work", help="where to reassemble (default: the system temp folder)")
    i.add_argument("--files-to", help="where the carried files go (default: BUNDLE/files)")
    i.add_argument("--dry-run", action="store_true", help="verify and reassemble only")


def _build(args: argparse.Namespace) -> None:
    from sandbox.bundle_build import HostPackages, Target, build, pip_fetch, read_pins

    target = Target(python=args.python, platforms=tuple(args.platforms or ("manylinux_2_28_x86_64",)))
    host = HostPackages.parse(Path(args.host_packages).read_text()) if args.host_packages else HostPackages()
    out = Path(args.out)
    cache = Path(args.cache) if args.cache else out.parent / ".wheel-cache"
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    manifest = build([f"vllm=={args.vllm}", *args.extra], out=out, target=target, host=host, cache=cache,
                     fetch=pip_fetch(target), drop=args.drop, chunk_mb=args.chunk_mb,
                     pins=read_pins(Path(args.pin)) if args.pin else None, exclude=args.exclude,
                     files=[Path(f) for f in args.files], packing=args.pack, log=log)
    print(f"{len(manifest['wheels'])} wheels and {len(manifest['files'])} files, "
          f"{manifest['unpacked_bytes'] / 2**20:.1f} MiB as {manifest['total_bytes'] / 2**20:.1f} MiB "
          f"({args.pack}) in {len(manifest['chunks'])} chunks under {out}; {len(manifest['skipped'])} names skipped")


def run_args(args: argparse.Namespace) -> int:
    try:
        if args.action == "install":
            argv = install(Path(args.bundle), chunk_dirs=[Path(c) for c in args.chunks],
                           target=Path(args.target) if args.target else None,
                           work=Path(args.work) if args.work else None, dry_run=args.dry_run,
                           files_to=Path(args.files_to) if args.files_to else None)
            count = sum(a.endswith(".whl") for a in argv)
            print(f"{'verified' if args.dry_run else 'installed'} {count} wheels"
                  + (f" into {args.target}" if args.target else ""))
            return 0
        _build(args)
        return 0
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bundle", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser.add_subparsers(dest="action", required=True))
    return run_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
