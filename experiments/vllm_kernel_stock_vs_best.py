"""vLLM 0.26's unified attention, stock vs the accepted series (the prelude, then the four patches the H200 kernel
campaign accepted), through ratchet's own kernel runner on every shape of vllm-unified-attention-e2b.yaml (mixed
batches included), and an A/A (stock vs a copy of itself) in the same session: the A/A says how far a ratio moves
with nothing changed. No vLLM install: each build is a stub `vllm` package holding the two kernel files from vLLM's
wheel and only what they import (envs, logger, platforms, triton_utils, KVQuantMode, the backend's two constants).

    python3 experiments/vllm_kernel_stock_vs_best.py prepare OUT --vllm-py DIR   # DIR: vLLM 0.26.0's wheel, unzipped
    python3 experiments/vllm_kernel_stock_vs_best.py run OUT      # on the GPU host: torch, triton, pydantic
    python3 experiments/vllm_kernel_stock_vs_best.py table OUT

`prepare` needs ratchet's environment (it loads the spec); `run` needs only what the runner imports, so an offline
GPU host without ratchet's dependencies takes the pydantic wheels and this checkout. results/vllm-kernel-mixed-h200.md
is one such session.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SPEC = ROOT / "experiments" / "vllm-unified-attention-e2b.yaml"
PATCHES = ROOT / "experiments" / "kernels" / "vllm_unified_attention"
SERIES = ["vllm-0.26-gemma4-tunables", "window-segments", "h200-prefill-tunables", "h200-prefill-d512-m64w8",
          "paged-fast-paths"]
OPS = "vllm/v1/attention/ops"
# (A, B) builds of each request
PAIRS = {"aa": ("stock", "stock-copy"), "ab": ("stock", "best")}

STUBS = {
    "vllm/envs.py": "VLLM_BATCH_INVARIANT = False\n",
    "vllm/logger.py": "import logging\n\n\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/platforms/__init__.py": (
        "import torch\n\n\nclass _Platform:\n    def fp8_dtype(self):\n        return torch.float8_e4m3fn\n\n"
        "    def is_device_capability_family(self, family):\n"
        "        # False on CPU (scripts/gpu_window.py runs the kernels in Triton's interpreter)\n"
        "        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] * 10 == family\n\n\n"
        "current_platform = _Platform()\n"),
    "vllm/triton_utils/__init__.py": "import triton\nfrom triton import language as tl\n\n__all__ = ['tl', 'triton']\n",
}


def _kv_quant_mode(wheel: Path) -> str:
    """vLLM's KVQuantMode class, cut out of its kv_cache_interface.py (the rest of that file imports vLLM's config)."""
    source = (wheel / "vllm/v1/kv_cache_interface.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "KVQuantMode")
    return "from enum import IntEnum\n\n\n" + (ast.get_source_segment(source, node) or "") + "\n"


def _stub_tree(tree: Path, wheel: Path) -> None:
    from harness.kernel.interfaces import BACKEND_FILE, read_backend_constants

    for rel, text in STUBS.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    for pkg in ("vllm", "vllm/v1", "vllm/v1/attention", OPS, "vllm/v1/attention/backends"):
        (tree / pkg).mkdir(parents=True, exist_ok=True)
        (tree / pkg / "__init__.py").touch()
    (tree / "vllm/v1/kv_cache_interface.py").write_text(_kv_quant_mode(wheel))
    for name in ("triton_attention_helpers.py", "triton_unified_attention.py"):
        shutil.copy(wheel / OPS / name, tree / OPS / name)
    constants = read_backend_constants(wheel)        # the wheel's own values, as the harness reads them
    (tree / BACKEND_FILE).write_text(f"MIN_LAUNCH_GRID_SIZE_2D = {constants.min_launch_grid_size_2d}\n"
                                     f"NUM_PAR_SOFTMAX_SEGMENTS = {constants.num_par_softmax_segments}\n")


def prepare(out: Path, wheel: Path) -> None:
    from agent.kernel_campaign import kernel_request
    from agent.kernel_spec import load_kernel_spec

    trees = out / "trees"
    shutil.rmtree(trees, ignore_errors=True)
    _stub_tree(trees / "stock", wheel)
    shutil.copytree(trees / "stock", trees / "stock-copy")
    shutil.copytree(trees / "stock", trees / "best")
    # a repository of its own: inside another one (this checkout), `git apply` takes paths from that one's root and
    # skips every file of the patch, exit status 0
    subprocess.run(["git", "init", "-q"], cwd=trees / "best", check=True)
    for name in SERIES:
        subprocess.run(["git", "apply", str(PATCHES / f"{name}.patch")], cwd=trees / "best", check=True)
    shutil.rmtree(trees / "best" / ".git")
    kernel = f"{OPS}/triton_unified_attention.py"
    if (trees / "best" / kernel).read_bytes() == (trees / "stock" / kernel).read_bytes():
        raise SystemExit(f"the series changed nothing in {kernel}: not a stock vs best")
    text = SPEC.read_text().replace("  # source: the installed vllm package (default)",
                                    f"  source: {trees / 'stock' / 'vllm'}")
    text = text.replace("prelude: kernels/", f"prelude: {SPEC.parent}/kernels/")
    (out / "spec.yaml").write_text(text)
    spec = load_kernel_spec(out / "spec.yaml")
    for name, (a, b) in PAIRS.items():
        req = kernel_request(spec, {a: trees / a, b: trees / b}, roofline=True)
        (out / f"request-{name}.json").write_text(req.model_copy(update={"seed": secrets.randbits(31)})
                                                  .model_dump_json(indent=1))
    print(f"{out}: trees {', '.join(sorted(p.name for p in trees.iterdir()))}; {len(spec.shapes)} shapes")


def run(out: Path) -> None:
    """Each request with its builds at OUT/trees here, through `python -m harness.kernel.runner`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for name in PAIRS:
        req = json.loads((out / f"request-{name}.json").read_text())
        req["builds"] = {tag: str((out / "trees" / tag).resolve()) for tag in req["builds"]}
        (out / f"request-{name}.here.json").write_text(json.dumps(req, indent=1))
        with open(out / f"runner-{name}.log", "w") as log:
            subprocess.run([sys.executable, "-m", "harness.kernel.runner", str(out / f"request-{name}.here.json"),
                            str(out / f"result-{name}.json")], cwd=ROOT, env=env, stdout=log, stderr=log, check=True)
        print(f"{name}: {out / f'result-{name}.json'}")


def rows(result: dict, a: str, b: str) -> tuple[object, list[dict]]:
    """The A/B as ratchet judges it, and one row per shape: µs, % of the copy ceiling, TFLOP/s, speedup [95 % CI]."""
    from harness.config import StatsConfig
    from harness.kernel.compare import compare

    ab = compare(result, a=a, b=b, stats=StatsConfig(),
                 expected_sha256={t: result["builds"][t]["sha256"] for t in (a, b)})
    out = []
    for name, shape in result["shapes"].items():
        before, after = shape["builds"][a], shape["builds"][b]
        ci = ab.shapes[name]
        out.append({"shape": name, "a_us": before["median_us"], "b_us": after["median_us"],
                    "a_pct_hbm": before["attainment"]["pct_hbm"], "b_pct_hbm": after["attainment"]["pct_hbm"],
                    "a_tflop_s": before["attainment"]["achieved_tflop_s"],
                    "b_tflop_s": after["attainment"]["achieved_tflop_s"],
                    "ratio": ci.ratio, "low": ci.low, "high": ci.high, "ok": before["ok"] and after["ok"],
                    "timed_as": after["timed_as"]})
    return ab, out


def table(out: Path) -> None:
    for name, (a, b) in PAIRS.items():
        result = json.loads((out / f"result-{name}.json").read_text())
        ab, shape_rows = rows(result, a, b)
        print(f"\n{name}: {a} vs {b}: {ab.overall} ({ab.outcome}); copy ceiling "
              f"{result['roofline']['hbm_gb_s']:,.0f} GB/s, matmul {result['roofline']['bf16_tflop_s']:,.0f} TFLOP/s")
        print("| shape | A µs | B µs | speedup [95 % CI] | % HBM | TFLOP/s | checks |")
        print("|---|---:|---:|---|---:|---:|---|")
        for r in shape_rows:
            print(f"| {r['shape']} | {r['a_us']:,.1f} | {r['b_us']:,.1f} | {r['ratio']:.3f}x [{r['low']:.3f}, "
                  f"{r['high']:.3f}] | {r['a_pct_hbm']:.1f} → {r['b_pct_hbm']:.1f} | {r['a_tflop_s']:.1f} → "
                  f"{r['b_tflop_s']:.1f} | {'pass' if r['ok'] else 'FAIL'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "run", "table"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vllm-py", type=Path, help="vLLM 0.26.0's wheel, unzipped (prepare)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "prepare":
        if args.vllm_py is None or not (args.vllm_py / OPS / "triton_unified_attention.py").is_file():
            parser.error("prepare needs --vllm-py: a folder holding vllm/v1/attention/ops/triton_unified_attention.py")
        prepare(args.out, args.vllm_py)
    elif args.command == "run":
        run(args.out)
    else:
        table(args.out)


if __name__ == "__main__":
    main()
