"""Which part of a decode step a GPU kernel or a CPU op belongs to, from its name alone.

The table is written for what vLLM 0.26 and 0.32 run for Gemma 4 on Hopper (the TRITON_ATTN backend's
`kernel_unified_attention[_2d|_3d]` and `reduce_segments`, FlashAttention / FlashInfer where another backend is
asked for, cuBLASLt's `nvjet_*` and `sm90_xmma_gemm_*` GEMMs, CUTLASS, Inductor's `triton_{poi,red,per}_fused_*`
kernels named after the aten ops they fuse, vLLM's V1 and V2 sampler kernels) and for vLLM CPU's op names
(`_C::onednn_mm`, `_C::cpu_attention_with_kv_cache`, `aten::*`). Rules are tried in order; the first match wins,
so the specific ones (attention, sampling, norms, gathers) come before the broad ones (anything called gemm).

Two rows need more than a name and are settled per step in harness/step_profile.py: lm_head + softcap (the step's
GEMM whose N is the vocabulary, and the divide / tanh / multiply after it) and the sliding / full split of
attention (two launch signatures of one attention kernel whose counts match the model's layer types).
"""

from __future__ import annotations

import re

__all__ = ["ATTENTION", "GEMM", "LM_HEAD", "SAMPLING", "GATHER", "NORMS", "BOOKKEEPING", "COPIES", "OTHER",
           "CATEGORIES", "RULES", "category_of", "is_elementwise"]

ATTENTION = "attention"
GEMM = "GEMM"
LM_HEAD = "lm_head + softcap"
SAMPLING = "sampling"
GATHER = "PLE + embedding gather"
NORMS = "norms"
BOOKKEEPING = "step inputs / bookkeeping"
COPIES = "memcpy / memset"
OTHER = "elementwise / other"
CATEGORIES = (ATTENTION, GEMM, LM_HEAD, SAMPLING, GATHER, NORMS, BOOKKEEPING, COPIES, OTHER)

# (category, pattern searched in the kernel or op name, case-insensitive), first match wins.
RULES: tuple[tuple[str, str], ...] = (
    (COPIES, r"^memcpy|^memset|^aten::copy_$|^aten::fill_$|^aten::zero_$"),
    # attention: Triton unified attention (0.26: _2d/_3d; 0.32: one kernel) and its segment reduction, the KV-cache
    # writes, FlashAttention 2/3, FlashInfer, vLLM's paged attention, and the CPU backend's ops
    (ATTENTION, r"unified_attention|reduce_segments|reshape_and_cache|flash_?attn|flash_fwd|flashattn|fmha"
                r"|BatchPrefillWith|BatchDecodeWith|MergeStates|paged_attention|cpu_attention|cpu_attn"
                r"|kv_cache_update|_attention_with_output|scaled_dot_product|_fwd_kernel|decode_attention"),
    # sampling: vLLM V1 (PyTorch ops, FlashInfer) and V2 (Triton) samplers, greedy argmax, logprobs, top-k/top-p
    (SAMPLING, r"argmax|ArgMax|topk|top_k|TopK|gatherTopK|radixSort|RadixSort|bitonicSort|sbtopk|softmax|SoftMax"
               r"|sampl|gumbel|philox|exponential|multinomial|_temperature_kernel|_min_p_kernel|_penalties_kernel"
               r"|_bincount_kernel|_ranks_kernel|logprob|DeviceScan|cumsum|aten::sort$"),
    (NORMS, r"rms_?norm|layer_?norm|rsqrt|group_?norm|aten::pow$|aten::mean$"),
    (OTHER, r"rotary"),                  # rotary_embedding is not a gather
    (GATHER, r"embedding|index_?select|indexSelect"),
    # the inputs a step prepares on the device (V1 and V2 model runners)
    (BOOKKEEPING, r"_prepare_\w*_kernel|slot_mapping|block_table|_post_update|combine_sampled|_expand_idx"
                  r"|compute_slot|get_scheduler_metadata"),
    (GEMM, r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|onednn_mm|onednn_scaled_mm|^aten::mm$"
           r"|^aten::addmm$|^aten::bmm$|^aten::baddbmm$|triton_tem_fused_mm|_mm_kernel|matmul_kernel"),
)
_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern in RULES)
_ELEMENTWISE = re.compile(r"elementwise|Functor|triton_poi_|aten::(mul|div|tanh|add)_?$|tanh|_kernel_cuda",
                          re.IGNORECASE)


def category_of(name: str) -> str:
    """The row a kernel or op name belongs to (`OTHER` when no rule matches)."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return OTHER


def is_elementwise(name: str) -> bool:
    """A pointwise kernel or op (the softcap's divide, tanh and multiply are three of them, or one fused)."""
    return category_of(name) == OTHER and bool(_ELEMENTWISE.search(name))
