"""Where a campaign's wall time went, from its audit log and run folder: candidates per hour, the share
of wall time with no vLLM server alive (ratchet's own overhead: proposing, gating, logging, copying
trees, statistics) and the share spent in vLLM start-up.

    python experiments/campaign_time.py audit_logs/<campaign-id> [--out FILE.json]

A server's window runs from the creation of its log file (the harness creates it at launch) to the
file's last write (the server's shutdown messages); windows of A/B servers overlap and are merged.
Start-up ends at vLLM's "Starting vLLM server on" line (one-second resolution). For logs copied from
another machine (a GPU host) the file times are those of the copy: the windows then run from the first
to the last timestamped vLLM line, which leaves out the seconds of Python imports before the first line.

Where the harness left per-run timings (harness.bench.TIMINGS_FILE, since 2026-12-03), `runs` splits a
benchmark run's time: the other servers' freeze, the client from go to done (its set-up, warm-ups and the
measured duration), and the harness's checks of the result.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from audit.reader import payload_of, read_records
from harness.bench import TIMINGS_FILE

_READY = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) .*Starting vLLM server on")


def record_time(record: dict[str, object]) -> datetime:
    """When an audit record was written (its `ts`, UTC)."""
    return datetime.fromisoformat(str(record["ts"]))


def _birth_and_mtime(path: Path) -> tuple[float, float]:
    # Python 3.11's os.stat has no birth time on Linux; coreutils' stat reads it with statx.
    out = subprocess.run(["stat", "-c", "%W", str(path)], capture_output=True, text=True, check=True).stdout
    birth = float(out.split()[0])
    if birth <= 0:
        raise SystemExit(f"{path}: this filesystem does not record file birth times")
    return birth, path.stat().st_mtime


_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) (\d\d-\d\d \d\d:\d\d:\d\d) ")


def _logged_span(path: Path, year: int) -> tuple[float, float] | None:
    """First and last timestamped line of a vLLM log (the log's own clock, one-second resolution)."""
    stamps = _STAMP.findall(path.read_text(errors="replace"))
    if not stamps:
        return None
    at = [datetime.strptime(f"{year}-{s}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
          for s in (stamps[0], stamps[-1])]
    return at[0], at[1]


def _ready_at(path: Path, year: int) -> float | None:
    for line in path.read_text(errors="replace").splitlines():
        m = _READY.search(line)
        if m:
            return datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return None


def _merge(windows: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(windows):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def run_costs(log_dir: Path) -> dict[str, object]:
    """Means over every benchmark run of the campaign; empty when the harness left no timings."""
    lines = [json.loads(line) for path in sorted((log_dir / "runs").rglob(TIMINGS_FILE))
             for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return {}

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 3)

    return {"runs": {
        "count": len(lines),
        "mean_freeze_s": mean([t["freeze_s"] for t in lines]),
        "mean_client_s": mean([t["client_s"] for t in lines]),
        "mean_measured_s": mean([t["measured_s"] for t in lines]),
        "mean_client_setup_s": mean([t["client_s"] - t["measured_s"] for t in lines]),   # set-up and warm-ups
        "mean_checks_s": mean([t["checks_s"] for t in lines]),
    }}


def summarise(log_dir: Path) -> dict[str, object]:
    records = read_records(log_dir)
    ts = [record_time(r).timestamp() for r in records]
    start, end = ts[0], ts[-1]
    year = datetime.fromtimestamp(start, UTC).year
    windows, startups, copied = [], [], False
    for log in sorted((log_dir / "runs").glob("*/server*.log")) + sorted((log_dir / "runs").glob("*/*/server*.log")):
        birth, mtime = _birth_and_mtime(log)
        if birth > mtime or not start - 60 <= birth <= end + 60:   # a copy: file times say when it was copied
            span = _logged_span(log, year)
            if span is None:
                raise SystemExit(f"{log}: copied (file times outside the campaign) and no timestamped lines")
            birth, mtime, copied = span[0], span[1], True
        windows.append((birth, mtime))
        ready = _ready_at(log, year)
        if ready is not None:
            startups.append((birth, ready))
    results = [payload_of(log_dir, r) for r in records if r["kind"] == "iteration.result"]
    evaluated = [r for r in results if r.get("speedup") is not None or r["outcome"] == "parity-broken"]
    wall = end - start
    loop = [t for r, t in zip(records, ts, strict=True) if str(r["kind"]).startswith("iteration.")]
    loop_s = (max(loop) - min(loop)) if loop else 0.0   # first hypothesis to last result: no baseline, no final
    in_vllm = _merge(windows)
    startup = _merge(startups)
    return {
        "log_dir": str(log_dir), "wall_s": round(wall, 1), "iterations": len(results),
        "candidates_evaluated": len(evaluated),
        "candidates_per_hour": round(len(evaluated) / (wall / 3600), 2) if wall else None,
        "loop_s": round(loop_s, 1),
        "candidates_per_hour_in_loop": round(len(evaluated) / (loop_s / 3600), 2) if loop_s else None,
        "outcomes": [r["outcome"] for r in results],
        "server_windows_from": "vLLM log timestamps (copied logs)" if copied else "log file birth and last write",
        "server_windows": len(windows), "vllm_alive_s": round(in_vllm, 1),
        "outside_vllm_s": round(wall - in_vllm, 1), "outside_vllm_share": round((wall - in_vllm) / wall, 4),
        "vllm_startup_s": round(startup, 1), "vllm_startup_share": round(startup / wall, 4),
        **run_costs(log_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    summary = summarise(args.log_dir.resolve())
    text = json.dumps(summary, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
