"""The wall-time cost of parity that covers the grid, on one server of the embedded spec (its sandbox).

    .venv/bin/python experiments/parity_cost.py [--rounds 3]   -> experiments/results/parity-cost-gemma4-tiny-cpu.json

Alternates, on the same server: the held set as it was (the 64 short prompts, 16 in flight, no solo
requests) and as it ships (76 prompts incl. 12 at the grid's lengths, at the benchmark's concurrency, the 4
longest again one at a time). Each A/B generates the candidate's set once (the campaign's reference is
generated once at baseline); workload parity sends nothing (it compares the benchmark's own outputs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from agent.spec import load_spec  # noqa: E402
from harness.parity import generate, held_generations, load_prompts  # noqa: E402
from harness.server import serve  # noqa: E402
from sandbox.factory import backend_from_config, isolation_label, resolve  # noqa: E402
from sandbox.workspace import Workspace  # noqa: E402

OUT = ROOT / "experiments" / "results" / "parity-cost-gemma4-tiny-cpu.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ratchet-parity-cost"))
    args = parser.parse_args()
    spec = load_spec(ROOT / "experiments" / "gemma4-tiny-cpu.yaml")
    sandbox = resolve(spec.sandbox)
    prompts = load_prompts(spec.parity.prompts)
    old = [p for p in prompts if "-in" not in p.id]
    ws_root = args.work / "ws"
    ws = Workspace.open(ws_root, "vllm") if (ws_root / ".git").exists() else Workspace.create(
        ws_root, serving=dict(spec.server.engine_args), package="vllm", source=spec.target_source())
    times: dict[str, list[float]] = {"before": [], "shipped": []}
    with serve(backend_from_config(sandbox), tree=ws.root, config=spec.server, engine_args=ws.serving_config(),
               log_path=args.work / "server.log", cache_dir=args.work / "cache") as srv:
        for r in range(args.rounds):
            for kind in (("before", "shipped") if r % 2 == 0 else ("shipped", "before")):
                t0 = time.monotonic()
                if kind == "before":
                    generate(srv.base_url, srv.model_name, old, spec.parity, concurrency=16)
                else:
                    held_generations(srv.base_url, srv.model_name, prompts, spec.parity,
                                     concurrency=spec.benchmark.max_concurrency)
                times[kind].append(round(time.monotonic() - t0, 2))
                print(kind, times[kind][-1], flush=True)
    result = {"command": ".venv/bin/python experiments/parity_cost.py", "isolation": isolation_label(sandbox),
              "before": {"prompts": len(old), "concurrency": 16, "solo": 0, "seconds": times["before"]},
              "shipped": {"prompts": len(prompts), "concurrency": spec.benchmark.max_concurrency,
                          "solo": spec.parity.batch_of_one, "seconds": times["shipped"]},
              "median_ratio": statistics.median(times["shipped"]) / statistics.median(times["before"])}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
