#!/usr/bin/env bash
# A kernel campaign on an offline GPU host, as one command from the repo root: make ratchet importable from the
# wheels in .kwhl/ (copied onto the host beside the repo: pydantic, structlog, rfc8785, cryptography, unidiff,
# gitpython... and git.deb where the host has no git), run `ratchet kernel SPEC`, verify its log, and leave the
# summary, the runner logs and the audit log (tgz) in $OUT.
#
#   SPEC    the kernel spec (default: ratchet's own attention kernel, experiments/gemma4-e2b-attention-kernel.yaml;
#           vLLM's own kernel: experiments/vllm-unified-attention-e2b.yaml)
#   ITERS, WALL, LIMIT   override the spec's iteration and wall-time budgets, and the command's own time limit
#   PATCHES  space-separated patch files to propose in order instead of the spec's proposer (ratchet kernel --patch)
#   VLLM_SOURCES   a .tgz of a vLLM release's Python sources (e.g. vllm-0.26.0's `vllm/`), for a host where vLLM
#           is not installed: it is installed into the same target as the wheels and becomes "the installed
#           vLLM" the vllm-unified-attention spec copies. That kernel path loads none of vLLM's compiled
#           extensions; empty modules stand in for the three its platform probe imports.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/var/tmp/out}
SPEC=${SPEC:-experiments/gemma4-e2b-attention-kernel.yaml}
SITE=/tmp/site
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .kwhl/*.whl \
  || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${VLLM_SOURCES:-}" ] && ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)'; then
  tar xzf "$VLLM_SOURCES" -C "$SITE" || exit 1
  for stub in _C_stable_libtorch _qutlass_C _moe_C_stable_libtorch; do : > "$SITE/vllm/$stub.py"; done
  version=$(basename "$VLLM_SOURCES" | sed -n 's/^vllm\([0-9]\)\([0-9]*\)-py.*/0.\2.0/p')
  mkdir -p "$SITE/vllm-${version:-0}.dist-info"   # vllm.triton_utils asks importlib.metadata for vllm's version
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "${version:-0}" > "$SITE/vllm-${version:-0}.dist-info/METADATA"
fi
if ! command -v git >/dev/null; then
  dpkg -x .kwhl/git.deb /var/tmp/gitroot
  printf '#!/bin/sh\nGIT_EXEC_PATH=/var/tmp/gitroot/usr/lib/git-core exec /var/tmp/gitroot/usr/bin/git "$@"\n' \
    > /usr/local/bin/git
  chmod +x /usr/local/bin/git
fi
git --version
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
name=$(basename "$SPEC" .yaml)
args=(--log-dir /var/tmp/klogs --workspaces /var/tmp/kws --out "$OUT/$name.json")
[ -n "${ITERS:-}" ] && args+=(--max-iterations "$ITERS")
[ -n "${WALL:-}" ] && args+=(--wall-seconds "$WALL")
for patch in ${PATCHES:-}; do args+=(--patch "$patch"); done
timeout -s INT -k 20 "${LIMIT:-540}" python3 -m agent.cli kernel "$SPEC" "${args[@]}" 2>&1 | tee "$OUT/campaign.log"
echo "campaign rc=${PIPESTATUS[0]}"
for d in /var/tmp/klogs/*/; do python3 -m agent.cli audit verify "$d" 2>&1 | tee -a "$OUT/verify.txt"; done
tar czf "$OUT/$name-log.tgz" --exclude='tree-*' -C /var/tmp/klogs . 2>/dev/null
ls -la "$OUT"
