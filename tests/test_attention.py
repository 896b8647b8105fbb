"""Reading the SDPA kernel off the profiler, and forcing backends, on this CPU."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from amp_tutorial.attention import attention_ops, backend_runs

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
