#!/usr/bin/env bash
# On an offline GPU host (after gpu-setup.sh): a short `ratchet compare` A/B, stock vs one engine-arg change,
# on a reduced grid (in2048: out128 + prefill, REPEATS pairs). Both servers share the one GPU, so both get
# gpu_memory_utilization 0.42 (a derived spec in /var/tmp; the committed spec is unchanged).
# SANDBOX_BACKEND: run it with this sandbox.backend instead of the spec's (auto); see scripts/gpu-lib.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
SPEC=$(spec_for_backend experiments/gemma4-e2b-gpu.yaml) || exit 2
OUT=${OUT:-/var/tmp/out}
LIMIT=${LIMIT:-540}
CAND=${CAND:-'{"max_num_batched_tokens": 16384}'}
mkdir -p "$OUT"
python3 - "$SPEC" <<'PY'
import sys
from pathlib import Path
import yaml
src = Path(sys.argv[1])
d = yaml.safe_load(src.read_text())
d["name"] = "gemma4-e2b-gpu-ab"
d["server"]["model"] = str((src.parent / d["server"]["model"]).resolve())
d["parity"]["prompts"] = str((src.parent / d["parity"]["prompts"]).resolve())
d["server"]["engine_args"]["gpu_memory_utilization"] = 0.42
d["benchmark"].update(input_lens=[2048], output_lens=[128], prefill=True, repeats=int(__import__("os").environ.get("REPEATS", "2")))
Path("/var/tmp/gemma4-e2b-gpu-ab.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
PY
# Seed both servers' compile caches from the measure run (start-up time only; throughput is unaffected).
SRC=$(ls -d /var/tmp/.cache/*/ 2>/dev/null | grep -v /compare/ | head -1)
for t in A B; do mkdir -p /var/tmp/.cache/compare/$t; [ -n "$SRC" ] && cp -r "$SRC". /var/tmp/.cache/compare/$t/; done
wait_for_training
timeout -s INT -k 30 "$LIMIT" python3 -m agent.cli compare /var/tmp/gemma4-e2b-gpu-ab.yaml --workspace /var/tmp/ws-ab \
  --baseline HEAD --candidate HEAD --engine-args "$CAND" --out "$OUT/h200-e2b-ab.json" 2>&1 | tee "$OUT/compare.log"
echo "rc=${PIPESTATUS[0]}"
RUN=$(ls -d /var/tmp/ws-ab.runs/compare-* | tail -1)
cp "$RUN"/server-*.log "$OUT"/ 2>/dev/null
tar czf "$OUT/ab-jobs.tgz" -C "$RUN" --exclude 'tree-*' . 2>/dev/null
ls -la "$OUT"
