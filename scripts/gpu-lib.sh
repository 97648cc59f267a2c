# Shared by the scripts/gpu-*.sh scripts (sourced, not run): timed steps, the spec a script runs under
# SANDBOX_BACKEND, and the sandbox tools the bundle brought.

# step NAME COMMAND [ARGS...]: run one step, print how long it took and the script's total so far. Under
# `set -e` a failing step ends the script; the EXIT trap below names it.
step() {
  GPU_STEP=$1
  shift
  local t0=$SECONDS
  echo "== $GPU_STEP"
  "$@"
  echo "== $GPU_STEP: $((SECONDS - t0)) s (total $SECONDS s)"
  GPU_STEP=
}
GPU_STEP=
trap 'rc=$?; [ -n "$GPU_STEP" ] && echo "== $GPU_STEP: FAILED (exit $rc) after $SECONDS s in all" >&2; exit $rc' EXIT

# spec_for_backend SPEC: prints the spec to run. Without SANDBOX_BACKEND, SPEC itself. With it (auto, docker,
# bwrap, unisolated), a copy beside SPEC (a spec's relative paths are relative to its folder; git ignores
# experiments/.*.yaml) whose sandbox.backend is SANDBOX_BACKEND, and says so on stderr. `unisolated` is for
# search or patch-file proposers only: the llm proposer refuses it.
spec_for_backend() {
  local spec=$1 out
  if [ -z "${SANDBOX_BACKEND:-}" ]; then
    echo "$spec"
    return 0
  fi
  case $SANDBOX_BACKEND in
    auto|docker|bwrap|unisolated) ;;
    *) echo "SANDBOX_BACKEND=$SANDBOX_BACKEND: one of auto, docker, bwrap, unisolated" >&2; return 2 ;;
  esac
  out="$(dirname "$spec")/.$(basename "$spec" .yaml).$SANDBOX_BACKEND.yaml"
  sed "s/^  backend: [a-z]*\( .*\)\?$/  backend: $SANDBOX_BACKEND   # SANDBOX_BACKEND (scripts\/gpu-lib.sh)/" \
    "$spec" > "$out"
  if [ "$(grep -c "^  backend: $SANDBOX_BACKEND " "$out")" != 1 ]; then
    echo "could not set sandbox.backend in $out (one '  backend:' line under sandbox: expected)" >&2
    return 1
  fi
  echo "sandbox.backend: $SANDBOX_BACKEND (set by SANDBOX_BACKEND) in $out" >&2
  echo "$out"
}

# wait_for_training: the parity checkpoint's training (scripts/gpu-campaign.sh train) shares the GPU; nothing is
# measured beside it.
TRAIN_PID=/var/tmp/ratchet-campaign/train.pid
wait_for_training() {
  if [ -f "$TRAIN_PID" ] && kill -0 "$(cat "$TRAIN_PID")" 2>/dev/null; then
    step "wait for the parity checkpoint's training" \
      bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done' _ "$(cat "$TRAIN_PID")"
  fi
}

# The bubblewrap, ip and iptables that scripts/gpu-setup.sh unpacked from the bundle (a host without them):
# sandbox/host_tools.py runs them from here when RATCHET_SANDBOX_TOOLS names the folder.
GPU_TOOLS=/var/tmp/ratchet-tools
if [ -z "${RATCHET_SANDBOX_TOOLS:-}" ] && [ -x "$GPU_TOOLS/usr/bin/bwrap" ]; then
  export RATCHET_SANDBOX_TOOLS=$GPU_TOOLS
fi
