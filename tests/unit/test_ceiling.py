"""The matmul ceiling: the FLOP count, the ratio's direction, what is measured on a CPU, the
TF32 flags it reads (as each model's fp32 baseline runs), and when a ratio is no ceiling."""

import pytest
import torch

import amp_tutorial.ceiling as ceiling_module
from amp_tutorial.ceiling import (
    FP32_LIKE,
    Ceiling,
    MatmulRate,
    ceiling_dtypes,
    cuda_matmul_tf32,
    matmul_ceiling,
    matmul_flops,
)
from amp_tutorial.device import (
    dtype_name,
    has_fp32_precision_api,
    select_device,
    set_strict_fp32,
    tf32_in_use,
    tf32_state,
)
from amp_tutorial.measure import NOISY_SPREAD, Timing
from tests.unit.test_device import pretend_ampere, tf32_settings_kept


@pytest.fixture
def tf32_settings():
    with tf32_settings_kept():
        yield


@pytest.fixture
def fake_ampere(monkeypatch):
    return pretend_ampere(monkeypatch)


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


@pytest.mark.skipif(not has_fp32_precision_api(), reason="torch < 2.9 has only allow_tf32")
def test_strict_fp32_leaves_the_legacy_flags_readable(tf32_settings):
    # the ceiling reads the flags with the new API; after set_strict_fp32 the legacy ones answer
    # too (issue 33 read cudnn.allow_tf32 after only the new API was set, and it raised)
    set_strict_fp32(True)
    assert torch.backends.cudnn.allow_tf32 is False
    assert tf32_state(rnns=True) == {"convolutions": False, "matmuls": False, "rnns": False}


def test_a_strict_fp32_ceiling_measures_without_raising(tf32_settings):
    # the branch `bench --strict-fp32` takes (issue 33: it raised on every CUDA GPU); the flags
    # are process-wide and need no GPU, so the CPU runs the same reads
    set_strict_fp32(True)
    for model, fp32_like in FP32_LIKE.items():
        ceiling = matmul_ceiling(select_device("cpu"), (32,), fp32_like, steps=3, warmup=1)
        assert ceiling.sizes == [32], model
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"  # strict is left as it was set


def test_the_fp32_row_runs_tf32_as_each_model_s_baseline_does(tf32_settings, fake_ampere):
    set_strict_fp32(False)  # PyTorch's defaults: TF32 convolutions, IEEE fp32 matmuls
    before = torch.backends.cuda.matmul.fp32_precision
    allow = {model: fp32_like in tf32_in_use(fake_ampere)
             for model, fp32_like in FP32_LIKE.items()}
    assert allow == {"conv": True, "transformer": False}
    with cuda_matmul_tf32(allow["conv"]):
        assert tf32_state()["matmuls"] is True  # the ConvModel's fp32 matmul row: TF32
    assert torch.backends.cuda.matmul.fp32_precision == before  # put back exactly ("none")
    with cuda_matmul_tf32(allow["transformer"]):
        assert tf32_state()["matmuls"] is False
    set_strict_fp32(True)
    assert not any(tf32_state()[like] for like in FP32_LIKE.values())  # strict: no TF32 anywhere


def _timed_rows(monkeypatch, info, fp32_like):
    """matmul_ceiling on ``info`` with the timing replaced: which rows it asks for with TF32, and
    the notes it prints (a fake CUDA device runs nothing)."""
    asked = []

    def fake_rate(n, dtype, device, tf32=False, **options):
        asked.append((dtype_name(dtype), tf32))
        return MatmulRate(n, dtype_name(dtype), Timing((1e-3,)))

    monkeypatch.setattr(ceiling_module, "matmul_rate", fake_rate)
    ceiling = matmul_ceiling(info, (64,), fp32_like)
    return dict(asked), ceiling.notes


def test_the_fp32_row_uses_tf32_only_where_the_baseline_does(tf32_settings, fake_ampere,
                                                              monkeypatch):
    """Issue 46: on ROCm the ConvModel's fp32 row was timed with TF32 and labelled so, though
    ``tf32_in_use`` says ROCm never uses it; so too on an NVIDIA GPU older than Ampere."""
    asked, notes = _timed_rows(monkeypatch, fake_ampere, "convolutions")
    assert asked["fp32"] is True and any("TF32" in note for note in notes)
    asked, notes = _timed_rows(monkeypatch, fake_ampere, "matmuls")
    assert asked["fp32"] is False and not any("TF32" in note for note in notes)
    monkeypatch.setattr(torch.version, "hip", "7.1.25424")  # ROCm: the same flags, no TF32
    assert tf32_state()["convolutions"] is True
    asked, notes = _timed_rows(monkeypatch, fake_ampere, "convolutions")
    assert asked == {"fp32": False, "fp16": False, "bf16": False}
    assert not any("TF32" in note for note in notes)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    asked, notes = _timed_rows(monkeypatch, fake_ampere, "convolutions")  # a V100
    assert asked["fp32"] is False and not any("TF32" in note for note in notes)


def _ceiling(times: dict[tuple[int, str], tuple[float, ...]], emulated=()) -> Ceiling:
    return Ceiling(tuple(MatmulRate(n, d, Timing(t)) for (n, d), t in times.items()),
                   emulated=emulated)


QUIET = {(256, "fp32"): (0.010, 0.010, 0.011), (256, "bf16"): (0.005, 0.005, 0.005),
         (512, "fp32"): (0.080, 0.081, 0.080), (512, "bf16"): (0.050, 0.050, 0.051)}


def test_an_emulated_dtype_s_ratio_is_not_called_a_ceiling():
    # lesson 03 on a Zen 3 printed "training 0.22x, of a 0.07x matmul ceiling (317%)"
    quiet = _ceiling(QUIET)
    assert quiet.ceiling("bf16") == pytest.approx(2.0)
    assert quiet.describe("bf16", 1.8) == "of a 2.00x matmul ceiling (90%)"
    emulated = _ceiling(QUIET, emulated=("bf16",))
    assert emulated.ceiling("bf16") is None
    words = emulated.describe("bf16", 0.22)
    assert words.startswith("no matmul ceiling (bf16 matmul 2.00x fp32 here")
    assert "emulated" in words
    assert emulated.as_dict()["ceilings"] == {"bf16": None}
    # lesson 03 beside busy programs said "bf16 matmul 0.55x fp32 here" from a NOISY fp32 rate
    noisy = dict(QUIET)
    noisy[(512, "fp32")] = noisy[(256, "fp32")] = (0.012, 0.200, 0.400)
    words = _ceiling(noisy, emulated=("bf16",)).describe("bf16", 0.13)
    assert "x fp32" not in words and "emulated" in words


def test_a_rate_whose_spread_is_a_large_share_of_its_median_is_noise():
    noisy = dict(QUIET)
    noisy[(512, "fp32")] = (0.012, 0.200, 0.400)  # a busy machine: quartiles far apart
    ceiling = _ceiling(noisy)
    assert ceiling.rate(512, "fp32").noisy and not ceiling.rate(256, "fp32").noisy
    assert ceiling.rate(512, "fp32").spread > NOISY_SPREAD
    assert ceiling.quiet_sizes("bf16") == [256]
    assert ceiling.ceiling("bf16") == pytest.approx(2.0)  # from the quiet size only
    assert ceiling.best_ratio("bf16") == pytest.approx(4.0)  # the noisy size's, not used
    assert "NOISY" in ceiling.lines()[1] and "NOISY" not in ceiling.lines()[0]
    # lesson 03 printed "fp32 0.702 (... NOISY ...); bf16 0.375 (...), 0.53x fp32": no ratio
    # from a rate the same line leaves out, and every rate with its unit
    assert "x fp32" not in ceiling.lines()[1] and "2.00x fp32" in ceiling.lines()[0]
    assert ceiling.lines()[1].count("GFLOP/s") == 2
    noisy[(256, "bf16")] = (0.001, 0.005, 0.050)
    ceiling = _ceiling(noisy)
    assert ceiling.ceiling("bf16") is None
    assert "noise" in ceiling.describe("bf16")


def test_a_noisy_fp16_rate_leaves_bf16_s_ceiling_alone():
    # a Xeon with avx512_fp16 times fp16 too; its noise at one size is not bf16's (the CI run of
    # stop 52 read every dtype's noise as bf16's and found no quiet size for a stated ceiling)
    times = dict(QUIET)
    times[(256, "fp16")] = (0.001, 0.010, 0.050)
    times[(512, "fp16")] = (0.040, 0.040, 0.041)
    ceiling = _ceiling(times)
    assert ceiling.rate(256, "fp16").noisy
    assert ceiling.quiet_sizes("bf16") == [256, 512]
    assert ceiling.quiet_sizes("fp16") == [512]
    assert ceiling.ceiling("bf16") == pytest.approx(2.0)
    assert ceiling.ceiling("fp16") == pytest.approx(2.0)


def test_bf16_is_marked_emulated_exactly_where_the_cpu_lacks_it():
    info = select_device("cpu")
    ceiling = matmul_ceiling(info, (32,), steps=3, warmup=1)
    assert ("bf16" in ceiling.emulated) == (info.native_bf16 is False)


def test_fp16_is_marked_emulated_on_a_cpu_without_onednn_fp16(monkeypatch):
    # AMP_TUTORIAL_DTYPE=float16 on a Zen 3: the fp16 matmul runs ATen's reference gemm, and a
    # step read against it came out at 68-285% "of matmul" (lesson 17, issue 45)
    import dataclasses

    import amp_tutorial.ceiling as ceiling_module
    from amp_tutorial.ceiling import matmul_ceiling
    from amp_tutorial.device import select_device

    info = dataclasses.replace(select_device("cpu"), amp_dtypes=(torch.float16,))
    for kernels in (False, True):
        monkeypatch.setattr(ceiling_module, "cpu_fp16_kernels", lambda k=kernels: k)
        ceiling = matmul_ceiling(info, (64,), steps=3, budget_s=0.2)
        assert ("fp16" in ceiling.emulated) == (not kernels)
