import os
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from amp_tutorial.op_profile import (
    compiled_op_count,
    cpu_has_amx_int8,
    cpu_scaled_mm_uses_onednn,
    events_with_dtypes,
    fp8_matmul_problem,
    op_counts,
    self_times_per_step,
)


def test_counts_each_op_by_name() -> None:
    a, b = torch.randn(8, 4), torch.randn(4, 3)
    counts = op_counts(lambda: (a @ b, a @ b, torch.relu(a)))
    assert counts["aten::mm"] == 2
    assert counts["aten::relu"] == 1
    assert "aten::_scaled_mm" not in counts


def _scaled_mm_counts() -> dict[str, int]:
    # e4m3fn inputs, per-tensor scales, the second operand column-major: a CPU _scaled_mm
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    return op_counts(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))


# leaving torch.backends.mkldnn.flags() restores oneDNN's TF32 switch as well, and torch 2.14
# warns for that where it has no Intel GPU support: noise in the suite's summary, not a finding
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN:UserWarning")
def test_the_fp8_matmul_dequantizes_to_mm_without_onednn() -> None:
    # _scaled_mm_out_cpu's fallback, on every CPU: fp32 copies (mul), then matmul -> mm
    with torch.backends.mkldnn.flags(enabled=False):
        assert not cpu_scaled_mm_uses_onednn()
        counts = _scaled_mm_counts()
    assert counts["aten::_scaled_mm"] == 1
    assert counts["aten::mm"] == 1 and counts["aten::mul"] == 2


def test_the_fp8_matmul_takes_onednn_exactly_on_an_amx_int8_cpu() -> None:
    # Zen 3/Zen 4 (no AMX): aten::mm under _scaled_mm; a Xeon with AMX-INT8: oneDNN's FP8 kernel
    if fp8_matmul_problem():  # oneDNN capped below AMX: the next test's case
        pytest.skip(fp8_matmul_problem())
    counts = _scaled_mm_counts()
    assert counts["aten::_scaled_mm"] == 1
    assert cpu_scaled_mm_uses_onednn() == (torch.backends.mkldnn.enabled and cpu_has_amx_int8())
    assert ("aten::mm" not in counts) == cpu_scaled_mm_uses_onednn(), counts


def test_a_capped_onednn_fails_the_amx_fp8_matmul_and_the_problem_says_so(monkeypatch) -> None:
    """On a Xeon with AMX-INT8, torch picks oneDNN's FP8 kernel from the CPU's flags even where
    ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below AMX (the suite's AVX2 emulation, an instructor's
    rehearsal of an older laptop); the kernel then cannot be built. Lesson 16 ran its probe before
    anything had initialised cpuinfo (the mm fallback: it passed) and trained after (oneDNN:
    it failed). ``fp8_matmul_problem`` asks in the order training will."""
    if not cpu_scaled_mm_uses_onednn():
        assert fp8_matmul_problem() is None  # the mm fallback runs everywhere from torch 2.9
        counts = _scaled_mm_counts()
        assert counts["aten::mm"] == 1
        return
    problem = fp8_matmul_problem()
    capped = any(os.environ.get(n) for n in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"))
    if capped:  # as the AVX2 emulation runs this file on an AMX machine
        assert problem and "ONEDNN_MAX_CPU_ISA" in problem and "unset the cap" in problem
        with pytest.raises(RuntimeError, match="primitive descriptor"):
            _scaled_mm_counts()
    else:
        assert problem is None


def test_amx_int8_agrees_with_the_kernels_cpu_flags() -> None:
    # the fallback for torch < 2.14 reads Linux's flags; 2.14 asks cpuinfo: the two agree
    flags = Path("/proc/cpuinfo").read_text().split()
    assert cpu_has_amx_int8() == ("amx_int8" in flags)


def test_events_carry_input_dtypes_as_torch_records_them() -> None:
    a = torch.randn(8, 8)
    with torch.profiler.profile(record_shapes=True) as prof:
        torch.mm(a.bfloat16(), a.bfloat16())
        torch.mm(a, a)
    events = events_with_dtypes(prof)
    mm = [e.input_dtypes for e in events if e.name == "aten::mm"]
    assert mm == [["c10::BFloat16", "c10::BFloat16"], ["float", "float"]]


def test_the_dtypes_filled_in_are_the_ones_torch_itself_gives() -> None:
    # on a torch whose events have input_dtypes (2.14), hide them and fill them in from the record
    a = torch.randn(8, 8)
    with torch.profiler.profile(record_shapes=True) as prof:
        torch.nn.functional.linear(a.half(), a.half())
    own = [getattr(e, "input_dtypes", None) for e in prof.events()]
    if all(d is None for d in own):
        pytest.skip(f"torch {torch.__version__} records no FunctionEvent.input_dtypes to compare")
    for event in prof.events():
        event.input_dtypes = None
    assert [e.input_dtypes for e in events_with_dtypes(prof)] == [d or [] for d in own]


def test_on_cpu_linear_computes_through_addmm() -> None:
    # the other branch, run for real: no own kernel, so the profiler shows linear -> addmm
    layer = torch.nn.Linear(8, 4)
    counts = op_counts(lambda: layer(torch.randn(2, 8)))
    assert counts["aten::linear"] == 1 and counts["aten::addmm"] == 1


def test_compiled_op_count_sees_forward_and_backward_graphs_every_compile() -> None:
    # a @ b with both requiring grad: one mm in the forward graph, two in the backward one
    a = torch.randn(8, 8, requires_grad=True)
    b = torch.randn(8, 8, requires_grad=True)
    for _ in range(2):  # the second compile of the same graph is counted again, not cached
        torch._dynamo.reset()
        with compiled_op_count("aten::mm", "aten::_scaled_mm") as counts:
            torch.compile(lambda x, y: x @ y)(a, b).sum().backward()
        assert counts == {"aten::mm": 3, "aten::_scaled_mm": 0}


def test_self_times_are_per_step_and_split_cpu_ops_from_device_kernels() -> None:
    a = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            a @ a
    ops, kernels = self_times_per_step(prof, steps=4)
    calls, ms = ops["aten::mm"]
    assert calls == 1.0 and ms > 0  # four calls over four steps
    assert kernels == {}  # only the CPU was profiled
