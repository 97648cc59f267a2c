"""Per cell, what each iteration of a campaign measured: the baseline's median, the candidate's median and
the paired speedup with its CI (the headline metric: total tok/s end-to-end, prefill tok/s for out1), and
parity. Reads only the audit log, so it works on a log copied back from a GPU host.

    python experiments/iteration_cells.py audit_logs/<campaign-id> [--out FILE.json]   # prints markdown
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from audit import verify
from audit.reader import payload_of, read_records


def _headline(row: dict[str, object]) -> float:
    key = "prefill_tok_s" if row["output_len"] == 1 else "total_token_throughput"
    return float(row[key])  # type: ignore[arg-type]


def iteration_cells(log_dir: Path) -> dict[str, object]:
    result = verify(log_dir)
    if not result.ok:
        raise SystemExit(f"{log_dir}: the audit log does not verify: {result}")
    records = [(r, payload_of(log_dir, r)) for r in read_records(log_dir)]
    baseline = next(p for r, p in records if r["kind"] == "baseline.result")
    iterations = []
    for r, p in records:
        if r["kind"] != "iteration.result":
            continue
        cand = {row["cell"]: row for row in p.get("cells_rows") or []}
        # A's medians from the same A/B (logs before incumbent_rows existed: the baseline grid's own run)
        inc = {row["cell"]: row for row in p.get("incumbent_rows") or baseline["cells"]}
        cells = [{"cell": label, "incumbent": round(_headline(inc[label])),
                  "candidate": round(_headline(cand[label])) if label in cand else None,
                  **{k: round(v, 4) for k, v in per["headline"].items() if k != "n"}, "n": per["headline"]["n"]}
                 for label, per in p.get("cells", {}).items()]
        iterations.append({"iteration": r["iteration"], "source": p.get("source"), "outcome": p["outcome"],
                           "incumbent_from": "the same A/B" if p.get("incumbent_rows") else "the baseline grid",
                           "reason": p["reason"], "parity_ok": p.get("parity_ok"), "overall": p.get("speedup_text"),
                           "cells": cells})
    return {"log_dir": str(log_dir), "verified_records": result.records, "baseline_startup_s":
            round(float(baseline["startup_s"]), 1), "iterations": iterations}


def to_markdown(summary: dict[str, object]) -> str:
    lines = []
    for it in summary["iterations"]:  # type: ignore[attr-defined]
        lines += [f"### iteration {it['iteration']}: {it['outcome']} ({it['reason']}); parity "
                  f"{'ok' if it['parity_ok'] else 'BROKEN'}", "", f"`{it['source']}`", "",
                  f"| cell | incumbent ({it['incumbent_from']}) | candidate | paired speedup [95 % CI] |",
                  "|---|---:|---:|---|"]
        lines += [f"| {c['cell']} | {c['incumbent']:,} | {c['candidate']:,} | "
                  f"{c['ratio']:.3f}× [{c['low']:.3f}, {c['high']:.3f}] |" for c in it["cells"]]
        lines += [f"| overall (geo-mean) | | | {it['overall']} |", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    summary = iteration_cells(args.log_dir.resolve())
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(to_markdown(summary))


if __name__ == "__main__":
    main()
