#!/usr/bin/env bash
# Build the bundle an offline GPU host needs (CUDA 13, torch 2.11+cu130, Python 3.12, no package index: the host
# image whose packages are experiments/results/h200-host-packages.txt), on a machine with PyPI and Debian's apt:
#   1. a small venv of ratchet's own requirements (.whl/venv; `pip install -c constraints.txt -e .`, ~45 s once)
#   2. the .deb files of the system tools the host lacks (scripts/gpu-fetch-debs.sh: git, bubblewrap, ip, iptables)
#   3. `ratchet bundle build`: vLLM 0.26.0 and ratchet's requirements resolved against the host's packages, at the
#      versions of scripts/gpu-bundle-pins.txt, trimmed (below), each wheel stored then xz-compressed, cut into
#      parts of CHUNK_MB MiB (42: a transfer of at most 64 MiB that also carries the ~21 MiB checkout) in
#      .bundle/h200-vllm026 (or $1)
# Wheels are cached in .whl/cache (packed copies in .whl/cache/packed): a rebuild downloads and compresses only
# what changed. Each step prints its seconds.
#
# Left out, since the E2B specs' serving path (TRITON_ATTN attention, dense Gemma 4, bf16, Hopper) runs without
# them: the CuteDSL/FA4, tilelang, tokenspeed, video and nvcc packages (measured on an H200), numpy (the host's 2.5
# works). Dropped from the vLLM wheel, each shown from vLLM 0.26.0's own source (paths in its wheel):
#   vllm_flash_attn/_vllm_fa2_C.abi3.so        Ampere's FlashAttention 2 (measured without it on an H200). FA3's
#                                              library stays: vllm_flash_attn/__init__.py:33 raises ImportError
#                                              when neither is there, and fa_utils.py:23 imports it on CUDA from
#                                              model_executor/layers/attention/__init__.py (mm_encoder_attention),
#                                              which gemma4.py:39 imports.
#   _moe_C_stable_libtorch.abi3.so             MoE kernels: platforms/cuda.py:227-228 imports it under
#                                              contextlib.suppress(ImportError); torch.ops._moe_C is called only from
#                                              layers/fused_moe/, lora/punica_*, _aiter_ops.py (ROCm) and the RDNA3
#                                              wna16 MoE method; E2B is dense (gemma4.py:638-663 builds no MoE block
#                                              when enable_moe_block is false).
#   vllm-rs                                    the Rust frontend: envs.py:557-565 resolves it only when
#                                              VLLM_USE_RUST_FRONTEND=1, which the harness's env allowlist never sets.
#   third_party/deep_gemm/*                    FP8 GEMMs: imported only through utils/deep_gemm.py:160-190 (importlib,
#                                              guarded); without it has_deep_gemm() is false and the kernel warm-up
#                                              (warmup/kernel_warmup.py:102-110) skips a step that has no FP8 layer
#                                              to warm on a bf16 model.
#   third_party/fmha_sm100/*                   Blackwell sparse attention for MiniMax M3, imported inside functions
#                                              (models/minimax_m3/nvidia/*.py) only.
#   _flashmla_C.abi3.so, _flashmla_extension_C.abi3.so   MLA only: v1/attention/ops/flashmla.py:13-30 imports them
#                                              under try/except ImportError.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
OUT=${1:-.bundle/h200-vllm026}
VENV=.whl/venv
STAMP="$VENV/.ratchet-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"

make_venv() {
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -c constraints.txt -e .
  touch "$STAMP"
}

build() {
  rm -rf "$OUT"
  "$VENV/bin/python" -m agent.cli bundle build --vllm 0.26.0 --python 3.12 --platform manylinux_2_39_x86_64 \
    --host-packages experiments/results/h200-host-packages.txt --pin scripts/gpu-bundle-pins.txt --cache .whl/cache \
    --extra transformers==5.5.3 tokenizers==0.22.2 structlog==26.1.0 gitpython==3.2.1 unidiff==1.0.1 \
            rfc8785==0.1.4 cuda-python==13.4.4 \
    --exclude torchcodec pynvvideocodec tilelang nvidia-cutlass-dsl quack-kernels tokenspeed-mla cuda-tile \
              nvidia-cuda-cccl nvidia-cuda-nvcc numpy \
    --drop 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' \
           'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*' 'vllm/_flashmla_C.abi3.so' \
           'vllm/_flashmla_extension_C.abi3.so' \
    --file .whl/deb/*.deb --pack xz --chunk-mb "${CHUNK_MB:-42}" --out "$OUT"
}

[ -f "$STAMP" ] || step "venv of ratchet's requirements ($VENV)" make_venv
step "system tools' .deb files (.whl/deb)" bash scripts/gpu-fetch-debs.sh .whl/deb
step "bundle ($OUT)" build
du -sh "$OUT"/part-*
