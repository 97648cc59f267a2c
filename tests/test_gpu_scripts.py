"""The offline GPU host's scripts that can run here: the shared SANDBOX_BACKEND helper (scripts/gpu-lib.sh) and the
window's dry run and plan (scripts/gpu_window.py) on small stand-ins (a bundle of small wheels, vLLM trees whose
kernel is plain torch)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from agent.spec import load_spec
from sandbox.bundle_build import HostPackages, build
from tests.bundle.test_bundle import PY312, local_fetch, make_wheel
from tests.kernel import vllm_fakes

ROOT = Path(__file__).resolve().parents[1]


def _window() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_window", ROOT / "scripts" / "gpu_window.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _helper(spec: Path, backend: str | None) -> subprocess.CompletedProcess[str]:
    env = "" if backend is None else f"SANDBOX_BACKEND={backend} "
    return subprocess.run(["bash", "-c", f'source scripts/gpu-lib.sh; {env}spec_for_backend "$1"', "_", str(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("name", ["gemma4-e2b-gpu.yaml", "gemma4-e2b-gpu-campaign.yaml",
                                  "gemma4-e2b-gpu-kernel-serving.yaml", "gemma4-e2b-h100-kernel-serving.yaml"])
def test_sandbox_backend_gives_a_copy_of_the_spec_beside_it_with_that_backend(name: str) -> None:
    spec = ROOT / "experiments" / name
    assert _helper(spec, None).stdout.strip() == str(spec)
    done = _helper(spec, "unisolated")
    copy = Path(done.stdout.strip())
    try:
        assert done.returncode == 0 and copy.parent == spec.parent and copy != spec
        assert "sandbox.backend: unisolated" in done.stderr
        loaded = load_spec(copy)
        assert loaded.sandbox.backend == "unisolated" and loaded.sandbox.gpus == load_spec(spec).sandbox.gpus
        assert loaded.parity.prompts == load_spec(spec).parity.prompts      # relative paths still resolve
    finally:
        copy.unlink(missing_ok=True)


def test_an_unknown_sandbox_backend_is_refused(tmp_path: Path) -> None:
    done = _helper(ROOT / "experiments" / "gemma4-e2b-gpu.yaml", "nsjail")
    assert done.returncode == 2 and "one of auto, docker, bwrap, unisolated" in done.stderr
    no_sandbox = tmp_path / "spec.yaml"
    no_sandbox.write_text("name: x\n")
    done = _helper(no_sandbox, "bwrap")
    assert done.returncode == 1 and "could not set sandbox.backend" in done.stderr


def test_every_kernel_patch_has_its_parent_in_the_window_plan() -> None:
    window = _window()
    patches = {p.stem for p in window.PATCHES.glob("*.patch")}
    assert patches == set(window.PARENTS)
    assert all(parent is None or parent in patches for parent in window.PARENTS.values())


def test_the_kernel_check_passes_a_right_kernel_and_fails_one_that_ignores_the_window(tmp_path: Path) -> None:
    window = _window()
    vllm_fakes.write_vllm_tree(tmp_path / "right")
    vllm_fakes.write_vllm_tree(tmp_path / "wrong", vllm_fakes.IGNORES_WINDOW)
    right = window.check_tree(tmp_path / "right")
    assert set(right) == {s["name"] for s in window.SHAPES} and all(r["ok"] for r in right.values())
    wrong = window.check_tree(tmp_path / "wrong")
    failed = {name for name, r in wrong.items() if not r["ok"]}
    assert failed == {s["name"] for s in window.SHAPES if s.get("sliding_window")}


def test_the_bundle_check_catches_a_corrupt_part_and_the_plan_counts_the_parts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    window = _window()
    index = tmp_path / "index"
    make_wheel(index, "app", "1.0")
    bundle = tmp_path / "bundle"
    build(["app==1.0"], out=bundle, target=PY312, host=HostPackages(), cache=tmp_path / "cache",
          fetch=local_fetch(index), chunk_mb=300 / 2**20, packing="xz")
    assert window.check_bundle(bundle, tmp_path / "re")
    window.print_plan(bundle)
    parts = len(list(bundle.glob("part-*")))
    assert f"({parts} bundle parts)" in capsys.readouterr().out
    chunk = bundle / "part-000" / "chunk-000.bin"
    chunk.write_bytes(b"\0" + chunk.read_bytes()[1:])
    assert not window.check_bundle(bundle, tmp_path / "re2")
    assert "chunk-000.bin is corrupt" in capsys.readouterr().out
