"""Per-cell paired ratios of every candidate to the incumbent, read straight from one comparison's bench folder
(the client's own result files): for a comparison that was cut short, whose iterations have no audit record.
Only complete pairs count (a repeat where both A and the candidate ran the cell); the interval is the same
Student-t on paired log-ratios as the campaign's (harness.stats, 95 %). The output keeps each run's headline value
(`values`), so a figure taken from it can be recomputed without the client's files.

    python experiments/comparison_runs.py RUN_DIR [--out FILE.json]

RUN_DIR is a campaign's runs/itNNN (server-*.log, bench/): each server's log names its port, so each run's
--base-url says whose it was.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from harness.config import StatsConfig
from harness.stats import overall_ci, speedup_ci

_PORT = re.compile(r"127\.0\.0\.1:(\d+)")


def _tags(run_dir: Path) -> dict[str, str]:
    out = {}
    for log in run_dir.glob("server-*.log"):
        if log.stem.endswith("-parity"):   # parity servers take the speed servers' ports after them
            continue
        if m := _PORT.search(log.read_text(errors="replace")):
            out[m.group(1)] = log.stem.removeprefix("server-")
    return out


def summarise(run_dir: Path, incumbent: str = "A") -> dict[str, object]:
    tags = _tags(run_dir)
    argvs = json.loads(next((run_dir / "bench").glob("tmp*.json")).read_text())
    runs: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)   # (tag, cell) -> repeat -> headline
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for index, argv in enumerate(argvs):
        result = run_dir / "bench" / f"job{index:04d}.json"
        if not result.exists():
            break
        opt = dict(zip(argv[::2], argv[1::2], strict=False))
        tag = tags[opt["--base-url"].rsplit(":", 1)[1]]
        cell = f"in{opt['--random-input-len']}/out{opt['--random-output-len']}"
        data = json.loads(result.read_text())
        out_len = int(opt["--random-output-len"])
        # prefill cells are judged on prefill tok/s (input tokens over the run), the rest on total tok/s
        value = data["total_input_tokens"] / data["duration"] if out_len == 1 else data["total_token_throughput"]
        repeat = seen[(tag, cell)]
        seen[(tag, cell)] += 1
        runs[(tag, cell)][repeat] = value
    cfg = StatsConfig(confidence=0.95)
    cells = sorted({cell for _, cell in runs})
    out: dict[str, object] = {"run_dir": str(run_dir), "runs": len([1 for v in runs.values() for _ in v]),
                              "planned_runs": len(argvs), "candidates": {},
                              # each run's headline, by build and cell, in repeat order: the intervals' inputs
                              "values": {tag: {cell: [runs[(tag, cell)][r] for r in sorted(runs[(tag, cell)])]
                                               for t, cell in sorted(runs) if t == tag}
                                         for tag in sorted({t for t, _ in runs})}}
    for tag in sorted({t for t, _ in runs} - {incumbent}):
        per_cell, head_a, head_b = {}, {}, {}
        for cell in cells:
            a, b = runs.get((incumbent, cell), {}), runs.get((tag, cell), {})
            both = sorted(set(a) & set(b))
            if len(both) >= 2:
                ci = speedup_ci([a[r] for r in both], [b[r] for r in both], cfg)
                per_cell[cell] = {"pairs": len(both), "ratio": round(ci.ratio, 4), "low": round(ci.low, 4),
                                  "high": round(ci.high, 4),
                                  "median_a": round(statistics.median(a[r] for r in both)),
                                  "median_b": round(statistics.median(b[r] for r in both))}
        common = min((p["pairs"] for p in per_cell.values()), default=0)
        if common >= 2 and len(per_cell) == len(cells):
            for cell in cells:
                both = sorted(set(runs[(incumbent, cell)]) & set(runs[(tag, cell)]))[:common]
                head_a[cell] = [runs[(incumbent, cell)][r] for r in both]
                head_b[cell] = [runs[(tag, cell)][r] for r in both]
            ci = overall_ci(head_a, head_b, cfg)
            overall = {"pairs": common, "ratio": round(ci.ratio, 4), "low": round(ci.low, 4), "high": round(ci.high, 4)}
        else:
            overall = None
        out["candidates"][tag] = {"cells": per_cell, "overall": overall}   # type: ignore[index]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--incumbent", default="A")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = json.dumps(summarise(args.run_dir, args.incumbent), indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
