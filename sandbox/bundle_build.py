"""The build half of offline install bundles (`ratchet bundle build`, here, with a package index): resolve what the
host lacks, download, drop files, pack, chunk, write the manifest. sandbox/bundle.py holds the format and the
install half (stdlib only: it travels to the host as install_bundle.py); this module needs `packaging` and pip.

Packing (`pack="xz"`): each wheel is rewritten with every member stored, then xz-compressed (a deflated member
hides the redundancy xz finds: vLLM 0.26.0's FA3 library is 36.6 MiB deflated, 10.4 MiB as xz of the stored
bytes); carried files are xz-compressed as they are. Packed blobs are cached beside the wheels (`CACHE/packed/`),
keyed by the source's sha256, so a rebuild compresses only what changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from sandbox.bundle import (
    FORMAT,
    INSTALLER,
    MANIFEST,
    PACKINGS,
    BundleError,
    normalize,
    sha256_file,
)

__all__ = ["Target", "HostPackages", "Resolved", "resolve", "drop_files", "pack", "write_chunks", "build", "read_pins",
           "pip_fetch"]

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


def write_chunks(files: list[tuple[str, Path]], out_dir: Path,
                 chunk_bytes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Concatenate the files (name, path) into one stream cut into `chunk_bytes` pieces, each in its own folder
    part-NNN/ (so each can be carried to the host on its own). Returns (records with stream offsets, chunk records)."""
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

    for name, path in files:
        start = offset
        with open(path, "rb") as f:
            while data := f.read(1 << 20):
                while data:
                    if current is None:
                        (out_dir / f"part-{index:03d}").mkdir(parents=True, exist_ok=True)
                        current = open(out_dir / f"part-{index:03d}" / f"chunk-{index:03d}.bin", "wb")  # noqa: SIM115
                    take = data[: chunk_bytes - written]
                    current.write(take)
                    h.update(take)
                    written += len(take)
                    offset += len(take)
                    data = data[len(take):]
                    if written == chunk_bytes:
                        close()
        records.append({"file": name, "offset": start, "size": offset - start})
    close()
    return records, chunks


def _stored_copy(wheel: Path, dest: Path) -> None:
    """The same wheel with every member stored (uncompressed): names, dates and modes kept; pip installs it alike."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            copy.external_attr, copy.create_system = info.external_attr, info.create_system
            out.writestr(copy, src.read(info), compress_type=zipfile.ZIP_STORED)


def pack(path: Path, cache: Path, *, packing: str) -> tuple[Path, str, int]:
    """(the bytes to put in the stream, sha256 and size of the file the host restores from them). `none`: the
    file itself. `xz`: a wheel stored, then xz; any other file xz as it is; cached by the source's sha256."""
    if packing not in PACKINGS:
        raise BundleError(f"packing {packing!r}: one of {', '.join(PACKINGS)}")
    if packing == "none":
        return path, sha256_file(path), path.stat().st_size
    key = sha256_file(path)
    blob, meta = cache / "packed" / f"{key}.xz", cache / "packed" / f"{key}.json"
    if not (blob.exists() and meta.exists()):
        blob.parent.mkdir(parents=True, exist_ok=True)
        restored = blob.with_suffix(".plain")
        if path.suffix == ".whl":
            _stored_copy(path, restored)
        else:
            shutil.copyfile(path, restored)
        tmp = blob.with_suffix(".tmp")
        with open(restored, "rb") as src, lzma.open(tmp, "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        meta.write_text(json.dumps({"sha256": sha256_file(restored), "size": restored.stat().st_size}))
        restored.unlink()
        tmp.rename(blob)
    info = json.loads(meta.read_text())
    return blob, info["sha256"], info["size"]


def build(roots: list[str], *, out: Path, target: Target, host: HostPackages, cache: Path, fetch: Fetch,
          drop: Iterable[str] = (), chunk_mb: float = 60, pins: dict[str, str] | None = None,
          exclude: Iterable[str] = (), files: Iterable[Path] = (), packing: str = "none",
          log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Resolve, drop, pack and chunk the wheels (then `files`, carried as they are, e.g. .deb packages the host
    lacks) into `out`; returns the manifest it writes."""
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; remove it or choose another --out")
    resolved = resolve(roots, target=target, host=host, cache=cache, fetch=fetch, pins=pins, exclude=exclude, log=log)
    staging = out / ".staging"
    staging.mkdir(parents=True)
    entries: list[dict[str, Any]] = []
    for name in sorted(resolved.wheels):
        wheel = resolved.wheels[name]
        trimmed = staging / wheel.name
        dropped = drop_files(wheel, drop, trimmed) if drop else []
        if dropped:
            log(f"- {wheel.name}: dropped {len(dropped)} files")
        version = str(_parse_wheel_name(wheel.name)[1])
        entries.append({"kind": "wheel", "source": trimmed if dropped else wheel, "file": wheel.name, "name": name,
                        "version": version, "dropped": dropped, "reason": resolved.reasons[name]})
    for path in files:
        if not path.is_file():
            raise BundleError(f"--file {path}: not a file")
        entries.append({"kind": "file", "source": path, "file": path.name})
    for entry in entries:
        entry["stream"], entry["sha256"], entry["unpacked_size"] = pack(entry["source"], cache, packing=packing)
        log(f"packed {entry['file']}: {entry['unpacked_size'] / 2**20:.1f} -> "
            f"{entry['stream'].stat().st_size / 2**20:.1f} MiB ({packing})")
    records, chunks = write_chunks([(e["file"], e["stream"]) for e in entries], out, int(chunk_mb * (1 << 20)))
    shutil.rmtree(staging)
    for rec, entry in zip(records, entries, strict=True):
        rec.update({k: v for k, v in entry.items() if k not in ("source", "stream", "kind")}, packed=packing)
    manifest = _manifest(roots, target=target, chunk_mb=chunk_mb, packing=packing, resolved=resolved,
                         wheels=[r for r, e in zip(records, entries, strict=True) if e["kind"] == "wheel"],
                         files=[r for r, e in zip(records, entries, strict=True) if e["kind"] == "file"],
                         chunks=chunks)
    from sandbox import bundle as installer

    shutil.copy2(Path(installer.__file__), out / INSTALLER)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _parse_wheel_name(name: str) -> tuple[Any, ...]:
    from packaging.utils import parse_wheel_filename

    return parse_wheel_filename(name)


def _manifest(roots: list[str], *, target: Target, chunk_mb: float, packing: str, resolved: Resolved,
              wheels: list[dict[str, Any]], files: list[dict[str, Any]],
              chunks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "target": asdict(target), "roots": roots, "chunk_bytes": int(chunk_mb * (1 << 20)),
            "packing": packing, "wheels": wheels, "files": files, "chunks": chunks,
            "skipped": [{"name": n, "why": w} for n, w in sorted(resolved.skipped.items())],
            "total_bytes": sum(c["size"] for c in chunks),
            "unpacked_bytes": sum(r["unpacked_size"] for r in wheels + files),
            "install": {"argv": ["python3", INSTALLER, "install", ".", "--target", "SITE"],
                        "command": f"python3 {INSTALLER} install DIR [--chunks DIR ...] [--target SITE] "
                                   "[--files-to DIR]; then PYTHONPATH=SITE (or omit --target to install into "
                                   "python3's env); carried files land in --files-to (default DIR/files)"}}


def read_pins(path: Path) -> dict[str, str]:
    """name==version (or wheel file names), whitespace-separated; `#` starts a comment."""
    pins = {}
    for line in path.read_text().splitlines():
        for token in line.split("#", 1)[0].split():
            if token.endswith(".whl"):
                parts = token.split("-")
                pins[normalize(parts[0])] = parts[1]
            elif "==" in token:
                name, version = token.split("==", 1)
                pins[normalize(name)] = version
    return pins
