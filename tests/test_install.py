"""Installing ratchet: the embedded default's exact versions (constraints.txt) lie inside pyproject.toml's
ranges, and those ranges fit a user's own vLLM environment: vLLM 0.26.0's Requires-Dist and the packages of a
GPU host image (experiments/results/). The requirement reading is sandbox/bundle_build.py's (HostPackages, markers)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sandbox.bundle import normalize
from sandbox.bundle_build import HostPackages, Target
from tests.conftest import ROOT

RESULTS = ROOT / "experiments" / "results"
# What pip adds to the GPU host image's Python (h200-host-packages.txt) when vLLM 0.26 is not there yet; with
# vLLM 0.26 installed, openai and pydantic come with it. README.md ("On your GPU host") quotes this list.
HOST_LACKS = {"cryptography", "docker", "gitpython", "openai", "pydantic", "rfc8785", "structlog", "unidiff"}


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _runtime() -> list[Requirement]:
    return [Requirement(r) for r in _project()["dependencies"]]


def _every_requirement() -> list[Requirement]:
    extras = _project()["optional-dependencies"]
    return _runtime() + [Requirement(r) for group in extras.values() for r in group]


def _pins() -> dict[str, str]:
    pins = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalize(name)] = version.strip()
    return pins


def _vllm_requires() -> list[Requirement]:
    """vLLM 0.26.0's unconditional requirements on Linux x86_64, Python 3.12 (its CUDA image's Python)."""
    env = Target(python="3.12").marker_env()
    text = (RESULTS / "vllm-0.26.0-requires-dist.txt").read_text()
    reqs = [Requirement(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def _floor(spec: SpecifierSet) -> Version | None:
    """The lowest version `spec` admits as far as its lower-bound clauses say (None: no lower bound)."""
    floors = [Version(s.version) for s in spec if s.operator in (">=", ">", "==", "~=", "===")]
    return max(floors, default=None)


def test_the_embedded_default_installs_the_pinned_version_of_every_requirement() -> None:
    pins, reqs = _pins(), _every_requirement()
    outside = [f"{r} (pinned {pins[normalize(r.name)]})" for r in reqs
               if normalize(r.name) in pins and not r.specifier.contains(pins[normalize(r.name)], prereleases=True)]
    assert not outside, f"constraints.txt pins outside pyproject.toml's range: {outside}"
    assert {normalize(r.name) for r in reqs} == set(pins), "constraints.txt and pyproject.toml name different packages"


def test_ratchets_runtime_requirements_set_floors_only() -> None:
    """An upper bound or a pin would fight the versions a user's vLLM environment already has."""
    bounded = [str(r) for r in _runtime() if any(s.operator not in (">=", ">") for s in r.specifier)]
    assert not bounded, f"pins or upper bounds in [project.dependencies]: {bounded}; pin in constraints.txt instead"
    test_tools = {"pytest", "pytest-timeout", "mypy", "ruff"}
    assert not test_tools & {normalize(r.name) for r in _runtime()}


def test_ratchet_never_asks_more_than_vllm_0_26_for_a_package_both_require() -> None:
    vllm = {normalize(r.name): r for r in _vllm_requires()}
    shared = [r for r in _runtime() if normalize(r.name) in vllm]
    assert {normalize(r.name) for r in shared} == {"numpy", "openai", "psutil", "pydantic", "pyyaml"}
    for ours in shared:
        theirs = vllm[normalize(ours.name)]
        their_floor, our_floor = _floor(theirs.specifier), _floor(ours.specifier)
        if their_floor is not None and our_floor is not None:
            # vLLM's floor is inside ratchet's range: whatever vLLM installed, ratchet takes as it is
            assert ours.specifier.contains(their_floor, prereleases=True), f"{ours} asks more than vLLM's {theirs}"
        assert all(s.operator in (">=", ">") for s in ours.specifier), f"{ours} could exclude vLLM's {theirs}"


def test_a_gpu_host_keeps_every_package_it_has_and_gets_only_what_it_lacks() -> None:
    host = HostPackages.parse((RESULTS / "h200-host-packages.txt").read_text())
    runtime = _runtime()
    conflicts = [f"{r} vs the host's {host.versions[normalize(r.name)]}" for r in runtime
                 if normalize(r.name) in host.versions and not host.satisfies(r)]
    assert not conflicts, f"pip would change packages the GPU host has: {conflicts}"
    lacks = {normalize(r.name) for r in runtime if normalize(r.name) not in host.versions}
    assert lacks == HOST_LACKS, f"the GPU host now lacks {sorted(lacks)}; update HOST_LACKS and README.md"
    assert host.satisfies(Requirement("numpy>=1.26")) and host.versions["numpy"] == "2.5.2"   # a version read, kept


def _pip_offline_env() -> dict[str, str]:
    """No index, no find-links, no pip config files: pip may use only what the environment already holds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def test_the_documented_install_into_a_vllm_environment_would_add_ratchet_alone(tmp_path: Path) -> None:
    """README's command, dry-run and offline, in this test run's own environment (vLLM, ratchet's requirements):
    with the environment's versions as constraints pip may add ratchet and change nothing it has."""
    checkout = tmp_path / "ratchet"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, checkout / name)
    frozen = tmp_path / "vllm-env.txt"
    listing = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                             text=True, timeout=120, env=_pip_offline_env(), check=True)
    frozen.write_text("\n".join(line for line in listing.stdout.splitlines() if not line.startswith("ratchet==")))
    assert re.search(r"^vllm(-cpu)?==", frozen.read_text(), re.M), "the test environment has no vLLM"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "-c", str(frozen), "-e", str(checkout)],
                          capture_output=True, text=True, timeout=300, env=_pip_offline_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (would,) = [line for line in proc.stdout.splitlines() if line.startswith("Would install")]
    assert would.split()[2:] == ["ratchet-0.1.0"]


def test_the_cpu_torchvision_is_one_version_in_the_offline_and_the_registry_install() -> None:
    """setup.sh installs torchvision's Python side with scripts/install-torchvision-cpu.py; the registry image
    the +cpu build. Both must be torch 2.13's release, or the image processor differs between them."""
    import re

    script = (ROOT / "scripts" / "install-torchvision-cpu.py").read_text()
    dockerfile = (ROOT / "sandbox" / "images" / "Dockerfile.cpu").read_text()
    ours = re.search(r'^VERSION = "([^"]+)"', script, re.M)
    theirs = re.search(r"^ARG TORCHVISION_VERSION=(\S+)", dockerfile, re.M)
    assert ours and theirs and ours.group(1) == theirs.group(1)
    assert "torchvision" not in {normalize(r.name) for r in _every_requirement()}
