#!/usr/bin/env bash
# On an offline GPU host after scripts/gpu-setup.sh (and, for `escape`, the parity checkpoint: gpu-campaign.sh
# train): candidate servers isolated by the bundle's bubblewrap with the GPU bound in, shown and timed.
#   probe    the tools the bwrap backend runs (RATCHET_SANDBOX_TOOLS) and a real sandbox started with the GPU's
#            device nodes and driver folders bound (python3 -m sandbox.host_tools --gpus 1)
#   redteam  the sandbox's own tests on this host's kernel: a candidate reaches neither the host nor another
#            candidate over the network, cannot write the host, and sees no signing key, log, held prompts or other
#            build's tree (tests/sandbox/test_local_netns.py, test_host_tools.py)
#   escape   real vLLM 0.26 on the GPU under `sandbox.backend: bwrap` (the campaign spec: 10 GiB of KV cache a
#            server, so A, B and their parity servers fit one GPU): `ratchet compare` on ESCAPE_CELL of stock vs
#            tests/redteam/runtime-escape.patch (at import, gemma4.py appends to the installed client, the harness,
#            another build's tree and the log, and reads the signing key); every attempt must fail, the files stay
#            as they were, parity holds
#   cost     what isolation costs: `ratchet measure` of CELL (REPEATS runs) unisolated (it also warms the compile
#            cache), then bwrap, then unisolated again; server start and tok/s of the last two, side by side
# STEPS picks steps (default: all, in that order); results in $OUT. Each step prints its seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
OUT=${OUT:-/var/tmp/out}
STEPS=${STEPS:-probe redteam escape cost}
CELL=${CELL:-in2048/out128}
ESCAPE_CELL=${ESCAPE_CELL:-in512/out256}
CKPT=/var/tmp/ratchet-e2b-shaped/model.safetensors
mkdir -p "$OUT"

escape() {
  local patch=/var/tmp/runtime-escape.patch ws=/var/tmp/ws-escape spec
  sed "s|\"/work/main/har\"|\"$PWD/har\"|" tests/redteam/runtime-escape.patch > "$patch"
  [ -f "$CKPT" ] || { echo "no parity checkpoint at $CKPT: scripts/gpu-campaign.sh train first"; return 1; }
  cp "$CKPT" experiments/models/gemma4-e2b-shaped/
  spec=$(SANDBOX_BACKEND=bwrap spec_for_backend experiments/gemma4-e2b-gpu-campaign.yaml) || return 1
  local site; site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  sha256sum "$site/vllm/benchmarks/serve.py" harness/bench.py > "$OUT/escape-before.sha256"
  python3 -m agent.cli compare "$spec" --workspace "$ws" --baseline HEAD --candidate "$patch" --cells "$ESCAPE_CELL" \
    --repeats 4 --out "$OUT/escape-compare.json" 2>&1 | tee "$OUT/escape-compare.log"
  grep -h "RATCHET_PROBE" "$ws".runs/compare-*/server-*.log | tee "$OUT/escape-probe.txt"
  sha256sum -c "$OUT/escape-before.sha256" && ! grep -q '"done"' "$OUT/escape-probe.txt" && grep -q . "$OUT/escape-probe.txt"
}

cost() {
  local backend
  for backend in unisolated bwrap unisolated; do
    SANDBOX_BACKEND=$backend CELLS=$CELL REPEATS=${REPEATS:-4} OUT=$OUT/cost-$backend bash scripts/gpu-measure.sh \
      > "$OUT/cost-$backend.log" 2>&1
    python3 - "$OUT/cost-$backend/h200-e2b-stock-grid.json" "$backend" <<'PY' | tee -a "$OUT/cost.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], "| isolation:", d["isolation"], "| server start %.0f s |" % d["startup_s"], json.dumps(d["cells"]))
PY
  done
}

for s in $STEPS; do
  case $s in
    probe) step "probe: the bwrap sandbox with the GPU bound" python3 -m sandbox.host_tools --gpus 1 ;;
    redteam) step "red team: network, filesystem, key, log, other tree" python3 -m pytest -q -p no:cacheprovider \
               tests/sandbox/test_local_netns.py tests/sandbox/test_host_tools.py 2>&1 | tee "$OUT/redteam.txt" ;;
    escape) step "runtime escape on real vLLM, GPU, bwrap" escape ;;
    cost) step "isolation's cost: $CELL unisolated, bwrap, unisolated" cost ;;
    *) echo "unknown step $s (probe, redteam, escape, cost)"; exit 2 ;;
  esac
done
