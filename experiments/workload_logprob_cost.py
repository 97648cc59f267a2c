"""What asking every benchmark request for its top-k logprobs costs, on one server, paired run by run.

    .venv/bin/python experiments/workload_logprob_cost.py [SPEC] [--pairs 8] [--cells in128/out64,in512/out64]
        [--out experiments/results/workload-logprob-cost.json]

One server of the installed vLLM serves the spec's model with the spec's engine args (local backend: isolation does
not change what a request costs). For each pair and cell the same requests (one seed per pair) run twice back to
back, once without logprobs and once with `benchmark.logprobs` (the order alternates per pair), through the
harness's own client (`run_jobs`: the pristine `vllm bench serve`, the driver's capture included). The cost is
the paired ratio of the headline throughput, with/without, as a Student-t interval (harness.stats), and the
client's time outside the measured run per job (parsing and writing the capture). In an A/B both builds ask for
the same logprobs, so the cost falls on both; this says how large it is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from agent.spec import load_spec
from harness.bench import TIMINGS_FILE, BenchJob, run_jobs
from harness.config import StatsConfig
from harness.measure import headline_metric
from harness.server import serve
from harness.stats import speedup_ci
from sandbox.local import LocalBackend
from sandbox.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", nargs="?", type=Path, default=ROOT / "experiments" / "gemma4-tiny-cpu.yaml")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--cells", default="in128/out64,in512/out64,in1024/out64")
    ap.add_argument("--work", type=Path, default=Path("/tmp/workload-logprob-cost"))
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "workload-logprob-cost.json")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    wanted = args.cells.split(",")
    cells = [c for c in spec.benchmark.cells() if c.label in wanted]
    with_lp = spec.benchmark.model_copy(update={"repeats": 1})
    without = with_lp.model_copy(update={"logprobs": None})
    ws = Workspace.create(args.work / "ws", serving=dict(spec.server.engine_args), package="vllm",
                          source=spec.target_source())
    rows: list[dict[str, object]] = []
    with serve(LocalBackend(), tree=ws.root, config=spec.server, engine_args=dict(spec.server.engine_args),
               log_path=args.work / "server.log", cache_dir=args.work / "cache") as srv:
        print(f"server ready in {srv.startup_s:.1f} s", file=sys.stderr)
        for pair in range(args.pairs):
            for cell in cells:
                order = [("with", with_lp), ("without", without)]
                for name, config in order if pair % 2 == 0 else order[::-1]:
                    job = BenchJob(cell=cell, base_url=srv.base_url, model_name=srv.model_name,
                                   tokenizer=spec.server.model, tag=name, repeat=pair)
                    folder = args.work / f"p{pair}-{cell.label.replace('/', '-')}-{name}"
                    [run] = run_jobs([job], config.model_copy(update={"seed": pair}), work_dir=folder)
                    timing = json.loads((folder / TIMINGS_FILE).read_text().splitlines()[-1])
                    rows.append({"pair": pair, "cell": cell.label, "logprobs": name,
                                 "headline": run.metrics()[headline_metric(cell)],
                                 "outside_run_s": timing["client_s"] - timing["measured_s"]})
                    print(f"pair {pair} {cell.label} {name}: {rows[-1]['headline']:.0f} tok/s", file=sys.stderr)
    summary = _summary(rows, cells=[c.label for c in cells])
    args.out.write_text(json.dumps({"spec": str(args.spec), "rows": rows, "summary": summary}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def _summary(rows: list[dict[str, object]], *, cells: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for cell in cells:
        mine = [r for r in rows if r["cell"] == cell]
        base = [float(r["headline"]) for r in mine if r["logprobs"] == "without"]     # type: ignore[arg-type]
        asked = [float(r["headline"]) for r in mine if r["logprobs"] == "with"]       # type: ignore[arg-type]
        ci = speedup_ci(base, asked, StatsConfig())
        outside = {name: statistics.median(float(r["outside_run_s"]) for r in mine          # type: ignore[arg-type]
                                           if r["logprobs"] == name) for name in ("with", "without")}
        out[cell] = {"with_over_without": str(ci), "ratio": ci.ratio, "low": ci.low, "high": ci.high,
                     "median_outside_run_s": outside}
    return out


if __name__ == "__main__":
    main()
