"""Reading the SDPA kernel off the profiler, and forcing backends, on this CPU."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from amp_tutorial.attention import (
    attention_cost,
    attention_ops,
    backend_runs,
    fused_for_training,
)

Q = torch.randn(1, 2, 8, 4)


def test_profiler_names_the_kernel_that_ran():
    default = attention_ops(lambda: F.scaled_dot_product_attention(Q, Q, Q, is_causal=True))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in default

    def math():
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(Q, Q, Q, is_causal=True)

    forced = attention_ops(math)
    assert "aten::_scaled_dot_product_attention_math" in forced
    assert not any("flash" in op for op in forced)


def test_backend_runs_is_false_for_a_cuda_only_backend_on_cpu():
    assert backend_runs(SDPBackend.MATH, Q, Q, Q)
    assert backend_runs(SDPBackend.FLASH_ATTENTION, Q, Q, Q)
    assert not backend_runs(SDPBackend.EFFICIENT_ATTENTION, Q, Q, Q)


def test_attention_cost_math_keeps_the_score_matrix():
    shape = (1, 2, 64, 8)  # seq 64 > 2 x head_dim 8: the score matrix outweighs q, k, v, out
    fused = attention_cost(None, shape, torch.float32, "cpu", steps=2)
    slow = attention_cost(SDPBackend.MATH, shape, torch.float32, "cpu", steps=2)
    score_bytes = 1 * 2 * 64 * 64 * 4
    assert slow["saved for backward (MB)"] * 2**20 >= score_bytes
    assert slow["saved for backward (MB)"] > fused["saved for backward (MB)"] > 0
    assert fused["time fwd+bwd median (ms)"] > 0 and math.isnan(fused["peak (MB)"])  # CPU: no peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_for_training_tells_the_math_fallback_apart(dtype):
    shape = (2, 2, 16, 8)
    assert fused_for_training(shape, dtype, "cpu")  # the CPU's flash kernel trains
    with sdpa_kernel(SDPBackend.MATH):  # the fallback a device without fused kernels takes
        assert not fused_for_training(shape, dtype, "cpu")
