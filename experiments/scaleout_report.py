"""Summarise scale-out campaigns from their audit logs: wall time per slot count and what each slot did.

    python experiments/scaleout_report.py RUNS_FILE OUT.json

RUNS_FILE has one line per campaign: `<slots> <log dir>` (written by experiments/scaleout_slots.sh).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from campaign_time import record_time  # beside this file

from audit import verify
from audit.reader import payload_of, read_records


def summarise(slots: int, log_dir: Path) -> dict[str, object]:
    records = read_records(log_dir)
    first = {r["kind"]: r for r in reversed(records)}       # the first record of each kind
    start, baseline, end = first["campaign.start"], first["baseline.result"], first["campaign.end"]
    results = [(r, payload_of(log_dir, r)) for r in records if r["kind"] == "iteration.result"]
    return {
        "slots": slots, "log_dir": str(log_dir),
        "wall_s": round((record_time(end) - record_time(start)).total_seconds(), 1),
        "baseline_s": round((record_time(baseline) - record_time(start)).total_seconds(), 1),
        "iterations_s": round((record_time(end) - record_time(baseline)).total_seconds(), 1),
        "iterations": [{"iteration": r["iteration"], "outcome": p["outcome"], "speedup": p.get("speedup_text"),
                        "node": str(p.get("placement", {}).get("node_id", ""))[:12],
                        "eval_s": p.get("placement", {}).get("seconds")} for r, p in results],
        "retries": sum(1 for r in records if r["kind"] == "iteration.retry"),
        "verified": verify(log_dir).ok,
    }


def main() -> None:
    runs_file, out = Path(sys.argv[1]), Path(sys.argv[2])
    lines = [line.split() for line in runs_file.read_text().splitlines() if line.strip()]
    runs = [summarise(int(slots), Path(log)) for slots, log in lines]
    by_slots = {r["slots"]: r for r in runs}
    report: dict[str, object] = {"runs": runs}
    if 1 in by_slots and 2 in by_slots:
        report["iterations_speedup_2_vs_1"] = round(by_slots[1]["iterations_s"] / by_slots[2]["iterations_s"], 3)
        report["wall_speedup_2_vs_1"] = round(by_slots[1]["wall_s"] / by_slots[2]["wall_s"], 3)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
