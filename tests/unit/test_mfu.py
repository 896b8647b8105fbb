"""Model FLOPs, datasheet peaks and MFU (amp_tutorial.mfu)."""

from __future__ import annotations

import pytest
import torch

from amp_tutorial.mfu import (
    WEIGHT_MATMULS,
    Utilization,
    compute_dtype,
    op_flops,
    peak_for,
    step_flops,
)
from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import sequence_loss
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig


def test_a_linear_layer_counts_forward_and_the_weight_gradient_only():
    # input without grad: forward x @ W.T (2nab) and backward's weight gradient (2nab), no
    # input gradient; the bias add is not a matmul and is not counted
    flops = step_flops(lambda: (torch.nn.Linear(8, 4), (torch.zeros(16, 8),)),
                       lambda m, x: m(x).sum())
    assert flops == 2 * (2 * 16 * 8 * 4)


def transformer_flops_by_hand(d: int, layers: int, vocab: int, batch: int, seq: int) -> int:
    """6 FLOPs per weight per token for every matmul weight (12 d² a block, d x vocab in the
    head: forward 2, backward 4), and per block the two attention matmuls, each 2·batch·seq²·d
    forward and twice that backward, counted without the causal mask's saving."""
    tokens = batch * seq
    return 6 * tokens * (12 * d * d * layers + d * vocab) + 12 * batch * seq * seq * d * layers


@pytest.mark.parametrize("preset", ["paper", "small", "smoke"])
def test_the_transformer_step_counts_as_its_formula(preset):
    t = get_preset(preset).transformer
    config = TransformerConfig(t.n_symbols + 1, t.seq_len, t.d_model, t.n_layers, t.n_heads)
    counted = step_flops(lambda: (DecoderTransformer(config), (
        torch.zeros(t.batch, t.seq_len, dtype=torch.long),) * 2),
        lambda m, x, y: sequence_loss(m(x), y))
    assert counted == transformer_flops_by_hand(t.d_model, t.n_layers, t.n_symbols + 1, t.batch,
                                                t.seq_len)
    if preset == "paper":
        assert round(counted / 1e12, 2) == 2.17  # issue 45's figure
    per_op = op_flops(lambda: (DecoderTransformer(config), (
        torch.zeros(t.batch, t.seq_len, dtype=torch.long),) * 2),
        lambda m, x, y: sequence_loss(m(x), y))
    assert sum(per_op.values()) == counted
    weights = sum(per_op[op] for op in WEIGHT_MATMULS)
    # the weights' matmuls alone: the formula without its attention term
    assert weights == transformer_flops_by_hand(t.d_model, t.n_layers, t.n_symbols + 1, t.batch,
                                                t.seq_len) - 12 * t.batch * t.seq_len ** 2 * (
                                                    t.d_model * t.n_layers)


def test_the_count_allocates_nothing_on_the_device():
    before = torch.zeros(1).untyped_storage().nbytes()  # a CPU tensor works as before
    step_flops(lambda: (torch.nn.Linear(4096, 4096), (torch.zeros(4096, 4096),)),
               lambda m, x: m(x).sum())  # 64 MiB per tensor if it were real
    assert before == 4


@pytest.mark.parametrize(("name", "peak_name", "bf16"), [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 989.5),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", "NVIDIA H200 SXM", 989.5),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100", 312.0),
    ("AMD Instinct MI300X", "AMD Instinct MI300X", 1307.4),
])
def test_each_named_gpu_gets_its_own_datasheet_peak(name, peak_name, bf16):
    peak = peak_for(name, "cuda")
    assert peak is not None and peak.name == peak_name and peak.tflops["bf16"] == bf16
    assert peak.tflops["fp32"] < peak.tflops["tf32"] < peak.tflops["bf16"] == peak.tflops["fp16"]


def test_no_peak_for_a_cpu_or_an_unlisted_gpu():
    assert peak_for("AMD EPYC", "cpu") is None
    assert peak_for("Tesla T4", "cuda") is None
    # a Grace Hopper superchip is no H200 or H100 board (its own power limit): no borrowed peak
    assert peak_for("NVIDIA GH200 480GB", "cuda") is None
    assert peak_for("NVIDIA GH200 144G HBM3e", "cuda") is None


def test_an_fp32_step_is_read_against_tf32_only_where_tf32_is_used():
    assert compute_dtype(None, tf32=False) == "fp32"
    assert compute_dtype(None, tf32=True) == "tf32"
    assert compute_dtype("bf16", tf32=True) == "bf16"


def test_mfu_and_the_share_of_the_matmul_rate():
    u = Utilization(flops=2_000_000_000_000, seconds=0.01, peak_tflops=1000.0,
                    matmul_tflops=400.0)
    assert u.tflops == pytest.approx(200.0)
    assert u.mfu == pytest.approx(0.2) and u.of_matmul == pytest.approx(0.5)
    assert Utilization(1, 1.0, None, None).mfu is None
