"""Isolation overhead: `ratchet measure` on the same random tiny Gemma 4 with `sandbox.backend: local`
and `docker`, alternated for `--rounds` rounds; writes experiments/results/docker-vs-local.json.

    .venv/bin/python experiments/docker_overhead.py [--rounds 2] [--work /tmp/ratchet-docker-overhead]

Needs dockerd (scripts/start-dockerd.sh) and the image (`ratchet sandbox build`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC = """schema_version: 1
name: docker-overhead
server:
  model: {model}
  engine_args: {{enforce_eager: true, max_model_len: 2048, dtype: float32}}
  env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
  startup_timeout_s: 300
benchmark:
  input_lens: [128]
  output_lens: [16]
  num_prompts: 8
  max_concurrency: 4
  repeats: 2
parity:
  prompts: prompts.jsonl
  max_tokens: 8
target:
  workspace: {workspace}
sandbox:
  backend: {backend}
"""


def _prepare(work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.tiny_random_model import write_random_gemma4

    model = work / "model"
    if not (model / "config.json").exists():
        write_random_gemma4(model)
    for dirpath, _, files in os.walk(model):  # the docker sandbox user (uid 10001) must read it
        Path(dirpath).chmod(0o755)
        for name in files:
            (Path(dirpath) / name).chmod(0o644)
    rng = random.Random(0)
    lines = [
        json.dumps({"id": f"p{i}", "prompt_token_ids": [rng.randrange(3, 256) for _ in range(40)]}) for i in range(4)
    ]
    (work / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    for backend in ("local", "docker"):
        (work / f"spec-{backend}.yaml").write_text(SPEC.format(model=model, workspace=work / "ws", backend=backend))


def _measure(work: Path, backend: str, rnd: int) -> dict[str, Any]:
    out = work / f"{backend}-{rnd}.json"
    argv = [
        sys.executable,
        "-m",
        "agent.cli",
        "measure",
        str(work / f"spec-{backend}.yaml"),
        "--out",
        str(out),
    ]
    started = time.monotonic()
    subprocess.run(argv, cwd=ROOT, check=True, timeout=1200)
    data: dict[str, Any] = json.loads(out.read_text())
    data["command_s"] = time.monotonic() - started
    return data


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    metrics = ("total_token_throughput", "median_ttft_ms", "median_tpot_ms")
    cells: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for cell in run["cells"]:
            for metric in metrics:
                cells.setdefault(cell["cell"], {}).setdefault(metric, []).append(round(cell[metric], 2))
    return {
        "isolation": runs[0]["isolation"],
        "startup_s": [round(float(r["startup_s"]), 2) for r in runs],
        "wall_s": [round(float(r["wall_s"]), 2) for r in runs],
        "cells": cells,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ratchet-docker-overhead"))
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="rebuild the summary from the per-run JSON files already in --work",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "docker-vs-local.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        _prepare(args.work)
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "docker": []}
    for rnd in range(args.rounds):
        if args.summarize_only:
            for backend in runs:
                runs[backend].append(json.loads((args.work / f"{backend}-{rnd}.json").read_text()))
            continue
        order = ("local", "docker") if rnd % 2 == 0 else ("docker", "local")
        for backend in order:
            runs[backend].append(_measure(args.work, backend, rnd))
    local, docker = _summary(runs["local"]), _summary(runs["docker"])

    def ratio(metric: str) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for cell in local["cells"]:
            base = statistics.median(local["cells"][cell][metric])
            out[cell] = round(statistics.median(docker["cells"][cell][metric]) / base, 4) if base else None
        return out

    result = {
        "what": "ratchet measure, same random tiny Gemma 4 (enforce_eager, fp32), local vs docker backend; "
        "rounds alternate the order; per run each metric is the median of the spec's repeats",
        "command": f".venv/bin/python experiments/docker_overhead.py --rounds {args.rounds}",
        "machine": {"cpus": os.cpu_count(), "note": "2 shared cores; other jobs (training, vLLM) were running"},
        "local": local,
        "docker": docker,
        "docker_over_local_median": {
            m: ratio(m) for m in ("total_token_throughput", "median_tpot_ms", "median_ttft_ms")
        },
        "same_backend_spread_max_over_min_throughput": {
            name: {
                cell: round(max(v["total_token_throughput"]) / min(v["total_token_throughput"]), 2)
                for cell, v in summary["cells"].items()
            }
            for name, summary in (("local", local), ("docker", docker))
        },
        "docker_minus_local_startup_s": round(
            statistics.median(docker["startup_s"]) - statistics.median(local["startup_s"]), 2
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
