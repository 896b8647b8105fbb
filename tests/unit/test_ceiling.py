"""The matmul ceiling: the FLOP count, the ratio's direction, and what is measured on a CPU."""

import pytest
import torch

from amp_tutorial.ceiling import Ceiling, MatmulRate, ceiling_dtypes, matmul_ceiling, matmul_flops
from amp_tutorial.device import select_device
from amp_tutorial.measure import Timing


def test_flops_of_a_square_matmul_are_2n_cubed():
    assert matmul_flops(1) == 2  # one multiply and one add
    assert matmul_flops(1024) == 2 * 1024**3
    n = 3  # counted by hand: n² outputs, each n multiplies and n adds (one into a zero)
    assert matmul_flops(n) == n * n * (n + n)


def test_gflops_come_from_the_median_and_the_spread_from_the_quartiles():
    rate = MatmulRate(1000, "fp32", Timing((0.01, 0.02, 0.04)))
    assert rate.gflops == pytest.approx(2e9 / 0.02 / 1e9)  # 100 GFLOP/s at the median call
    slow, fast = rate.gflops_range
    assert slow == pytest.approx(2 / 0.03) and fast == pytest.approx(2 / 0.015)
    assert slow < rate.gflops < fast


def test_ratio_is_fp32_time_over_low_time_so_faster_bf16_is_above_one():
    fp32 = MatmulRate(512, "fp32", Timing((0.010,)))
    bf16 = MatmulRate(512, "bf16", Timing((0.004,)))
    ceiling = Ceiling((fp32, bf16, MatmulRate(1024, "fp32", Timing((0.08,))),
                       MatmulRate(1024, "bf16", Timing((0.05,)))))
    assert ceiling.ratio(512, "bf16") == pytest.approx(2.5)  # not 0.4: t_fp32 / t_bf16
    assert ceiling.ratio(512, "bf16") == pytest.approx(bf16.gflops / fp32.gflops)
    assert ceiling.best_ratio("bf16") == pytest.approx(2.5)  # the larger of 2.5 and 1.6
    assert ceiling.as_dict()["ratios"] == {"bf16": {"512": pytest.approx(2.5),
                                                    "1024": pytest.approx(1.6)}}
    assert ceiling.lines()[0].startswith("matmul 512x512: fp32 ")
    assert "2.50x fp32" in ceiling.lines()[0]


def test_cpu_measures_bf16_and_fp16_only_where_onednn_has_fp16_kernels():
    info = select_device("cpu")
    dtypes, notes = ceiling_dtypes(info)
    assert dtypes[0] == torch.bfloat16
    fp16_kernels = torch.ops.mkldnn._is_mkldnn_fp16_supported()
    assert (torch.float16 in dtypes) == fp16_kernels
    assert bool(notes) == (not fp16_kernels)


def test_a_live_measurement_has_every_size_and_dtype():
    info = select_device("cpu")
    ceiling = matmul_ceiling(info, (32, 64), steps=3, warmup=1)
    assert ceiling.sizes == [32, 64]
    assert ceiling.low_dtypes[0] == "bf16"
    assert all(len(r.timing.samples) == 3 and r.gflops > 0 for r in ceiling.rates)
