#!/usr/bin/env bash
# The harness's own calibration (issue 2): a no-op A/B (baseline vs itself) whose speedup CI must
# contain 1.0, and a planted slowdown (an engine arg that costs ~10-30 %) that must be detected.
# Both measured with the same spec, cells and repeats; JSON under experiments/results/.
#   bash experiments/noise_ab.sh [REPEATS]      (default 10 pairs per cell; ~15 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
repeats="${1:-10}"
cells="in512/out64,in512/out1"
out=experiments/results
.venv/bin/ratchet compare experiments/gemma4-tiny-cpu.yaml --baseline HEAD --candidate HEAD \
  --cells "$cells" --repeats "$repeats" --out "$out/noop-ab.json"
.venv/bin/ratchet compare experiments/gemma4-tiny-cpu.yaml --baseline HEAD --candidate HEAD \
  --engine-args '{"max_num_seqs": 6}' --cells "$cells" --repeats "$repeats" --out "$out/slowdown-ab.json"
