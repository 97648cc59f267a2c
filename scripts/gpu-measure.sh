#!/usr/bin/env bash
# On an offline GPU host (after gpu-setup.sh): `ratchet measure` of the stock grid; what it leaves (JSON,
# server and client logs, per-job results) goes to $OUT even when the time limit cuts it short.
#   SPEC             the spec (default experiments/gemma4-e2b-gpu.yaml)
#   SANDBOX_BACKEND  run it with this sandbox.backend instead of the spec's (auto); see scripts/gpu-lib.sh
#   CELLS            only these cells of the grid, e.g. CELLS=in2048/out128 for a window's first measured cell
#   REPEATS, LIMIT, WS   repeats per cell (2), the command's time limit (560 s), the workspace (/var/tmp/ws-e2b)
# A parity checkpoint still training on this GPU (scripts/gpu-campaign.sh train) is waited for first: a cell
# measured beside it would time both.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
OUT=${OUT:-/var/tmp/out}
LIMIT=${LIMIT:-560}
WS=${WS:-/var/tmp/ws-e2b}
mkdir -p "$OUT"
SPEC=$(spec_for_backend "${SPEC:-experiments/gemma4-e2b-gpu.yaml}") || exit 2
if [ -n "${CELLS:-}" ]; then
  cells="$(dirname "$SPEC")/.$(basename "$SPEC" .yaml).cells.yaml"
  sed "/^benchmark:/a\\  only: [$CELLS]   # CELLS (scripts/gpu-measure.sh)" "$SPEC" > "$cells"
  SPEC=$cells
fi
wait_for_training
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
step "ratchet measure $SPEC" timeout -s INT -k 30 "$LIMIT" python3 -m agent.cli measure "$SPEC" --workspace "$WS" \
  --repeats "${REPEATS:-2}" --out "$OUT/h200-e2b-stock-grid.json" 2>&1 | tee "$OUT/measure.log"
echo "rc=${PIPESTATUS[0]}"
RUN=$(ls -d "$WS".runs/measure-* | tail -1)
cp "$RUN"/server-*.log "$OUT"/ 2>/dev/null
tar czf "$OUT/bench-jobs.tgz" -C "$RUN" . 2>/dev/null
ls -la "$OUT"
