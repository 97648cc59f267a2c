#!/usr/bin/env bash
# A serving campaign on an offline GPU host (vLLM from ratchet's bundle), driven by several commands within a fixed
# budget of GPU time:
#   scripts/gpu-campaign.sh train     start training the E2B-shaped parity checkpoint (~1.5 min estimated on an H200) in its own
#                                     session, with a private copy of the host's transformers, so that it runs
#                                     while the bundle parts are carried over and installed
#   scripts/gpu-campaign.sh start     after scripts/gpu-stage.sh has gathered every bundle part: install the
#                                     bundle (scripts/gpu-setup.sh), then start `ratchet run` in its own session,
#                                     from a private copy of the repo, so it outlives the shell that started it
#   scripts/gpu-campaign.sh replay    the same set-up, then `ratchet replay` of a committed campaign log (REPLAY_LOG)
#   scripts/gpu-campaign.sh wait N    wait up to N s for it to end; print its progress
#   scripts/gpu-campaign.sh collect   stop it if still running (SIGTERM: it stops its servers, checkpoints its log), verify the audit log,
#                                     leave the log (tgz), the report and the console output in $OUT
# GPU_TIME_LEFT_S (s, for `start`): what the budget of GPU time has left; the loop's wall budget is derived from it
# (WINDOW_LEFT_S, its earlier name, is read too). WALL_S sets the loop's wall budget itself.
# SANDBOX_BACKEND (for `start`): run the spec with this sandbox.backend instead of its own (auto; scripts/gpu-lib.sh
# writes the copy and says so). `auto` isolates with the bundle's bubblewrap on a host without Docker;
# `unisolated` (by name) only for proposers whose candidates are serving.yaml edits (search), or for kernel
# patches files given by name (KERNEL_SPEC): the llm proposer refuses an unisolated sandbox anyway.
# KERNEL_SPEC (for `start`): run a two-stage kernel campaign instead, `ratchet kernel KERNEL_SPEC --serving SPEC`:
# the kernel stage on vLLM's installed attention kernel, then stock vs its best served end to end by SPEC (e.g.
# KERNEL_SPEC=experiments/vllm-unified-attention-e2b.yaml SPEC=experiments/gemma4-e2b-gpu-kernel-serving.yaml).
# PATCHES (with KERNEL_SPEC): space-separated patch files proposed in order instead of the kernel spec's search.
# Its wall budget is the kernel stage's; the serving stage runs after it.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
STATE=/var/tmp/ratchet-campaign
SRC=$STATE/src
SPEC=${SPEC:-experiments/gemma4-e2b-gpu-campaign.yaml}
OUT=${OUT:-/var/tmp/out}
mkdir -p "$STATE" "$OUT"

progress() {
  # the console view redraws in place; keep the last state of each line
  tr '\r' '\n' < "$STATE/campaign.log" | grep -v '^\s*$' | tail -n "${1:-30}"
}

running() { [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; }

CKPT=/var/tmp/ratchet-e2b-shaped
training() { [ -f "$STATE/train.pid" ] && kill -0 "$(cat "$STATE/train.pid")" 2>/dev/null; }

prepare() {
  # the checkout may be refreshed before the next command; the campaign reads its own copy (bundle parts left out)
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar --exclude=./.bundle --exclude=./.whl --exclude=./.git -cf - . | (cd "$SRC" && tar xf -)
  cd "$SRC"
  SPEC=$(spec_for_backend "$SPEC") || return 2
  [ -z "${SANDBOX_BACKEND:-}" ] || echo "sandbox.backend: $SANDBOX_BACKEND (set by SANDBOX_BACKEND)" >> "$STATE/gpu.txt"
  # Parity runs on the E2B-shaped checkpoint, trained on this host once (~1.5 min estimated on an H200; measured with the
  # host's transformers, before the bundle installs its own). The weights live outside the copied tree.
  if training; then   # started by `train`: wait for it (set-up below would otherwise compete for the GPU)
    SKIP_WORKSPACE=1 ${SETUP:-scripts/gpu-setup.sh} || return 1
    SETUP=true
    echo "waiting for the parity checkpoint's training"; while training; do sleep 5; done
    tail -5 "$STATE/train.log"
  fi
  if [ ! -f "$CKPT/model.safetensors" ]; then
    python3 experiments/models/gemma4-e2b-shaped/train.py --out "$CKPT" > "$STATE/train.log" 2>&1 \
      || { tail -20 "$STATE/train.log"; return 1; }
  fi
  cp "$CKPT/model.safetensors" experiments/models/gemma4-e2b-shaped/   # a copy: a sandbox mounts the folder, not a link's target
  SKIP_WORKSPACE=1 ${SETUP:-scripts/gpu-setup.sh} || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$STATE/gpu.txt"
}

case "${1:-}" in
train)
  if [ -f "$CKPT/model.safetensors" ] || training; then echo "checkpoint present or in training"; exit 0; fi
  # The bundle installs its own transformers (5.5.3) into python3's environment while this runs: the training
  # imports the host's (measured with it) from a copy made now.
  HOST_SITE=/var/tmp/host-site
  rm -rf "$HOST_SITE" && mkdir -p "$HOST_SITE"
  for m in transformers tokenizers; do
    d=$(python3 -c "import $m, os; print(os.path.dirname($m.__file__))") && cp -r "$d" "$HOST_SITE"/
  done
  PYTHONPATH=$HOST_SITE PYTHONUNBUFFERED=1 setsid nohup python3 experiments/models/gemma4-e2b-shaped/train.py \
    --out "$CKPT" > "$STATE/train.log" 2>&1 < /dev/null &
  echo $! > "$STATE/train.pid"
  sleep 5
  tail -3 "$STATE/train.log"
  training && echo "training (pid $(cat "$STATE/train.pid"))" || { echo "training exited early"; exit 1; }
  ;;
start)
  T_START=$(date +%s)
  prepare || exit 1
  # Baseline (two server starts) comes before the loop and is not on the loop's wall budget.
  # What set-up (and training) took comes off the budget too.
  LEFT=${GPU_TIME_LEFT_S:-${WINDOW_LEFT_S:-1500}}
  # A WALL_S given is taken as it is (a kernel stage's 5 patches take ~200 s): the 300-s floor guards only the
  # budget derived here, and once refused a 260-s WALL_S after a 7-minute wait for the parity training.
  if [ -n "${WALL_S:-}" ]; then
    WALL=$WALL_S
    [ "$WALL" -gt 0 ] 2>/dev/null || { echo "WALL_S: $WALL_S? (seconds, above 0)"; exit 2; }
  else
    WALL=$(( LEFT - ($(date +%s) - T_START) - ${BASELINE_S:-420} - ${MARGIN_S:-120} ))
    [ "$WALL" -ge 300 ] || { echo "GPU time too short: loop budget would be $WALL s; raise GPU_TIME_LEFT_S"; exit 1; }
  fi
  echo "loop wall budget: $WALL s" | tee -a "$STATE/gpu.txt"
  date +%s > "$STATE/started"
  if [ -n "${KERNEL_SPEC:-}" ]; then
    cmd=(kernel "$KERNEL_SPEC" --serving "$SPEC" --out "$STATE/kernel-summary.json")
    for patch in ${PATCHES:-}; do cmd+=(--patch "$patch"); done
  else
    cmd=(run "$SPEC")
  fi
  PYTHONUNBUFFERED=1 setsid nohup python3 -m agent.cli "${cmd[@]}" --log-dir "$STATE/logs" \
    --workspaces "$STATE/ws" --wall-seconds "$WALL" > "$STATE/campaign.log" 2>&1 < /dev/null &
  echo $! > "$STATE/pid"
  sleep 20
  progress 20
  running && echo "campaign running (pid $(cat "$STATE/pid"))" || { echo "campaign exited early"; exit 1; }
  ;;
replay)
  # `ratchet replay` of a committed campaign log (REPLAY_LOG: a .tgz under experiments/results/) on this host, in
  # the background like `start`; REPLAY_ARGS go to `ratchet replay` (e.g. --repeats 6). `wait` and `collect` follow.
  LOG_TGZ=$(realpath "${REPLAY_LOG:?REPLAY_LOG: the campaign log (.tgz) to replay}")
  prepare || exit 1
  rm -rf "$STATE/replayed" && mkdir -p "$STATE/replayed" && tar xzf "$LOG_TGZ" -C "$STATE/replayed"
  log=$(ls -d "$STATE"/replayed/*/ | head -1)
  date +%s > "$STATE/started"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 setsid nohup python3 -m agent.cli replay "$log" --work-dir "$STATE/replay-work" \
    --junit "$STATE/replay-junit.xml" --summary "$STATE/replay-summary.md" ${REPLAY_ARGS:-} \
    > "$STATE/campaign.log" 2>&1 < /dev/null &
  echo $! > "$STATE/pid"
  sleep 20
  progress 20
  running && echo "replay running (pid $(cat "$STATE/pid"))" || { echo "replay exited early"; exit 1; }
  ;;
wait)
  end=$(( $(date +%s) + ${2:-540} ))
  while running && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  progress 40
  echo "elapsed $(( $(date +%s) - $(cat "$STATE/started") )) s; $(running && echo running || echo ended)"
  ;;
collect)
  if running; then
    echo "still running: stopping it (SIGTERM)"
    kill -TERM "$(cat "$STATE/pid")" 2>/dev/null   # ratchet stops its servers and checkpoints its log
    for _ in $(seq 60); do running || break; sleep 1; done
  fi
  progress 60 > "$OUT/campaign-console.txt"
  cp "$STATE/gpu.txt" "$OUT/" 2>/dev/null
  cd "$SRC"
  for d in "$STATE"/logs/*/; do
    python3 -m agent.cli audit verify "$d" 2>&1 | tee -a "$OUT/verify.txt"
    cp "$d"/summary.md "$OUT/campaign-summary.md" 2>/dev/null
  done
  cp "$STATE"/kernel-summary.json "$STATE"/kernel-summary.md "$STATE"/replay-summary.md "$STATE"/replay-junit.xml \
    "$OUT"/ 2>/dev/null
  # The benchmark datasets are left out (the seeds rebuild them); the client's detailed results stay. Files come back
  # from the host in pieces of at most 16 MiB: `cat campaign-log.tgz.part-* > campaign-log.tgz` puts them together.
  tar czf "$STATE/campaign-log.tgz" --exclude='tree-*' --exclude='cache' --exclude='prompts-*.jsonl' \
    -C "$STATE/logs" . 2>/dev/null
  split -b 15M "$STATE/campaign-log.tgz" "$OUT/campaign-log.tgz.part-"
  for d in "$STATE"/logs/*/; do python3 experiments/campaign_time.py "$d" --out "$OUT/campaign-time.json" >/dev/null; done
  ls -la "$OUT"
  ;;
*)
  echo "usage: $0 train|start|replay|wait SECONDS|collect" >&2
  exit 2
  ;;
esac
