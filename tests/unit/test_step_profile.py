"""Where a step's time goes (amp_tutorial.step_profile)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import DeviceType

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


class _Range:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def elapsed_us(self) -> float:
        return self.end - self.start


class _Event:
    def __init__(self, name, start, end, device_type=DeviceType.CUDA, annotation=False):
        self.name, self.time_range, self.device_type = name, _Range(start, end), device_type
        self.is_user_annotation, self.cpu_parent, self.self_cpu_time_total = annotation, None, 0


class _Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_on_a_gpu_idle_is_the_step_no_kernel_covers_and_annotations_are_no_kernels():
    # one 100 us step: a GEMM 0-30, an elementwise kernel 40-50, the fused Adam 60-70; the step's
    # range also shows on the GPU timeline as a user annotation spanning it (the H200 run counted
    # it as a memory-bound kernel: shares above 100%)
    events = [_Event("amp_tutorial.step", 0, 100, DeviceType.CPU),
              _Event("amp_tutorial.step", 0, 100, annotation=True),
              _Event("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", 0, 30),
              _Event("void at::native::vectorized_elementwise_kernel<4, AddFunctor>", 40, 50),
              _Event("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 60, 70)]
    shares = time_shares(_Profile(events))
    assert shares.source == "device kernels"
    assert shares.shares == pytest.approx({"matmul": 0.3, "attention": 0.0, "memory-bound": 0.1,
                                           "optimizer": 0.1, "idle": 0.5})
