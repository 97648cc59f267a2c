#!/usr/bin/env bash
# Issue 9's measurement: the same campaign (experiments/gemma4-tiny-cpu-ray.yaml, 4 iterations) with 1
# and then 2 parallel Ray slots, back to back on this machine. Writes experiments/results/scaleout-slots.json
# (wall time of the whole campaign and of its iterations, per slot count) from the campaigns' audit logs.
#   bash experiments/scaleout_slots.sh          (~25 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
logs=audit_logs/scaleout
mkdir -p "$logs"
for slots in 1 2; do
  before=$(ls "$logs" 2>/dev/null | sort)
  .venv/bin/ratchet run experiments/gemma4-tiny-cpu-ray.yaml --slots "$slots" --log-dir "$logs"
  new=$(comm -13 <(echo "$before") <(ls "$logs" | sort) | tail -1)
  echo "$slots $logs/$new" >> "$logs/runs.txt.$$"
done
.venv/bin/python experiments/scaleout_report.py "$logs/runs.txt.$$" experiments/results/scaleout-slots.json
rm -f "$logs/runs.txt.$$"
