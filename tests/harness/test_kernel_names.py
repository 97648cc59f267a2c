"""The kernel-name table: names as vLLM 0.26 / 0.32 run them on Hopper and on a CPU, each to its row."""

from __future__ import annotations

import pytest

from harness.kernel_names import (
    ATTENTION,
    BOOKKEEPING,
    COPIES,
    GATHER,
    GEMM,
    NORMS,
    OTHER,
    SAMPLING,
    category_of,
    is_elementwise,
)

NAMES = [
    # attention: Triton unified attention (0.32, 0.26's 2d/3d), its reduction, KV-cache writes, FA3, FlashInfer, CPU
    ("kernel_unified_attention", ATTENTION),
    ("kernel_unified_attention_3d", ATTENTION),
    ("reduce_segments", ATTENTION),
    ("reshape_and_cache_kernel_flash", ATTENTION),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)",
     ATTENTION),
    ("void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>>, 128>>(...)",
     ATTENTION),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<false, 256u>(...)", ATTENTION),
    ("_C::cpu_attention_with_kv_cache", ATTENTION),
    ("vllm::unified_attention_with_output", ATTENTION),
    # GEMMs: cuBLASLt on Hopper, CUTLASS, cuBLAS gemv and split-K, Inductor's template, oneDNN on a CPU
    ("nvjet_tst_128x64_64x8_2x1_v_bz_coopB_TNT", GEMM),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", GEMM),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int>>>(...)", GEMM),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false>(...)", GEMM),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(...)", GEMM),
    ("triton_tem_fused_mm_0", GEMM),
    ("_C::onednn_mm", GEMM),
    ("aten::mm", GEMM),
    # sampling: greedy argmax, softmax / log-softmax, top-k, FlashInfer and the V2 runner's Triton sampler
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
     "unsigned int, long, 4> >(...)", SAMPLING),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)", SAMPLING),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)", SAMPLING),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)2>(...)", SAMPLING),
    ("_gumbel_sample_kernel", SAMPLING),
    ("_topk_log_softmax_kernel", SAMPLING),
    ("_C::greedy_argmax", SAMPLING),
    ("aten::topk", SAMPLING),
    # norms: vLLM's CUDA ops, Inductor's fused RMSNorm (named after rsqrt), a CPU's decomposed RMSNorm
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)", NORMS),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3", NORMS),
    ("triton_per_fused_add_mean_mul_pow_rsqrt_7", NORMS),
    ("aten::mean", NORMS),
    # the PLE and token-embedding gathers; rotary embedding is not one
    ("triton_poi_fused_embedding_logical_and_lt_mul_where_0", GATHER),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, "
     "-2, true>(...)", GATHER),
    ("aten::index_select", GATHER),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(...)", OTHER),
    ("_C::rotary_embedding", OTHER),
    # what a step prepares, copies, and the rest
    ("_prepare_decode_inputs_kernel", BOOKKEEPING),
    ("_compute_slot_mappings_kernel", BOOKKEEPING),
    ("Memcpy HtoD (Pinned -> Device)", COPIES),
    ("Memset (Device)", COPIES),
    ("triton_poi_fused_gelu_mul_tanh_2", OTHER),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::gelu_tanh_kernel<c10::BFloat16>, true>(...)", OTHER),
]


@pytest.mark.parametrize(("name", "category"), NAMES)
def test_a_kernel_or_op_name_lands_in_its_row(name: str, category: str) -> None:
    assert category_of(name) == category


def test_the_softcaps_divide_tanh_and_multiply_are_elementwise_and_a_gemm_is_not() -> None:
    for name in ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
                 "at::native::binary_internal::DivFunctor<float> > >(...)",
                 "void at::native::vectorized_elementwise_kernel<4, at::native::tanh_kernel_cuda(...)>(...)",
                 "triton_poi_fused_div_mul_tanh_0", "aten::tanh", "aten::mul"):
        assert is_elementwise(name), name
    assert not is_elementwise("nvjet_tst_128x64_64x8_2x1_v_bz_coopB_TNT")
    assert not is_elementwise("_C::greedy_argmax")
