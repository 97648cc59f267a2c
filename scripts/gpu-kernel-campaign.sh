#!/usr/bin/env bash
# On the H200 host (run from the repo root, as one command): make ratchet importable from the wheels in .kwhl/
# (copied onto the host beside the repo: pydantic, structlog, rfc8785, cryptography, unidiff, gitpython... and
# git.deb, since the image has no git), then run the kernel campaign, verify its log, and leave the summary, the
# logs and the audit log (tgz) in $OUT.
# SPEC, ITERS and WALL override the spec, its iteration budget and its wall-time budget.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/var/tmp/out}
SPEC=${SPEC:-experiments/gemma4-e2b-attention-kernel.yaml}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .kwhl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
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
args=(--log-dir /var/tmp/klogs --workspaces /var/tmp/kws --out "$OUT/kernel-campaign-h200.json")
[ -n "${ITERS:-}" ] && args+=(--max-iterations "$ITERS")
[ -n "${WALL:-}" ] && args+=(--wall-seconds "$WALL")
timeout -s INT -k 20 "${LIMIT:-540}" python3 -m agent.cli kernel "$SPEC" "${args[@]}" 2>&1 | tee "$OUT/campaign.log"
echo "campaign rc=${PIPESTATUS[0]}"
for d in /var/tmp/klogs/*/; do python3 -m agent.cli audit verify "$d" 2>&1 | tee -a "$OUT/verify.txt"; done
tar czf "$OUT/kernel-campaign-log.tgz" --exclude='tree-*' -C /var/tmp/klogs . 2>/dev/null
ls -la "$OUT"
