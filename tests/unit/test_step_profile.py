"""Where a step's time goes (amp_tutorial.step_profile)."""

from __future__ import annotations

import pytest
import torch

from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import ReversalTask
from amp_tutorial.step_profile import (
    GROUPS,
    _union_us,
    cpu_op_group,
    kernel_group,
    profile_steps,
    time_shares,
)
from amp_tutorial.steps import make_sequence_train_step
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig


@pytest.mark.parametrize(("name", "group"), [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "matmul"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>>", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     "optimizer"),
    ("void at::native::amp_update_scale_cuda_kernel(float*, int*, float*)", "optimizer"),
    ("triton_poi_fused__to_copy_add_convert_element_type_0", "memory-bound"),
    ("triton_red_fused_native_layer_norm_native_layer_norm_backward_1", "memory-bound"),
    ("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "memory-bound"),
])
def test_device_kernels_are_grouped_by_name(name, group):
    assert kernel_group(name) == group


def test_cpu_ops_are_grouped_by_name_and_by_the_range_above_them():
    assert cpu_op_group("aten::addmm", ["aten::linear", "amp_tutorial.step"]) == "matmul"
    assert cpu_op_group("aten::bmm", ["aten::_scaled_dot_product_attention_math"]) == "attention"
    assert cpu_op_group("aten::mul_", ["Optimizer.step#AdamW.step"]) == "optimizer"
    assert cpu_op_group("aten::_amp_foreach_non_finite_check_and_unscale_", []) == "optimizer"
    assert cpu_op_group("aten::native_layer_norm", ["aten::layer_norm"]) == "memory-bound"


def test_overlapping_intervals_are_counted_once():
    assert _union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20


@pytest.mark.parametrize("amp_dtype", [None, torch.bfloat16])
def test_a_real_cpu_step_splits_into_groups_that_fill_the_step(amp_dtype):
    t = get_preset("smoke").transformer
    torch.manual_seed(0)
    model = DecoderTransformer(TransformerConfig(t.n_symbols + 1, t.seq_len, t.d_model,
                                                 t.n_layers, t.n_heads))
    batches = ReversalTask(t.n_symbols, t.seq_len).batches(2, t.batch, 0, "cpu")
    step = make_sequence_train_step(model, torch.optim.AdamW(model.parameters()), batches,
                                    amp_dtype)
    shares = time_shares(profile_steps(step, "cpu", steps=2))
    assert shares.source == "CPU ops" and shares.step_s > 0
    assert set(shares.shares) == set(GROUPS)
    for group in ("matmul", "attention", "memory-bound", "optimizer"):
        assert shares.seconds[group] > 0, group
    # self times and the range's own time add up to the range: every microsecond in one group
    assert sum(shares.shares.values()) == pytest.approx(1.0, abs=0.02)


def test_a_profile_without_the_step_range_is_refused():
    from torch.profiler import profile

    with profile() as prof:
        torch.ones(2) + 1
    with pytest.raises(ValueError, match="profile_steps"):
        time_shares(prof)
