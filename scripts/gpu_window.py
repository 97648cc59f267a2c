"""A GPU window only times: everything that needs no GPU is checked here first, on CPU, and the host's plan is printed
with the seconds each step is expected to take.

    python3 scripts/gpu_window.py dry-run [--bundle DIR] [--only bundle,kernels,specs]
    python3 scripts/gpu_window.py plan

dry-run (the CPU set-up's venv: torch and triton for the interpreter; scripts/gpu-window.sh picks it):
  bundle   every chunk and every restored wheel and file against the manifest's sha256, as install_bundle.py does
           on the host (no pip); the seconds it takes bound the host's restore step
  kernels  every patch under experiments/kernels/vllm_unified_attention/ applied in its series (PARENTS) to vLLM
           0.26.0's triton_unified_attention.py, taken from the bundle's vLLM wheel, then checked against the
           float64 reference in Triton's interpreter (TRITON_INTERPRET=1, float16: the interpreter's bf16 dot is
           wrong; the patched fast paths need 16-bit KV) at small shapes with E2B's head layout (8 query heads on 1
           KV head, head dims 256 and 512, windows, a chunk beside decodes), through the harness's
           vllm-unified-attention interface (paged KV in shuffled blocks); one process per build
  specs    every spec under experiments/ loads; the GPU specs' held prompts cover their grids
Each step prints its own seconds; exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PATCHES = ROOT / "experiments" / "kernels" / "vllm_unified_attention"
KERNEL = "vllm/v1/attention/ops/triton_unified_attention.py"
# Each patch and the one it is written against (None: vLLM 0.26.0's file); the patches' own headers say so.
PARENTS: dict[str, str | None] = {
    "vllm-0.26-gemma4-tunables": None,
    "window-segments": "vllm-0.26-gemma4-tunables",
    "h200-prefill-tunables": "window-segments",
    "h200-prefill-d512-m64w8": "h200-prefill-tunables",
    "h200-prefill-d512-m32w8": "h200-prefill-tunables",
    "paged-fast-paths": "h200-prefill-d512-m64w8",
    "paged-prefill-order-lazy": "paged-fast-paths",
    "paged-prefill-dsplit": "paged-prefill-order-lazy",
    "paged-decode-fused": "paged-fast-paths",
    "paged-probe-knobs": "paged-prefill-order-lazy",
    "series-through-dsplit": "vllm-0.26-gemma4-tunables",
}
# E2B's head layout at sizes the interpreter runs in seconds: decode on both head sizes (the 3D split path),
# prefill with and without a window, a prefill chunk over earlier keys, and a chunk beside decodes.
SHAPES = [
    {"name": "decode-d256-window", "batch": 2, "q_len": 1, "kv_len": 80, "head_dim": 256, "sliding_window": 32},
    {"name": "decode-d512", "batch": 2, "q_len": 1, "kv_len": 70, "head_dim": 512},
    {"name": "prefill-d256-window", "batch": 1, "q_len": 40, "kv_len": 40, "head_dim": 256, "sliding_window": 16},
    {"name": "prefill-d512-chunk", "batch": 1, "q_len": 24, "kv_len": 56, "head_dim": 512},
    {"name": "mixed-d256", "batch": 1, "q_len": 12, "kv_len": 40, "head_dim": 256, "sliding_window": 24,
     "decodes": 3, "decode_kv_len": 70},
]
CHECK = """
import json, sys, torch
from pathlib import Path
from harness.kernel.config import CorrectnessConfig, ShapeConfig
from harness.kernel.correctness import check_kernel
from harness.kernel.interfaces import read_backend_constants
from harness.kernel.loader import load_kernel
tree = Path(sys.argv[1])
lk = load_kernel(tree, sys.argv[2], "unified_attention", tag="dry-run", as_package=True)
backend = read_backend_constants(tree)
print(json.dumps({s["name"]: check_kernel(lk.fn, ShapeConfig(**s), CorrectnessConfig(), dtype=torch.float16,
      device=torch.device("cpu"), seed=i, interface="vllm-unified-attention", backend=backend).as_json()
      for i, s in enumerate(json.loads(sys.argv[3]))}))
"""


# The GPU host's steps from bare to the first measured cell: (name, command, expected seconds, where the figure comes
# from, whether it runs beside the others). Staging is per part; the part count is read from the built bundle.
STAGE_S_PER_PART = 30     # carrying one part (up to 58 MiB) over and staging it: 5 parts took 2-3 min on an H200 host
PLAN = [
    ("train", "bash scripts/gpu-campaign.sh train", 90, "estimate from FLOPs and the H200's measured training rate "
     "(experiments/models/gemma4-e2b-shaped/README.md); needs only the checkout and the host's torch, so it starts "
     "at once and runs while the parts arrive", True),
    ("stage", "bash scripts/gpu-stage.sh", None, f"{STAGE_S_PER_PART} s a part (5 parts of 58 MiB: 2-3 min on the "
     "H200 host), the part count from the bundle", False),
    ("setup", "bash scripts/gpu-setup.sh", 50, "the bundle's restore and pip install took 13 s on a 2-core CPU "
     "(install_bundle.py into a Python 3.12 venv), the tools 1 s, imports and tokenizer ~10 s, the workspace copy "
     "~20 s", False),
    ("first cell", "CELLS=in2048/out128 REPEATS=1 bash scripts/gpu-measure.sh", 200, "a cold server start of the E2B "
     "spec, 169-184 s on an H200 (results/compile-cache-startup-h200.json; 184 s in an offline benchmark of E2B), "
     "and one run with its warm-ups; waits for the training first", False),
]


def print_plan(bundle: Path) -> None:
    parts = 3
    if (bundle / "manifest.json").is_file():
        parts = len(json.loads((bundle / "manifest.json").read_text())["chunks"])
    print(f"GPU host plan, bare host to the first measured cell ({parts} bundle parts); every script prints its own "
          "seconds per step:")
    t, background = 0, 0
    for name, command, seconds, basis, beside in PLAN:
        expected = parts * STAGE_S_PER_PART if seconds is None else seconds
        start = 0 if beside else t
        print(f"  t={start:4d} s  {name:10s} ~{expected:3d} s  {command}\n{'':22s}({basis})")
        if beside:
            background = max(background, expected)
        else:
            t += expected
    first = max(t, background)
    print(f"  first cell measured at ~{first} s ({first / 60:.1f} min); the cold server start is the largest part "
          "(a warm compile cache starts it in 57 s: results/compile-cache-startup-h200.json)")


def timed(name: str, fn: Callable[[], bool]) -> bool:
    t0 = time.monotonic()
    print(f"== {name}", flush=True)
    ok = fn()
    print(f"== {name}: {'ok' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s", flush=True)
    return ok


def check_bundle(bundle: Path, work: Path) -> bool:
    from sandbox.bundle import BundleError, read_manifest, reassemble

    try:
        restored = reassemble(bundle, work=work)
    except BundleError as exc:
        print(f"  {exc}")
        return False
    manifest = read_manifest(bundle)
    print(f"  {len(manifest['chunks'])} chunks and {len(restored)} restored files match the manifest's sha256 "
          f"({manifest['total_bytes'] / 2**20:.1f} MiB carried, {manifest.get('unpacked_bytes', 0) / 2**20:.1f} MiB "
          f"restored, packing {manifest.get('packing', 'none')})")
    return True


def _vllm_sources(wheel: Path, dest: Path) -> Path:
    """The four files of vLLM's wheel the stub tree takes (the kernel, its helpers, KVQuantMode, the backend's
    constants)."""
    names = [KERNEL, "vllm/v1/attention/ops/triton_attention_helpers.py", "vllm/v1/kv_cache_interface.py",
             "vllm/v1/attention/backends/triton_attn.py"]
    with zipfile.ZipFile(wheel) as zf:
        for name in names:
            zf.extract(name, dest)
    return dest


def build_trees(wheel: Path, work: Path) -> dict[str, Path]:
    """stock and one tree per patch (its series applied in order), each a stub `vllm` package."""
    from experiments.vllm_kernel_stock_vs_best import _stub_tree

    unknown = sorted({p.stem for p in PATCHES.glob("*.patch")} ^ set(PARENTS))
    if unknown:
        raise SystemExit(f"patches and PARENTS differ: {', '.join(unknown)}; add the new patch's parent to PARENTS")
    source = _vllm_sources(wheel, work / "wheel")
    trees = {"stock": work / "stock"}
    _stub_tree(trees["stock"], source)
    for name in PARENTS:
        chain, parent = [name], PARENTS[name]
        while parent:
            chain.insert(0, parent)
            parent = PARENTS[parent]
        tree = work / name
        shutil.copytree(trees["stock"], tree)
        subprocess.run(["git", "init", "-q"], cwd=tree, check=True)   # apply inside this tree, not the checkout
        for link in chain:
            done = subprocess.run(["git", "apply", str(PATCHES / f"{link}.patch")], cwd=tree, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                after = " -> ".join(chain[:chain.index(link)]) or "stock"
                raise SystemExit(f"{link}.patch does not apply after {after}: {done.stderr.strip()[:400]}")
        shutil.rmtree(tree / ".git")
        trees[name] = tree
    return trees


def check_tree(tree: Path, shapes: list[dict[str, object]] = SHAPES) -> dict[str, dict[str, object]]:
    """One build's kernel on every shape, in a process of its own under Triton's interpreter: {shape: result}."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHECK, str(tree), KERNEL, json.dumps(shapes)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"(load)": {"ok": False, "failures": [proc.stderr.strip()[-600:]]}}
    results: dict[str, dict[str, object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


def check_kernels(wheel: Path, work: Path, *, jobs: int = 2) -> bool:
    from concurrent.futures import ThreadPoolExecutor

    trees = build_trees(wheel, work)
    print(f"  {len(trees) - 1} patches apply to {wheel.name}'s {KERNEL.rsplit('/', 1)[1]} in their series")
    ok = True
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for name, results in zip(trees, pool.map(check_tree, trees.values()), strict=True):
            bad = {s: r["failures"] for s, r in results.items() if not r["ok"]}
            worst = max(float(str(r["rel_l2"])) for r in results.values()) if not bad else 0.0
            print(f"  {name}: " + (f"FAIL {json.dumps(bad)[:600]}" if bad else
                                   f"{len(results)} shapes right (rel L2 <= {worst:.1e})"), flush=True)
            ok = ok and not bad
    return ok


def check_specs() -> bool:
    from agent.campaign import check_parity_coverage
    from agent.kernel_spec import is_kernel_spec, load_kernel_spec
    from agent.spec import load_spec

    ok = True
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        try:
            if is_kernel_spec(path):
                load_kernel_spec(path)
            else:
                spec = load_spec(path)
                if spec.hardware == "gpu" and spec.parity.uncovered is None:
                    check_parity_coverage(spec)
        except Exception as exc:  # noqa: BLE001 - every spec is reported, then the step fails
            print(f"  {path.name}: {type(exc).__name__}: {str(exc)[:400]}")
            ok = False
    print(f"  {len(list((ROOT / 'experiments').glob('*.yaml')))} specs checked")
    return ok


def dry_run(args: argparse.Namespace) -> int:
    steps = set(args.only.split(","))
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu-window-", dir=args.work) as tmp:
        work = Path(tmp)
        if "bundle" in steps:
            ok &= timed(f"bundle {args.bundle}: checksums and restore", lambda: check_bundle(args.bundle, work / "re"))
        if "kernels" in steps and not all(importlib.util.find_spec(m) for m in ("torch", "triton")):
            print("== kernel patches: FAILED, not checked: this python has no torch or triton (the CPU set-up's .venv "
                  "has both: ./setup.sh, or PY=... for scripts/gpu-window.sh)")
            ok, steps = False, steps - {"kernels"}
        if "kernels" in steps:
            wheels = sorted((work / "re").glob("vllm-0.26.0-*.whl")) or sorted(args.wheels.glob("vllm-0.26.0-*.whl"))
            if not wheels:
                print(f"no vLLM 0.26.0 wheel in the bundle or {args.wheels}: run scripts/gpu-build-bundle.sh")
                return 1
            ok &= timed("kernel patches: apply, correctness in Triton's interpreter",
                        lambda: check_kernels(wheels[0], work / "kernels", jobs=args.jobs))
        if "specs" in steps:
            ok &= timed("specs load", check_specs)
    print("dry run: " + ("every check passed" if ok else "FAILED (above)"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dry-run", help="check here what the GPU host will need")
    d.add_argument("--bundle", type=Path, default=ROOT / ".bundle" / "h200-vllm026")
    d.add_argument("--wheels", type=Path, default=ROOT / ".whl" / "cache", help="where else to find vLLM's wheel")
    d.add_argument("--only", default="bundle,kernels,specs")
    d.add_argument("--work", help="scratch folder (default: the system temp folder)")
    d.add_argument("--jobs", type=int, default=2, help="kernel builds checked at once")
    sub.add_parser("plan", help="print the GPU host's steps and their expected seconds")
    args = parser.parse_args(argv)
    if args.command == "plan":
        print_plan(ROOT / ".bundle" / "h200-vllm026")
        return 0
    return dry_run(args)


if __name__ == "__main__":
    raise SystemExit(main())
