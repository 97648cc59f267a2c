"""`ratchet sandbox build` (offline CPU image, cached by its inputs hash) and `ratchet sandbox doctor`
(what the docker backend is missing here and how to fix each; exit 1 if it cannot run)."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.commands._common import EXIT_HARNESS, cli_errors, console, err_console

__all__ = ["register"]


@cli_errors
def _build(args: argparse.Namespace) -> int:
    from sandbox.image_build import build_image

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task("planning", total=None)

        def report(what: str, done: float | None, total: float | None) -> None:
            if done is None:
                progress.update(task, description=what, total=None, completed=0)
            else:
                progress.update(task, description=what, total=total, completed=done)

        result = build_image(tag=args.tag, cache_dir=args.cache_dir, force=args.force, progress=report)
        progress.update(task, description="done", total=1, completed=1)
    how = "already built (same inputs hash)" if result.cached else f"built in {result.seconds:.0f} s"
    console.print(f"{result.tag} {result.image_id[:19]} inputs={result.inputs_hash}: {how}")
    return 0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _client_checks(image: str) -> list[Check]:
    from sandbox.docker_backend import connect
    from sandbox.errors import BackendUnavailable
    from sandbox.image_build import find_image, plan_build

    checks: list[Check] = []
    try:
        client = connect()
    except BackendUnavailable as exc:
        return [
            Check(
                "dockerd",
                False,
                str(exc).split(";")[0],
                "scripts/start-dockerd.sh (installs docker.io if absent)",
            )
        ]
    version = client.version().get("Version", "?")
    checks.append(Check("dockerd", True, f"running, server {version}"))
    try:
        img = client.images.get(image)
    except Exception:  # noqa: BLE001 - ImageNotFound or an API error: either way the image is not usable
        checks.append(
            Check("image", False, f"{image} is absent", "ratchet sandbox build (≈5 min the first time)")
        )
        return checks
    labels = img.labels or {}
    versions = f"vllm {labels.get('ratchet.vllm', '?')} torch {labels.get('ratchet.torch', '?')}"
    detail = f"{image} {img.id[:19]} {versions}"
    checks.append(Check("image", True, detail))
    current = plan_build().inputs_hash
    built_from = labels.get("ratchet.inputs")
    own = find_image(client, current) if built_from not in (None, current) else None
    if built_from in (None, current):
        detail = "same inputs hash" if built_from else "no ratchet.inputs label: a user's own image, run as named"
    elif own is not None:
        detail = (f"the tag points at another venv's build ({built_from}); campaigns run {own.id[:19]}, built "
                  "from this venv")
    else:
        detail = f"built from other inputs ({built_from} != {current}), and no image is built from this venv"
    checks.append(
        Check(
            "image matches venv",
            built_from in (None, current) or own is not None,
            detail,
            "ratchet sandbox build (the venv's packages changed, or another checkout built the tag)",
        )
    )
    from sandbox.docker_backend import leftover_containers

    left = leftover_containers(client)
    checks.append(
        Check(
            "leftovers",
            not left,
            f"{len(left)} sandbox container(s) exist" if left else "none",
            "ratchet sandbox prune (only while no campaign is running)",
            required=False,
        )
    )
    runtimes = client.info().get("Runtimes", {})
    gpu = "nvidia" in runtimes or shutil.which("nvidia-container-runtime-hook") is not None
    checks.append(
        Check(
            "GPU runtime",
            gpu,
            "nvidia container runtime found" if gpu else "none (CPU only)",
            "install nvidia-container-toolkit and restart dockerd (GPU hosts only)",
            required=False,
        )
    )
    return checks


def _doctor_checks(image: str, need_gpu: bool) -> list[Check]:
    checks = [
        Check(
            "root",
            os.geteuid() == 0,
            f"uid {os.geteuid()}",
            "run as root: the per-launch firewall rule and image build need it",
        )
    ]
    try:
        import docker  # noqa: F401

        checks.append(Check("docker SDK", True, "importable"))
    except ImportError:
        return checks + [Check("docker SDK", False, "not importable", "pip install 'docker>=7.1'")]
    cli = shutil.which("docker")
    checks.append(
        Check(
            "docker client", cli is not None, cli or "absent", "apt-get install -y docker.io", required=False
        )
    )
    ipt = shutil.which("iptables")
    checks.append(Check("iptables", ipt is not None, ipt or "absent", "apt-get install -y iptables"))
    deb = shutil.which("debootstrap")
    checks.append(
        Check(
            "debootstrap",
            deb is not None,
            deb or "absent (only needed to build the image)",
            "apt-get install -y debootstrap",
            required=False,
        )
    )
    checks += _client_checks(image)
    if need_gpu:
        checks = [
            Check(c.name, c.ok, c.detail, c.fix, required=True) if c.name == "GPU runtime" else c
            for c in checks
        ]
    return checks


def _doctor(args: argparse.Namespace) -> int:
    start = time.monotonic()
    checks = _doctor_checks(args.image, args.gpus)
    table = Table(title=f"docker sandbox ({time.monotonic() - start:.1f} s)")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column)
    for c in checks:
        status = (
            "[green]ok[/green]" if c.ok else "[red]missing[/red]" if c.required else "[yellow]warn[/yellow]"
        )
        table.add_row(c.name, status, c.detail, "" if c.ok else c.fix)
    console.print(table)
    blocking = [c for c in checks if c.required and not c.ok]
    if blocking:
        err_console.print(
            f"the docker backend cannot run here: fix {', '.join(c.name for c in blocking)} "
            f"(see the fix column), then run `ratchet sandbox doctor` again"
        )
        return EXIT_HARNESS
    console.print("the docker backend can run here")
    return 0


@cli_errors
def _prune(args: argparse.Namespace) -> int:
    from sandbox.docker_backend import connect, prune

    removed = prune(connect())
    console.print(", ".join(f"{n} {what}" for what, n in removed.items()) + " removed")
    return 0


def register(subparsers: Any) -> None:
    from sandbox.image_build import DEFAULT_CACHE, DEFAULT_TAG

    parser = subparsers.add_parser("sandbox", help="the docker sandbox: build its image offline, diagnose it")
    sub = parser.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    build = sub.add_parser("build", help="build the CPU image from Debian + this venv (no registry; cached)")
    build.add_argument("--tag", default=DEFAULT_TAG, help=f"image tag (default {DEFAULT_TAG})")
    build.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"debootstrap base and staging (default {DEFAULT_CACHE}; env RATCHET_SANDBOX_CACHE)",
    )
    build.add_argument(
        "--force", action="store_true", help="rebuild even if an image with the same inputs exists"
    )
    build.set_defaults(func=_build)
    doctor = sub.add_parser(
        "doctor", help="what the docker backend is missing and how to fix it (exit 3 if blocked)"
    )
    doctor.add_argument("--image", default=DEFAULT_TAG, help=f"image to check (default {DEFAULT_TAG})")
    doctor.add_argument("--gpus", action="store_true", help="also require a GPU container runtime")
    doctor.set_defaults(func=_doctor)
    prune = sub.add_parser(
        "prune",
        help="remove sandbox containers, networks and firewall rules (run only while no campaign runs)",
    )
    prune.set_defaults(func=_prune)
