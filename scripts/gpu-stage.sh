#!/usr/bin/env bash
# On the lent H200: keep the bundle part folders carried with this call in /var/tmp/ratchet-bundle, so
# that the parts of several calls (<= 64 MiB each) add up there. `--probe` also prints the machine.
set -uo pipefail
cd "$(dirname "$0")/.."
B=.bundle/h200-vllm026
D=/var/tmp/ratchet-bundle
mkdir -p "$D"
for p in "$B"/part-*; do [ -d "$p" ] && cp -r "$p" "$D"/; done
[ -f "$B/manifest.json" ] && cp "$B/manifest.json" "$B/install_bundle.py" "$D"/
du -sh "$D"/part-* 2>/dev/null
if [ "${1:-}" = "--probe" ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'
  command -v git gcc || true
  ldconfig -p | grep -c 'libcuda.so' ; env | grep -E '^(LD_LIBRARY_PATH|CUDA_HOME|PATH)=' ; nproc; df -h /var/tmp | tail -1
fi
