#!/usr/bin/env bash
# Build a vLLM 0.26 bundle for an offline GPU host with torch 2.11+cu130 and Python 3.12 and no package index (the
# host image whose packages are experiments/results/h200-host-packages.txt) with ratchet's own bundle tool. For
# another host, pass its `pip freeze` as --host-packages. Wheels are cached in .whl/cache; the bundle lands in
# .bundle/h200-vllm026 (or $1). Excluded: the CuteDSL/FA4, tilelang, tokenspeed, video and nvcc packages, which the
# E2B specs' serving path (TRITON_ATTN) was measured to run without, and numpy (the host's 2.5 works).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.bundle/h200-vllm026}
PY=${PY:-.venv/bin/python}
rm -rf "$OUT"
exec "$PY" -m agent.cli bundle build --vllm 0.26.0 --python 3.12 --platform manylinux_2_39_x86_64 \
  --host-packages experiments/results/h200-host-packages.txt --pin .whl/lean-pins.txt --cache .whl/cache \
  --extra transformers==5.5.3 tokenizers==0.22.2 structlog==26.1.0 gitpython==3.2.1 unidiff==1.0.1 rfc8785==0.1.4 cuda-python==13.4.4 \
  --exclude torchcodec pynvvideocodec tilelang nvidia-cutlass-dsl quack-kernels tokenspeed-mla cuda-tile \
            nvidia-cuda-cccl nvidia-cuda-nvcc numpy \
  --drop 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/third_party/deep_gemm/_C.cpython-310-*.so' \
         'vllm/third_party/deep_gemm/_C.cpython-311-*.so' 'vllm/third_party/deep_gemm/_C.cpython-313-*.so' \
         'vllm/third_party/deep_gemm/_C.cpython-314-*.so' \
  --chunk-mb "${CHUNK_MB:-58}" --out "$OUT"
