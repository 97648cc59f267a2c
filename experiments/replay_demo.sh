#!/usr/bin/env bash
# Re-creates the committed campaign that CI replays: runs experiments/replay-demo-cpu.yaml and keeps only
# what replay needs (log, blobs, public key, parity reference, report) under results/replay-demo/.
#   bash experiments/replay_demo.sh          (about 10-15 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=experiments/results/replay-demo
mkdir -p "$out"
.venv/bin/ratchet run experiments/replay-demo-cpu.yaml --log-dir "$out" --workspaces .ratchet/workspaces
latest=$(ls -td "$out"/*/ | head -1)
rm -rf "$latest/runs" "$latest/cache" "$latest/log.lock"
.venv/bin/ratchet audit verify "$latest" --pubkey "$latest/audit-key.pub"
echo "committed campaign: $latest"
