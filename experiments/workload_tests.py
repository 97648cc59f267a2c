"""Every workload-parity sign test a campaign log records: which candidate, which comparison, how many requests
were wrong on one side only, and the p value; then the tests of each candidate pooled.

    .venv/bin/python experiments/workload_tests.py LOG_DIR_OR_TGZ [...]

Reads the logs only (the `workload.scores` of each `iteration.parity` record, and the final comparison's
parity text in `campaign.end`), so it runs on the committed `main-job-run*-log.tgz` archives, which leave the
benchmark outputs out. Used for the table in results/main-job-runs.md (run 5).
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from audit.reader import payload_of, read_records  # noqa: E402
from harness.workload import sign_test  # noqa: E402

_FINAL = re.compile(r"(\d+) only on the candidate, (\d+) only on the reference")


def _logs(paths: list[Path], scratch: Path) -> list[Path]:
    out = []
    for path in paths:
        if path.suffix == ".tgz":
            with tarfile.open(path) as tar:
                tar.extractall(scratch / path.stem, filter="data")
            out += sorted(p.parent for p in (scratch / path.stem).glob("*/log.jsonl"))
        else:
            out.append(path)
    return out


def tests_of(log: Path) -> list[tuple[str, str, int, int]]:
    """(candidate, comparison, wrong only on the candidate, wrong only on the reference) per recorded test."""
    records = read_records(log)
    hypotheses = {r["iteration"]: str(payload_of(log, r).get("hypothesis", ""))
                  for r in records if r["kind"] == "iteration.hypothesis"}
    seen: dict[int, int] = defaultdict(int)
    out = []
    for record in records:
        if record["kind"] == "iteration.parity":
            scores = (payload_of(log, record).get("workload") or {}).get("scores")
            if scores:
                i = int(record["iteration"])
                seen[i] += 1
                what = hypotheses.get(i, "").split(": ", 1)[-1].split(" (")[0]
                out.append((what, "screen" if seen[i] == 1 else "confirmation", scores["candidate_only"],
                            scores["reference_only"]))
        elif record["kind"] == "campaign.end":
            match = _FINAL.search(str(payload_of(log, record)))
            if match:
                out.append(("best vs stock", "final", int(match[1]), int(match[2])))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args()
    pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with tempfile.TemporaryDirectory() as tmp:
        for log in _logs(args.logs, Path(tmp)):
            for what, comparison, cand, ref in tests_of(log):
                p = sign_test(cand, ref)
                print(f"{log.name}  {comparison:12}  {what[:60]:60}  {cand:3} vs {ref:3}  p = {p:.4f}")
                pooled[what][0] += cand
                pooled[what][1] += ref
    for what, (cand, ref) in pooled.items():
        print(f"pooled  {what[:60]:60}  {cand:3} vs {ref:3}  p = {sign_test(cand, ref):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
