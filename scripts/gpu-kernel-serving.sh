#!/usr/bin/env bash
# End to end on an offline GPU host (vLLM 0.26 from ratchet's bundle): stock vLLM vs vLLM with the kernel patches a
# kernel campaign accepted for its Triton unified attention (the prelude, then each patch, applied in order and
# committed in one workspace), served side by side with the same engine args and measured interleaved with
# ratchet's harness (harness.measure.ab_compare: the pristine `vllm bench serve` client, the other server frozen
# during each run, paired Student-t intervals from harness/stats.py). Parity is not checked here (parity=None):
# the speed model has dummy weights, and the E2B-shaped parity checkpoint would have to be trained on the host
# first; use `ratchet compare` (or `ratchet kernel --serving`) where it is.
#
#   scripts/gpu-kernel-serving.sh start    after scripts/gpu-stage.sh has gathered every bundle part: install it
#                                          (scripts/gpu-setup.sh), start the A/B in its own session, wait WAIT_S
#   scripts/gpu-kernel-serving.sh wait N   wait up to N s; print progress
#   scripts/gpu-kernel-serving.sh collect  stop it if still running; the per-cell table from the pairs completed
#                                          so far; logs, runs and the table to $OUT
#   scripts/gpu-kernel-serving.sh analyze RUNS.jsonl [OUT.json]   the table from a runs file (any machine)
#
#   SPEC     the serving spec whose server, engine args and benchmark settings are used
#            (default experiments/gemma4-e2b-gpu-campaign.yaml: E2B dummy weights, TRITON_ATTN, 0.42 of the GPU
#            each since A and B share it, PyTorch's sampler)
#   CELLS    cells in order of priority; each repeat runs them all (default below)
#   REPEATS  interleaved pairs per cell asked for (default 8); `collect` keeps what completed
#   NUM_PROMPTS, CONCURRENCY   override the spec's benchmark.num_prompts and max_concurrency (one pair of
#            values for every cell)
#   PATCHES  the patches applied in order on top of stock vLLM (default: the prelude, window-segments,
#            h200-prefill-tunables of experiments/kernels/vllm_unified_attention/)
#   SANDBOX_BACKEND   run the servers with this sandbox.backend instead of the spec's (auto: Docker, else the
#            bundle's bubblewrap); `unisolated` by name as before (scripts/gpu-lib.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
STATE=/var/tmp/kernel-serving
OUT=${OUT:-/var/tmp/out}
SPEC=${SPEC:-experiments/gemma4-e2b-gpu-campaign.yaml}
CELLS=${CELLS:-in8192/out1,in8192/out128,in2048/out256,in512/out256}
REPEATS=${REPEATS:-8}
P=experiments/kernels/vllm_unified_attention
PATCHES=${PATCHES:-$P/vllm-0.26-gemma4-tunables.patch $P/window-segments.patch $P/h200-prefill-tunables.patch}
mkdir -p "$OUT"

running() { [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; }

analyze() {  # analyze RUNS.jsonl [OUT.json]
  python3 - "$@" <<'PY'
import json, math, sys
from collections import defaultdict
from harness.config import StatsConfig
from harness.stats import overall_ci, speedup_ci

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
head = lambda cell: "prefill_tok_s" if cell.endswith("/out1") else "total_token_throughput"
by = defaultdict(dict)                     # (cell, repeat) -> tag -> metrics
for r in rows:
    by[(r["cell"], r["repeat"])][r["tag"]] = r["metrics"]
cells = list(dict.fromkeys(r["cell"] for r in rows))
cfg, out = StatsConfig(), {"cells": {}}
print(f"{'cell':16} {'metric':22} {'stock (A)':>10} {'patched (B)':>11}  ratio B/A [95% CI]  n")
complete = {}
for cell in cells:
    pairs = sorted((rep, d) for (c, rep), d in by.items() if c == cell and {"A", "B"} <= d.keys())
    complete[cell] = {rep for rep, _ in pairs}
    entry = {"n_pairs": len(pairs), "metric": head(cell)}
    for metric in (head(cell), "median_ttft_ms", "median_tpot_ms"):
        a = [d["A"][metric] for _, d in pairs]
        b = [d["B"][metric] for _, d in pairs]
        if len(pairs) < 2 or min(a + b) <= 0:
            continue
        ci = speedup_ci(a, b, cfg) if metric == head(cell) else speedup_ci(b, a, cfg)  # latencies: A/B
        med = lambda x: sorted(x)[len(x) // 2] if len(x) % 2 else sum(sorted(x)[len(x) // 2 - 1:len(x) // 2 + 1]) / 2
        entry[metric] = {"a_median": med(a), "b_median": med(b), "a": a, "b": b, "ratio": ci.ratio,
                         "low": ci.low, "high": ci.high, "n": ci.n}
        print(f"{cell:16} {metric:22} {med(a):10.1f} {med(b):11.1f}  {ci.ratio:.3f} [{ci.low:.3f}, {ci.high:.3f}]  {ci.n}")
    out["cells"][cell] = entry
common = set.intersection(*complete.values()) if complete else set()
if len(common) >= 2:
    a = {c: [by[(c, r)]["A"][head(c)] for r in sorted(common)] for c in cells}
    b = {c: [by[(c, r)]["B"][head(c)] for r in sorted(common)] for c in cells}
    ci = overall_ci(a, b, cfg)
    out["overall"] = {"ratio": ci.ratio, "low": ci.low, "high": ci.high, "n": ci.n}
    print(f"overall (geo-mean of {len(cells)} cells, {ci.n} complete repeats): {ci.ratio:.3f} [{ci.low:.3f}, {ci.high:.3f}]")
if len(sys.argv) > 2:
    open(sys.argv[2], "w").write(json.dumps(out, indent=1) + "\n")
PY
}

case "${1:-}" in
start)
  T0=$(date +%s)
  rm -rf "$STATE" && mkdir -p "$STATE/src"
  # The A/B runs from its own copy of the checkout (bundle parts left out), as scripts/gpu-campaign.sh does: a host
  # may copy the checkout again before the next command, and the harness it imports is on the measurement path.
  tar --exclude=./.bundle --exclude=./.whl --exclude=./.git -cf - . | (cd "$STATE/src" && tar xf -)
  cd "$STATE/src"
  SPEC=$(spec_for_backend "$SPEC") || exit 2
  SKIP_WORKSPACE=1 scripts/gpu-setup.sh || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$STATE/gpu.txt"
  cat > "$STATE/driver.py" <<'PY'
import json, os, signal, sys, time, hashlib
from pathlib import Path
from agent.spec import load_spec
from harness.measure import Build, ab_compare
from sandbox.factory import backend_from_config
from sandbox.workspace import Workspace

state, t0 = Path(os.environ["STATE"]), time.time()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # unwind: the servers are stopped on the way out
log = lambda msg: print(f"[{time.time() - t0:6.0f} s] {msg}", flush=True)
spec = load_spec(Path(os.environ["SPEC"]))
cells = os.environ["CELLS"].split(",")
ins = sorted({int(c.split("/")[0][2:]) for c in cells})
outs = sorted({int(c.split("/")[1][3:]) for c in cells} - {1})
load = {k: int(os.environ[v]) for k, v in (("num_prompts", "NUM_PROMPTS"), ("max_concurrency", "CONCURRENCY"))
        if os.environ.get(v)}
bench = spec.benchmark.model_copy(update={"input_lens": ins, "output_lens": outs, "prefill": True,
                                          "only": cells, "repeats": int(os.environ["REPEATS"]), **load})
assert [c.label for c in bench.cells()] == cells, bench.cells()
sandbox = spec.sandbox   # the spec's (SANDBOX_BACKEND: a copy naming another, scripts/gpu-lib.sh)
ws = Workspace.create(state / "ws", serving=dict(spec.server.engine_args))
stock = ws.head()
for patch in os.environ["PATCHES"].split():
    ws.apply_patch(Path(patch).read_text())
    ws.commit(f"apply {Path(patch).name}")
    log(f"applied {patch}")
patched = ws.head()
work = state / "run"
kernel = "vllm/v1/attention/ops/triton_unified_attention.py"
builds = []
for tag, ref in (("A", stock), ("B", patched)):
    tree = ws.checkout_copy(ref, work / f"tree-{tag}")
    builds.append(Build(tag=tag, tree=tree, engine_args=ws.serving_config(ref), ref=ref, cache_key=ws.tree_hash(ref)))
    log(f"{tag} = {ref[:12]} {kernel} sha256 {hashlib.sha256((tree / kernel).read_bytes()).hexdigest()[:16]}")
a, b = builds
log(f"engine args {a.engine_args}; env {spec.server.env}; cells {cells}; {bench.repeats} pairs asked for; "
    f"{bench.num_prompts} prompts at concurrency {bench.max_concurrency}, prefill x{bench.prefill_prompts_factor}, "
    f"{bench.num_warmups} warm-ups")
runs = open(state / "runs.jsonl", "a")

def on_run(run):
    row = {"tag": run.job.tag, "cell": run.job.cell.label, "repeat": run.job.repeat, "wall_s": run.wall_s,
           "metrics": run.metrics()}
    runs.write(json.dumps(row) + "\n"); runs.flush()
    m = run.metrics()
    log(f"run {run.job.tag} {run.job.cell.label} r{run.job.repeat}: total {m['total_token_throughput']:.0f} tok/s, "
        f"prefill {m['prefill_tok_s']:.0f} tok/s, wall {run.wall_s:.1f} s")

result = ab_compare(backend_from_config(sandbox), a, b, server=spec.server, bench=bench, stats_cfg=spec.stats,
                    parity=None, work_dir=work, cache_dir=state / "cache", progress=log, on_run=on_run)
out = {"a": {"ref": a.ref, "startup_s": result.a.startup_s, "evidence": result.a.evidence},
       "b": {"ref": b.ref, "startup_s": result.b.startup_s, "evidence": result.b.evidence},
       "repeats": bench.repeats, "overall": vars(result.overall) if result.overall else None,
       "cells": {label: {m: vars(ci) for m, ci in per.items()} for label, per in result.cells.items()}}
(state / "result.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
log(f"done: overall {result.overall}")
PY
  date +%s > "$STATE/started"
  STATE=$STATE SPEC=$SPEC CELLS=$CELLS REPEATS=$REPEATS PATCHES=$PATCHES PYTHONUNBUFFERED=1 \
    NUM_PROMPTS=${NUM_PROMPTS:-} CONCURRENCY=${CONCURRENCY:-} \
    setsid nohup python3 "$STATE/driver.py" > "$STATE/driver.log" 2>&1 < /dev/null &
  echo $! > "$STATE/pid"
  echo "set-up took $(( $(date +%s) - T0 )) s; A/B running (pid $(cat "$STATE/pid"))"
  exec bash "$0" wait "${WAIT_S:-60}"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-540} ))
  while running && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  tail -n "${TAIL:-25}" "$STATE/driver.log"
  cp "$STATE"/driver.log "$STATE"/runs.jsonl "$OUT"/ 2>/dev/null   # what has completed, should the host go away
  echo "elapsed $(( $(date +%s) - $(cat "$STATE/started") )) s; $(running && echo running || echo ended)"
  ;;
collect)
  if running; then
    echo "still running: stopping it (SIGTERM)"
    kill -TERM "$(cat "$STATE/pid")"
    for _ in $(seq 30); do running || break; sleep 1; done
  fi
  cp "$STATE"/driver.log "$STATE"/runs.jsonl "$STATE"/gpu.txt "$OUT"/ 2>/dev/null
  cp "$STATE"/result.json "$OUT"/ 2>/dev/null
  for t in A B; do   # start-up anatomy from each server's log
    grep -hE "torch.compile took|Compiling a graph|Graph capturing finished|init engine|Memory profiling|KV cache|Available KV" \
      "$STATE/run/server-$t.log" 2>/dev/null | sed "s/^/$t: /" | cut -c1-300
  done | tee "$OUT/startup.txt"
  tar czf "$OUT/kernel-serving-log.tgz" -C "$STATE" driver.log runs.jsonl gpu.txt run/server-A.log run/server-B.log \
    run/bench/client.log 2>/dev/null
  analyze "$STATE/runs.jsonl" "$OUT/table.json"
  ls -la "$OUT"
  ;;
analyze)
  shift; analyze "$@"
  ;;
*)
  echo "usage: $0 start|wait SECONDS|collect|analyze RUNS.jsonl [OUT.json]" >&2
  exit 2
  ;;
esac
