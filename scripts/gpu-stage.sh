#!/usr/bin/env bash
# On an offline GPU host: copy the bundle part folders this checkout holds into /var/tmp/ratchet-bundle, so that
# parts carried over separately (each at most the bundle's --chunk-mb) add up there; prints what is there and
# what is missing. `--probe` also describes the host (and which of the tools the bundle brings it already has).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
B=.bundle/h200-vllm026
D=/var/tmp/ratchet-bundle
mkdir -p "$D"
for p in "$B"/part-*; do [ -d "$p" ] && cp -r "$p" "$D"/; done
[ -f "$B/manifest.json" ] && cp "$B/manifest.json" "$B/install_bundle.py" "$D"/
du -sh "$D"/part-* 2>/dev/null
if [ -f "$D/manifest.json" ]; then
  python3 -c 'import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
chunks = json.loads((d / "manifest.json").read_text())["chunks"]
missing = [c["file"] for c in chunks if not (d / c["file"]).is_file()]
print(len(chunks) - len(missing), "of", len(chunks), "parts here;", "missing: " + " ".join(missing) if missing else "all there")' "$D"
fi
echo "staged in $((SECONDS - t0)) s"
if [ "${1:-}" = "--probe" ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'
  command -v git gcc bwrap ip iptables setpriv dpkg-deb || true
  ldconfig -p | grep -c 'libcuda.so' ; env | grep -E '^(LD_LIBRARY_PATH|CUDA_HOME|PATH)=' ; nproc; df -h /var/tmp | tail -1
fi
