"""Per-shape medians and paired speedups of two builds in one kernel runner result (harness/kernel/runner.py's
result.json), read as the campaign reads an A/B (harness.kernel.compare): for a replay's or a run's own files.

    python experiments/kernel_ab_table.py RESULT.json --a baseline --b best [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.config import StatsConfig
from harness.kernel.compare import compare


def table(result: dict[str, Any], a: str, b: str, stats: StatsConfig | None = None) -> dict[str, Any]:
    own = {tag: result["builds"][tag]["sha256"] for tag in (a, b)}   # the files the runner loaded
    ab = compare(result, a=a, b=b, stats=stats or StatsConfig(), expected_sha256=own)
    shapes = {name: {"median_us_a": sh["builds"][a]["median_us"], "median_us_b": sh["builds"][b]["median_us"],
                     **({k: round(v, 4) for k, v in vars(ab.shapes[name]).items() if k in ("ratio", "low", "high")}
                        if name in ab.shapes else {})}
              for name, sh in result["shapes"].items()}
    overall = {k: round(v, 4) for k, v in vars(ab.overall).items() if k in ("ratio", "low", "high")} \
        if ab.overall else None
    return {"a": a, "b": b, "outcome": ab.outcome, "overall": overall, "shapes": shapes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--a", default="A")
    parser.add_argument("--b", default="B")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = json.dumps(table(json.loads(args.result.read_text()), args.a, args.b), indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
