"""Measure the tiny Gemma 4 checkpoint: greedy margins and the parity matrix; write the results JSON.

    .venv/bin/python experiments/models/gemma4-tiny/evaluate.py [--vllm-planted all|none|NAME,...]

Parity matrix on the held prompts (64 greedy tokens each, exact token ids):
  vLLM eager batch-of-all vs batch-of-1, eager vs compiled, transformers reference vs vLLM eager,
  and each planted bug (transformers mirror, and optionally the vLLM patch in an overlay) vs clean.
Engine starts: eager (both batchings) once, compiled once, plus one eager start per vLLM planted bug.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from reference import BUGS, greedy, load_buggy, load_model
from vllm_parity import compare, gap_stats, make_overlay, run_vllm, scratch_dir

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
HELD = ROOT / "experiments" / "prompts" / "gemma4-tiny-parity.jsonl"
RESULTS = ROOT / "experiments" / "results" / "gemma4-tiny-eval.json"


def task_accuracy(result: dict[str, Any], prompts: list[dict[str, Any]]) -> float:
    """Fraction of generated tokens equal to the task's determined continuation."""
    hits = total = 0
    for p in prompts:
        got = result[p["id"]]["token_ids"]
        hits += sum(a == b for a, b in zip(got, p["expected_token_ids"], strict=True))
        total += len(got)
    return round(hits / total, 4)


def per_mode(cmp: dict[str, Any], prompts: list[dict[str, Any]]) -> dict[str, str]:
    """'changed/total' per mode, to show which attention path a bug breaks."""
    mode = {p["id"]: p["mode"] for p in prompts}
    changed = {f["id"] for f in cmp["flips"]}
    out = {}
    for m in sorted(set(mode.values())):
        ids = [i for i, v in mode.items() if v == m]
        out[m] = f"{sum(i in changed for i in ids)}/{len(ids)}"
    return out


def brief(cmp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cmp.items() if k != "flips"} | {"flips": cmp["flips"][:5]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=HERE)
    ap.add_argument("--prompts", type=Path, default=HELD)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--vllm-planted", default="all", help="all, none, or comma-separated bug names")
    args = ap.parse_args()
    t0 = time.perf_counter()
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    work = scratch_dir("gemma4-tiny-eval-")
    print(f"{len(prompts)} prompts; scratch {work}", flush=True)

    hf = greedy(load_model(args.model), prompts)
    print("transformers reference done", flush=True)
    eager = run_vllm(args.model, args.prompts, compiled=False, batch_one=True, workdir=work)
    print(f"vLLM eager done (start {eager['engine_start_s']} s)", flush=True)
    compiled = run_vllm(args.model, args.prompts, compiled=True, batch_one=False, workdir=work)
    print(f"vLLM compiled done (start {compiled['engine_start_s']} s)", flush=True)
    base = eager["batch_all"]

    matrix: dict[str, Any] = {
        "eager_batch_all_vs_batch_one": brief(compare(base, eager["batch_one"])),
        "eager_vs_compiled": brief(compare(base, compiled["batch_all"])),
        "hf_reference_vs_vllm_eager": brief(compare(hf, base)),
    }
    planted_hf: dict[str, Any] = {}
    for bug in BUGS:
        cmp = compare(hf, greedy(load_buggy(args.model, bug), prompts))
        planted_hf[bug] = brief(cmp) | {"changed_by_mode": per_mode(cmp, prompts)}
        print(f"transformers planted {bug}: {cmp['changed']}/{cmp['prompts']} prompts changed", flush=True)
    matrix["planted_transformers"] = planted_hf

    names = list(BUGS) if args.vllm_planted == "all" else (
        [] if args.vllm_planted == "none" else args.vllm_planted.split(","))
    planted_vllm: dict[str, Any] = {}
    for bug in names:
        overlay = make_overlay(HERE / "planted" / f"{bug}.patch", work / f"overlay-{bug}")
        res = run_vllm(args.model, args.prompts, compiled=False, batch_one=False, workdir=work,
                       overlay=overlay)
        cmp = compare(base, res["batch_all"])
        planted_vllm[bug] = brief(cmp) | {"changed_by_mode": per_mode(cmp, prompts),
                                          "vllm_file": res["vllm_file"], "gemma4_file": res.get("gemma4_file")}
        print(f"vLLM planted {bug}: {cmp['changed']}/{cmp['prompts']} prompts changed", flush=True)
    if names:
        matrix["planted_vllm"] = planted_vllm

    training = json.loads((args.model / "training.json").read_text())
    report = {
        "model": str(args.model.relative_to(ROOT)) if args.model.is_relative_to(ROOT) else str(args.model),
        "prompts": str(args.prompts.relative_to(ROOT)) if args.prompts.is_relative_to(ROOT) else str(args.prompts),
        "num_prompts": len(prompts),
        "new_tokens": 64,
        "checkpoint_bytes": (args.model / "model.safetensors").stat().st_size,
        "training": {k: training[k] for k in ("args", "wall_s", "final_train_loss", "final_eval")},
        "gap_vllm_eager": gap_stats(base),
        "gap_hf_reference": gap_stats(hf),
        "task_accuracy_vllm_eager": task_accuracy(base, prompts),
        "parity": matrix,
        "engine_start_s": {"eager": eager["engine_start_s"], "compiled": compiled["engine_start_s"]},
        "vllm_version": eager["vllm_version"],
        "machine": platform.platform(),
        "eval_wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("gap_vllm_eager", "task_accuracy_vllm_eager")}), flush=True)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
