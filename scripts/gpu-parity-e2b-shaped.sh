#!/usr/bin/env bash
# On a GPU host with vLLM (scripts/gpu-setup.sh) and the E2B-shaped checkpoint trained
# (experiments/models/gemma4-e2b-shaped/train.py): how parity behaves on E2B's attention shapes.
#   1. record a reference from stock vLLM (the E2B GPU spec's parity: 256 held prompts at concurrency 256,
#      the 4 longest also one at a time, 64 greedy tokens, top-k logprobs)
#   2. A/A: a fresh server of the same build, and the same build with enforce_eager (the drift a harmless
#      change makes, which a logprob tolerance must sit above)
#   3. the planted bugs (experiments/models/gemma4-e2b-shaped/planted/*.patch), each on its own workspace
# Every run writes `ratchet parity --report` JSON and its console output to $OUT. The spec is the shipped
# experiments/gemma4-e2b-gpu.yaml (sandbox auto: the bundle's bubblewrap on a host without Docker);
# SANDBOX_BACKEND=unisolated names another (scripts/gpu-lib.sh).   STEPS="ref aa eager planted" selects steps.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
OUT=${OUT:-/var/tmp/out}
W=${W:-/var/tmp/e2bs-parity}
STEPS=${STEPS:-ref aa eager planted}
mkdir -p "$W" "$OUT"
SPEC=$(spec_for_backend experiments/gemma4-e2b-gpu.yaml) || exit 2

workspace() {  # workspace NAME [PATCH] [ENGINE_ARG=VALUE]
  local ws=$W/ws-$1
  [ -d "$ws/.git" ] && return 0
  python3 -c 'import sys, yaml; from pathlib import Path; from agent.spec import load_spec; from sandbox.workspace import Workspace
s = load_spec(Path(sys.argv[1])); args = dict(s.server.engine_args)
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1); args[k] = yaml.safe_load(v)
Workspace.create(Path(sys.argv[2]), serving=args)' "$SPEC" "$ws" "${@:3}" || return 1
  if [ -n "${2:-}" ]; then git -C "$ws" apply "$2" && git -C "$ws" -c user.email=r@r -c user.name=r commit -qam "planted: $(basename "$2")"; fi
}

parity() {  # parity NAME ARGS...: one `ratchet parity` run, timed, its output kept
  local name=$1; shift
  local t0; t0=$(date +%s)
  python3 -m agent.cli parity "$SPEC" --workspace "$W/ws-$name" "$@" > "$OUT/parity-$name.txt" 2>&1
  local rc=$?
  echo "$name: rc $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/parity-$name.txt")"
}

for step in $STEPS; do
  case $step in
  ref)   workspace stock && parity stock --record "$W/reference.json" && cp "$W/reference.json" "$OUT/" ;;
  aa)    parity stock --reference "$W/reference.json" --report "$OUT/report-aa.json" ;;
  eager) workspace eager "" enforce_eager=true && parity eager --reference "$W/reference.json" --report "$OUT/report-eager.json" ;;
  planted)
    for p in "$PWD"/experiments/models/gemma4-e2b-shaped/planted/*.patch; do
      n=$(basename "$p" .patch)
      workspace "$n" "$p" && parity "$n" --reference "$W/reference.json" --report "$OUT/report-$n.json"
    done ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done
