# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 35
#     memory:
#       cpu: 2
#       paper: 5
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.6
#     needs: 'any device, CPU included (FP8 training runs everywhere with torchao, on
#       a CPU at smoke sizes); fast FP8 training: NVIDIA compute capability 8.9+, AMD
#       gfx942, gfx950 or RDNA4'
#     track: advanced
#   jupytext:
#     notebook_metadata_filter: amp_tutorial,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 16 · FP8 training: the formats, why they need a scale, and when it pays
#
# Lessons 01-15 computed in two 16-bit formats, float16 and bfloat16.
# FP8 goes one format further: half their bits, faster tensor cores on the GPUs that have them,
# and a scale per tensor to keep values in range, much as the GradScaler of lesson 02 did for
# fp16. This lesson measures the formats on any device and trains lesson 12's decoder-only
# transformer in FP8 with torchao on every device, the CPU included; only hardware with FP8
# matrix cores makes it fast, and there lesson 14's `torch.compile` is part of the recipe. Sizes
# come from the preset; seeds are fixed. Lesson 17 shows how to see which ops really ran in low
# precision; this lesson already counts one, the FP8 matmul.

# %%
import math

import pandas as pd
import torch

from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.interleave import MIN_BLOCKS, interleave
from amp_tutorial.models import course_models
from amp_tutorial.op_profile import (
    compiled_op_count,
    cpu_scaled_mm_uses_onednn,
    fp8_matmul_problem,
    op_counts,
)
from amp_tutorial.plots import plot_dtype_ranges
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded
from amp_tutorial.reversal_task import sequence_loss
from amp_tutorial.versions import import_torchao, torchao_for

info = select_device()
preset = get_preset(device_type=info.type)
torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset))

# %% [markdown]
# ## 1. The FP8 formats, and why they need a scale
#
# Two 8-bit float formats are in use: **e4m3** (4 exponent bits, 3 mantissa bits: more
# precision, for weights and activations) and **e5m2** (5 and 2: more range, for gradients).
# `torch.finfo` gives their limits next to fp16 and bf16. (`e4m3fn` is the variant without
# infinities, so its largest value is 448. AMD's MI300 (gfx942) computes only in the `fnuz`
# variants, with no infinities and no negative zero, and a different range: e4m3fnuz stops at
# 240. torchao's float8 training switches to them by itself on gfx940-942 (`Float8TypeConfig` in
# `torchao/float8/config.py`, `is_MI300`); MI350 (gfx950), RDNA4 (gfx1200/1201) and NVIDIA use
# e4m3fn and e5m2.)

# %%
FORMATS = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
           torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
formats = pd.DataFrame({dtype_name(d): {
    "bits": torch.finfo(d).bits, "largest": torch.finfo(d).max,
    "smallest normal": torch.finfo(d).smallest_normal, "eps (precision)": torch.finfo(d).eps}
    for d in FORMATS}).T
assert torch.finfo(torch.float8_e4m3fn).max == 448 and torch.finfo(torch.float8_e5m2).max == 57344
assert torch.finfo(torch.float8_e4m3fn).eps == 2**-3 and torch.finfo(torch.float8_e5m2).eps == 2**-2
assert torch.finfo(torch.float8_e4m3fnuz).max == 240
formats

# %% [markdown]
# The same limits on one line of powers of two, with fp32 for comparison. From the smallest
# subnormal to the largest value, fp32 spans 277 powers of two, bf16 261, fp16 40, e5m2 32 and
# e4m3fn not even 18 (2^-9 to 448): a tensor whose values spread wider than that loses its smallest
# or its largest values in FP8, whatever the scale; a scale only slides the window. The olive part
# is each format's subnormal range, where precision runs out bit by bit.

# %%
fig = plot_dtype_ranges([torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                         torch.float8_e5m2], "FP8's range beside the 16- and 32-bit formats")

# %% [markdown]
# A value past the largest one does not behave alike in the three formats when you cast it with
# `.to()`, and for e4m3fn not alike in every torch either (`Float8_e4m3fn.h`, under
# `torch/headeronly/util/`): torch 2.14 **saturates** e4m3fn at 448 (infinity too; NaN stays NaN;
# pytorch/pytorch#178817, April 2026), while 2.9 and 2.11 turn anything past 464 (halfway to the
# next step) into **NaN**. e5m2 becomes inf, and e4m3fnuz becomes NaN from 248 up (the halfway
# point to 256), in all three. So a scale computed for e4m3fn's 448 turns e4m3fnuz values into
# NaN. The cell probes which rule your torch follows:

# %%
past = torch.tensor([300.0, 1e6, math.inf])
e4m3fn_past = past.to(torch.float8_e4m3fn).float()
SATURATES = e4m3fn_past[1].item() == 448.0  # torch 2.14; NaN in 2.9 and 2.11
print(f"torch {torch.__version__}: e4m3fn past 448 -> {e4m3fn_past.tolist()} "
      f"({'saturates' if SATURATES else 'NaN'})")
if SATURATES:
    assert e4m3fn_past.tolist() == [288.0, 448.0, 448.0]  # rounds, then saturates
else:
    assert e4m3fn_past[0] == 288.0 and e4m3fn_past[1:].isnan().all()  # rounds, then NaN
version = torch.torch_version.TorchVersion(torch.__version__)
assert SATURATES if version >= (2, 14) else (version >= (2, 12) or not SATURATES)
assert torch.tensor([464.0]).to(torch.float8_e4m3fn).item() == 448.0  # halfway: rounds down
assert past.to(torch.float8_e5m2).float().tolist() == [320.0, math.inf, math.inf]
assert torch.tensor([247.0, 248.0, 448.0]).to(torch.float8_e4m3fnuz).float().isnan().tolist() == [
    False, True, True]

# %% [markdown]
# With three mantissa bits and a range of 2^-6 to 448 (normal numbers), e4m3 cannot hold a tensor's
# values as they are: values below its smallest normal number keep fewer bits (subnormals) or become
# zero, large ones saturate (or turn into NaN, torch 2.9 and 2.11). So every FP8 recipe stores a
# **scale per tensor** (or per row, or per block): multiply so the tensor's largest magnitude lands
# at the format's largest value, cast, and divide the result by the same scale afterwards. Measured
# with torch's float8 dtypes on the CPU, on gradient-sized values (standard deviation 1e-3), on tiny
# ones (1e-6), and on large ones (300: e4m3fn's 448 is only 1.5 standard deviations away):

# %%
def fp8_roundtrip(x, dtype, scale=1.0):
    """Cast to FP8 and back, with a per-tensor scale applied before the cast."""
    return (x * scale).to(dtype).float() / scale


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


# %%
rows = {}
for std in (1e-3, 1e-6, 300.0):
    torch.manual_seed(0)
    grads = torch.randn(4096) * std
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        scale = torch.finfo(dtype).max / grads.abs().max()
        rows[(dtype_name(dtype), std)] = {
            "below smallest normal": (grads.abs() < torch.finfo(dtype).smallest_normal)
            .float().mean().item(),
            "above largest": (grads.abs() > torch.finfo(dtype).max).float().mean().item(),
            "error, no scale": relative_error(fp8_roundtrip(grads, dtype), grads),
            "zeros, no scale": (fp8_roundtrip(grads, dtype) == 0).float().mean().item(),
            "per-tensor scale": scale.item(),
            "error, scaled": relative_error(fp8_roundtrip(grads, dtype, scale), grads)}
quantization = pd.DataFrame(rows).T
quantization

# %% [markdown]
# The scale helps where the values lie outside the format's normal range, below it or above it,
# and only there. At 1e-3 every value lies below e4m3fn's smallest normal (2^-6), most become
# zero, and the scale brings the error down about twentyfold. e5m2's normal range reaches down to
# 2^-14 (about 6e-5), so at 1e-3 nearly all values are normal already: the scale moves them, but
# the error stays what two mantissa bits give (about 0.05). At 1e-6 both formats round every
# value to zero without a scale, and with it both are back at their precision. At 300, about 13%
# of the values lie past e4m3fn's 448: unscaled, torch 2.14 saturates them (error 0.23) and 2.9 or
# 2.11 make them NaN (error NaN); the scale, below one here, brings them in range (0.027). e5m2
# reaches 57344, so 300 is well inside its range and the scale changes little. These hold for
# any seed (the cell measures seed 0; seeds 0-9 give the same picture within 0.002 at 1e-3 and
# 1e-6).

# %%
q = quantization["error, no scale"], quantization["error, scaled"]
assert quantization.loc[("float8_e4m3fn", 1e-3), "below smallest normal"] > 0.99
assert q[0][("float8_e4m3fn", 1e-3)] > 0.3 and q[1][("float8_e4m3fn", 1e-3)] < 0.05
assert quantization.loc[("float8_e5m2", 1e-3), "below smallest normal"] < 0.1
assert abs(q[1][("float8_e5m2", 1e-3)] - q[0][("float8_e5m2", 1e-3)]) < 0.1 * q[0][
    ("float8_e5m2", 1e-3)]  # the scale changes little: the values were normal already
for fmt in ("float8_e4m3fn", "float8_e5m2"):  # below the range: all zero, unless scaled
    assert quantization.loc[(fmt, 1e-6), "zeros, no scale"] == 1.0 and q[1][(fmt, 1e-6)] < 0.1
big = ("float8_e4m3fn", 300.0)  # above the range: saturated (2.14) or NaN (2.9, 2.11), unscaled
assert quantization.loc[big, "above largest"] > 0.05 and q[1][big] < 0.05
assert q[0][big] > 0.15 if SATURATES else math.isnan(q[0][big])
assert quantization.loc[("float8_e5m2", 300.0), "above largest"] == 0
assert abs(q[1][("float8_e5m2", 300.0)] - q[0][("float8_e5m2", 300.0)]) < 0.01

# %% [markdown]
# ## 2. FP8 training runs everywhere, and pays only on FP8 hardware
#
# The course uses **torchao**'s float8 training (`torchao.float8.convert_to_float8_training`,
# installed with the course): PyTorch's own library swaps each `nn.Linear` for a `Float8Linear`
# (dynamic per-tensor scales, e4m3 forward, e5m2 for gradients) whose matmuls call
# `torch._scaled_mm`. NVIDIA's Transformer Engine does the same through its own layers (`te.Linear`
# inside `fp8_autocast`), tied to NVIDIA's CUDA stack (AMD keeps a separate ROCm port).
#
# `_scaled_mm` runs on NVIDIA GPUs of compute capability 8.9 and newer (Ada, Hopper, Blackwell), on
# the AMD GPUs torch's `_scaled_mm_allowed_device` lists (`ScaledBlas.cpp`, torch 2.14:
# MI300X/MI325X gfx942; RDNA4 gfx1200/gfx1201 from ROCm 6.3; MI350 gfx950 from ROCm 6.5), and on the
# CPU (torch 2.9, 2.11 and 2.14 all have a CPU `_scaled_mm`; a cell below checks yours). Those GPUs
# have FP8 matrix cores; there the run is compiled (`torch.compile` fuses the scaling and casting,
# which a speedup needs) at the preset's sizes. Elsewhere (a CPU, MPS, an older GPU) the cells train
# on the CPU, far more slowly: the `smoke` preset's transformer, eagerly, for 10 steps, whatever the
# preset. Only linear layers are converted, so the transformer is the model; the vocabulary head
# stays in bf16. The two runs are timed as in lesson 03, taking turns beside a second bf16 run
# (the control); the losses are read at the step count above, the timing trains a few more.
#
# The CPU's numbers are FP8's where it counts, the inputs' rounding, but not a GPU's to the last
# bit. ATen's `_scaled_mm_out_cpu` (`Blas.cpp`) takes oneDNN's FP8 kernel only when oneDNN is on
# and the CPU has AMX-INT8 (Intel Xeon Sapphire Rapids and newer); on every other CPU (AMD Zen,
# older Intel) it converts both FP8 inputs to fp32 and multiplies with `aten::mm`. And torchao asks
# for fast accumulation in the forward matmul (`Float8LinearConfig.gemm_config_output`,
# `use_fast_accum=True`), which Hopper's FP8 tensor cores do in lower precision than the CPU's
# fp32 sums.

# %%
# AMD architectures torch's _scaled_mm accepts, with the first ROCm for each (ScaledBlas.cpp's
# _scaled_mm_allowed_device, torch 2.14; gfx940/941, early MI300 parts, are not listed)
ROCM_FP8 = {"gfx942": (0, 0), "gfx1200": (6, 3), "gfx1201": (6, 3), "gfx950": (6, 5)}


def fp8_capable():
    if info.type != "cuda":
        return False, ("FP8 matrix cores need NVIDIA cc >= 8.9 or AMD gfx942/gfx950/RDNA4, "
                       f"not {info.type}")
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(info.device).gcnArchName.split(":")[0]
        rocm = tuple(int(v) for v in torch.version.hip.split(".")[:2])
        ok = arch in ROCM_FP8 and rocm >= ROCM_FP8[arch]
        return ok, (f"AMD {arch}, ROCm {rocm[0]}.{rocm[1]}: torch's _scaled_mm "
                    f"{'accepts' if ok else 'does not accept'} it (gfx942; gfx1200/gfx1201 from "
                    "ROCm 6.3; gfx950 from 6.5)")
    cc = torch.cuda.get_device_capability(info.device)
    return cc >= (8, 9), f"NVIDIA compute capability {cc[0]}.{cc[1]} (FP8 needs 8.9 or newer)"


# %%
def to_float8(model):
    """Swap every linear whose sizes are multiples of 16, except the vocabulary head, for
    torchao's Float8Linear (in place); returns the model."""
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "head" and (
        m.in_features % 16 == 0 and m.out_features % 16 == 0))


# %%
def fp8_training_ready(on_cpu):
    """Whether torchao imports (and, on_cpu, torch computes _scaled_mm on the CPU); if not, why
    not and what would enable it, in one line."""
    try:
        torchao = import_torchao()
    except Exception as error:  # not installed, or built for another torch
        want = torchao_for(torch.__version__)
        return False, (f"torchao does not import on torch {torch.__version__} "
                       f"({type(error).__name__}: {str(error).splitlines()[0][:120]}); "
                       + (f"installing torchao {want} enables it" if want else
                          "no torchao release matches this torch"))
    if not on_cpu:
        return True, f"torchao {torchao.__version__} on torch {torch.__version__}"
    if problem := fp8_matmul_problem():  # a small FP8 matmul, on the kernel training will take
        return False, problem
    kernel = "oneDNN's FP8 kernel" if cpu_scaled_mm_uses_onednn() else "fp32 copies and aten::mm"
    return True, f"torch {torch.__version__} computes _scaled_mm on the CPU, with {kernel}"


# %%
def transformer_run(use_fp8, device, sizes, compiled):
    """Lesson 12's transformer, one batch, bf16 autocast; use_fp8: torchao's float8 linears.
    Its first step runs here, profiled (compiled: after one that compiles); ``step`` trains one
    more."""
    make_model, x, y, _ = course_models(sizes, device)["transformer"]
    model = to_float8(make_model()) if use_fp8 else make_model()
    net = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = sequence_loss(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if compiled:  # the first step compiles: count the FP8 matmuls in the graphs Inductor gets
        with compiled_op_count("aten::_scaled_mm") as compiled_ops:
            step()
    ops = op_counts(step, device)  # the next step, profiled: what ran as aten ops
    return {"step": step, "losses": losses, "_scaled_mm calls": ops.get("aten::_scaled_mm", 0),
            "float8 layers": sum(type(m).__name__ == "Float8Linear" for m in model.modules()),
            "FP8 matmuls compiled": compiled_ops["aten::_scaled_mm"] if compiled else float("nan")}


# %%
fp8_fast, fp8_reason = fp8_capable()
ready, ready_reason = fp8_training_ready(on_cpu=not fp8_fast)
print(f"FP8 matrix cores: {fp8_fast} ({fp8_reason})")
# one line: where FP8 trains, or why it is skipped and what would enable it (never a traceback)
print(f"{'FP8 training' if ready else 'FP8 training skipped'}: {ready_reason}")
# no FP8 matrix cores: the CPU at smoke's sizes (a step at `cpu` would take over half an hour)
device = info.device if fp8_fast else torch.device("cpu")
sizes, steps = (preset, min(preset.steps, 64)) if fp8_fast else (get_preset("smoke"), 10)
fp8_runs = {}
if ready:
    fp8_runs = {name: transformer_run(fp8, device, sizes, compiled=fp8_fast) for name, fp8 in
                (("bf16 AMP", False), ("bf16 AMP again", False), ("FP8 + bf16 AMP", True))}
    # taking turns step by step beside a second bf16 run, the control (lesson 03)
    timed = interleave({name: r["step"] for name, r in fp8_runs.items()}, "bf16 AMP",
                       "bf16 AMP again", device, blocks=max(MIN_BLOCKS, steps // 2),
                       preset=sizes.name)
    del fp8_runs["bf16 AMP again"]
    for name, r in fp8_runs.items():
        losses = r.pop("losses")  # the timing trains a few steps more: read step `steps`
        r.update({"first loss": losses[0], "final loss": losses[steps - 1]})
        print(f"{name}: {timed.timings[name]}")
    print(f"{device.type}, {sizes.name!r} transformer sizes, {steps} steps: "
          f"{with_recorded(timed.comparison('FP8 + bf16 AMP'), '16 fp8', info)}")
pd.DataFrame(fp8_runs).T.drop(columns="step", errors="ignore").round(3)

# %% [markdown]
# Which kernel computed this CPU's FP8 matmuls? One `_scaled_mm`, profiled: where oneDNN's FP8
# kernel runs there is no `aten::mm` under it; elsewhere the fp32 `aten::mm` shows.

# %%
if ready and not fp8_fast:
    a8, one = torch.randn(16, 32).to(torch.float8_e4m3fn), torch.ones(())
    inside = op_counts(lambda: torch._scaled_mm(a8, a8.t(), one, one, out_dtype=torch.bfloat16))
    print(f"under aten::_scaled_mm: {sorted(k for k in inside if k != 'aten::_scaled_mm')}")
    assert inside["aten::_scaled_mm"] == 1
    assert ("aten::mm" in inside) != cpu_scaled_mm_uses_onednn()  # oneDNN: AMX-INT8 and mkldnn on

# %% [markdown]
# Both runs learn from the same batch, and the table shows that the FP8 run really computed in FP8:
# each `Float8Linear` makes three FP8 matmuls per step (the forward, and the gradients of its input
# and of its weight), the bf16 run none. Eagerly, each is an `aten::_scaled_mm` call in the
# profile. Compiled, the count is taken from the graphs Inductor compiles (`compiled_op_count`,
# forward and backward): three per layer there too. The profile's `aten::_scaled_mm` calls can then
# be anything from 0 to 3 per layer, because on a GPU Inductor may compute a `_scaled_mm` with a
# Triton template of its own (`tuned_scaled_mm` in `torch/_inductor/kernel/mm.py` offers them even
# without max-autotune, and keeps the fastest), which no `aten::_scaled_mm` event records. The
# thresholds differ by where the run happened, each with a margin over what was measured:
#
# - on a CPU (`smoke` sizes, eager, 10 steps; every preset): the loss falls below 0.9 of its start,
#   and FP8's final loss is within 1% of the start loss of bf16's. Measured on a 2-core Intel Xeon
#   (AMX bf16, no FP8 units), torch 2.14.1, torchao 0.18.0, four model and batch seeds: 0.80-0.83,
#   and 0.05-0.07%. FP8 took about 160 times bf16's time per step there (2.2 s against 13 ms).
# - on an FP8 GPU (the preset's sizes, compiled, 64 steps): the loss halves, FP8 within 10% of
#   bf16's start loss. Not measured on a GPU by this project (docs/gpu-register.md).

# %%
assert bool(fp8_runs) == ready  # run wherever torchao imports and _scaled_mm runs
if fp8_runs:
    bf16_run, fp8_run = fp8_runs.values()
    assert fp8_run["float8 layers"] > 0 == bf16_run["float8 layers"]  # the conversion happened
    calls, layers = fp8_run["_scaled_mm calls"], fp8_run["float8 layers"]
    if fp8_fast:  # compiled: 3 per layer in Inductor's graphs, some maybe as Triton templates
        assert fp8_run["FP8 matmuls compiled"] == 3 * layers and 0 <= calls <= 3 * layers
        assert bf16_run["FP8 matmuls compiled"] == 0
    else:  # eager: the forward and 2 in backward, each an aten::_scaled_mm
        assert calls == 3 * layers
    assert bf16_run["_scaled_mm calls"] == 0
    if fp8_fast:  # GPU-only thresholds, unmeasured by the course (docs/gpu-register.md)
        learned, fp8_gap = 0.5, 0.1
    else:  # measured on the CPU at smoke sizes, 10 steps, 4 seeds: 0.80-0.83 and 0.0005-0.0007
        learned, fp8_gap = 0.9, 0.01
    for r in fp8_runs.values():
        assert math.isfinite(r["final loss"]) and r["final loss"] < learned * r["first loss"], r
    assert abs(fp8_run["final loss"] - bf16_run["final loss"]) <= fp8_gap * bf16_run["first loss"]

# %% [markdown]
# FP8 pays when the matmuls are large enough that the faster FP8 matrix cores win back the time
# spent finding scales and casting; small layers get slower: on an H100 at `paper` (width 512, 6
# layers) FP8 took 1.3x bf16's time (26.4 against 20.7 ms per step, torch 2.11 with torchao 0.18,
# compiled, 2026-11-26). Without FP8 matrix cores it does not
# pay, but how much it costs depends on the machine: the 160x above is one AMX Xeon's, where bf16 is
# fast; on a CPU that emulates bf16 (AVX2 only) bf16 is slow too, and FP8 took about as long as bf16
# there (1.0x, issue 33's measurement on a Zen 3). It also needs the same care as fp16 had before
# bf16: a scale per tensor, and e5m2's range for gradients.

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing; 1 and 2 in section 1, 3 in section 2. Predict the outcome, then
# re-run from that cell.
#
# 1. **Values of order one.** Make the loop `for std in (1e-3, 1e-6, 1.0):`. At std 1.0 almost
#    every value is normal in both formats (1.4% lie below e4m3fn's 2^-6, none below e5m2's), and
#    the errors without a scale (0.0267 and 0.0536) are about those with one (0.0274 and 0.0524):
#    the scale matters only outside the normal range, as in section 1.
# 2. **Overshoot the range.** Double the scale (`scale = 2 * torch.finfo(dtype).max / ...`). Both
#    scaled errors grow and the assert cell stops: in e5m2 the largest values overflow to inf, so
#    its error is inf; e4m3fn saturates at 448 instead on torch 2.14 (section 1), and its error at
#    1e-3 grows about 4x, 0.027 to 0.116 (on 2.9 and 2.11 those values become NaN, and so does the
#    error). That is why the scale aims at the largest value.
# 3. **Train longer on the CPU.** Change the CPU's 10 steps to 20 in section 2's run cell: both
#    losses keep falling together (to about 1.6 at step 20, from 2.53), at FP8's slow CPU speed.

# %% [markdown]
# ## What to remember
#
# - FP8 needs a scale per tensor; it helps where values lie outside the format's normal range,
#   below it (zeros) or above it.
# - Past the largest value, `.to()` saturates e4m3fn at 448 in torch 2.14 (NaN in 2.9 and 2.11),
#   gives inf in e5m2 and NaN in e4m3fnuz.
# - FP8 training with torchao runs on every device (`_scaled_mm` on the CPU in torch 2.9, 2.11 and
#   2.14, the versions checked) with FP8's rounding of the inputs; it pays only with FP8 matrix
#   cores (NVIDIA cc >= 8.9; AMD gfx942, gfx950, RDNA4), compiled, for large matmuls. Compiled,
#   count the FP8 matmuls in Inductor's graphs: the profiler misses those Triton computes.
