#!/usr/bin/env bash
# On an offline GPU host (after gpu-setup.sh): `ratchet measure` of the stock grid; what it leaves (JSON,
# server and client logs, per-job results) goes to $OUT even when the time limit cuts it short.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/var/tmp/out}
LIMIT=${LIMIT:-560}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout -s INT -k 30 "$LIMIT" python3 -m agent.cli measure experiments/gemma4-e2b-gpu.yaml --workspace "${WS:-/var/tmp/ws-e2b}" \
  --repeats "${REPEATS:-2}" --out "$OUT/h200-e2b-stock-grid.json" 2>&1 | tee "$OUT/measure.log"
echo "rc=${PIPESTATUS[0]}"
RUN=$(ls -d "${WS:-/var/tmp/ws-e2b}".runs/measure-* | tail -1)
cp "$RUN"/server-*.log "$OUT"/ 2>/dev/null
tar czf "$OUT/bench-jobs.tgz" -C "$RUN" . 2>/dev/null
ls -la "$OUT"
