#!/usr/bin/env bash
# Build the vLLM 0.26 bundle for the offline H200 host (torch 2.11+cu130, Python 3.12, no index) with ratchet's
# own bundle tool. Wheels are cached in .whl/cache (git-ignored); the bundle lands in .bundle/h200-vllm026.
# Excluded: the CuteDSL/FA4, tilelang, tokenspeed, video and nvcc packages that the measured lean set
# (../shared/gpu/h200-vllm-0.26-lean-wheels.txt) leaves out, and numpy (the host's 2.5 works).
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
