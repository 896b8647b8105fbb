# ---
# jupyter:
#   amp_tutorial:
#     memory:
#       cpu: 2
#       paper: 5
#     minutes:
#       cpu: 0.1
#       small: 0.1
#       smoke: 0.1
#     needs: 'any device, CPU included; FP8 training: NVIDIA compute capability 8.9+
#       or AMD MI300+, with torchao (`pdm install -G fp8`)'
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
# transformer in FP8 where the hardware and the library are there; lesson 14's `torch.compile`
# is part of the recipe. Sizes come from the preset; seeds are fixed. Lesson 17 shows how to see
# which ops really ran in low precision.

# %%
import importlib.util
import math

import pandas as pd
import torch
from tqdm.auto import tqdm

from amp_tutorial.device import describe_device, dtype_name, select_device
from amp_tutorial.measure import StepTimer
from amp_tutorial.models import course_models
from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import sequence_loss

info = select_device()
preset = get_preset(device_type=info.type)
print(describe_device(info))
print(f"preset {preset.name!r}: {preset.description}")
torch.manual_seed(0)  # every run starts from the same numbers
# the transformer and the first training batch of lesson 12's reversal task
make_transformer, tokens, token_targets, _ = course_models(preset, info.device)["transformer"]

# %% [markdown]
# ## 1. The FP8 formats, and why they need a scale
#
# Two 8-bit float formats are in use: **e4m3** (4 exponent bits, 3 mantissa bits: more
# precision, for weights and activations) and **e5m2** (5 and 2: more range, for gradients).
# `torch.finfo` gives their limits next to fp16 and bf16. (`e4m3fn` is the variant without
# infinities, so its largest value is 448. AMD's MI300 (gfx942) computes only in the `fnuz`
# variants, with no infinities and no negative zero, and a different range: e4m3fnuz stops at
# 240. torchao's float8 training switches to them by itself on gfx940-942
# (`Float8TypeConfig` in `torchao/float8/config.py`); MI350 and NVIDIA use e4m3fn and e5m2.)

# %%
FORMATS = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
           torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
formats = pd.DataFrame({dtype_name(d): {
    "bits": torch.finfo(d).bits, "largest": torch.finfo(d).max,
    "smallest normal": torch.finfo(d).smallest_normal, "eps (precision)": torch.finfo(d).eps}
    for d in FORMATS}).T
assert torch.finfo(torch.float8_e4m3fn).max == 448 and torch.finfo(torch.float8_e5m2).max == 57344
assert torch.finfo(torch.float8_e4m3fn).eps == 2**-3 and torch.finfo(torch.float8_e5m2).eps == 2**-2
assert torch.finfo(torch.float8_e4m3fnuz).max == 240  # a scale computed for e4m3fn saturates
formats

# %% [markdown]
# With three mantissa bits and a range of 2^-6 to 448 (normal numbers), e4m3 cannot hold a
# tensor's values as they are: small activations or gradients fall below its normal range and
# lose their bits or become zero, large ones saturate. So every FP8 recipe stores a **scale per
# tensor** (or per row, or per block): multiply so the tensor's largest magnitude lands at the
# format's largest value, cast, and divide the result by the same scale afterwards. Measured with
# torch's float8 dtypes on the CPU, on gradient-sized values (standard deviation 1e-3):

# %%
def fp8_roundtrip(x, dtype, scale=1.0):
    """Cast to FP8 and back, with a per-tensor scale applied before the cast."""
    return (x * scale).to(dtype).float() / scale


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


# %%
torch.manual_seed(0)
grads = torch.randn(4096) * 1e-3
rows = {}
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
    scale = torch.finfo(dtype).max / grads.abs().max()
    rows[dtype_name(dtype)] = {
        "error, no scale": relative_error(fp8_roundtrip(grads, dtype), grads),
        "zeros, no scale": (fp8_roundtrip(grads, dtype) == 0).float().mean().item(),
        "per-tensor scale": scale.item(),
        "error, scaled": relative_error(fp8_roundtrip(grads, dtype, scale), grads),
        "zeros, scaled": (fp8_roundtrip(grads, dtype, scale) == 0).float().mean().item()}
    assert rows[dtype_name(dtype)]["error, scaled"] < rows[dtype_name(dtype)]["error, no scale"]
quantization = pd.DataFrame(rows).T
assert quantization.loc["float8_e4m3fn", "error, scaled"] < 0.1
assert quantization.loc["float8_e4m3fn", "zeros, no scale"] > 0.5  # most of the tensor vanished
quantization

# %% [markdown]
# ## 2. FP8 training, where the hardware has it
#
# FP8 matmuls run on NVIDIA GPUs of compute capability 8.9 and newer (Ada, Hopper, Blackwell) and
# on AMD Instinct MI300 and newer. The course uses **torchao**'s float8 training
# (`torchao.float8.convert_to_float8_training`): it is PyTorch's own library, swaps each
# `nn.Linear` for a `Float8Linear` (dynamic per-tensor scales, e4m3 forward, e5m2 for gradients),
# works with `torch.compile` (which fuses the scaling and casting, and is needed for a speedup),
# and its wheel installs from PyPI even on a CPU-only machine (checked with torchao 0.18.0).
# NVIDIA's Transformer Engine does the same through its own layers (`te.Linear` inside
# `fp8_autocast`) and is the choice inside NVIDIA's model stacks, but it is tied to NVIDIA's CUDA
# stack (AMD keeps a separate ROCm port). torchao is not in the course's default environment:
# `pdm install -G fp8` adds it.
#
# Only linear layers are converted, so the transformer is the model for this; the ConvModel's
# 1x1 convolutions stay as they are. The cells compare bf16 AMP with FP8 + bf16 AMP, both compiled;
# everywhere else it says what it would run and why it cannot.

# %%
def fp8_capable():
    if info.type != "cuda":
        return False, f"FP8 matmuls need an NVIDIA (cc >= 8.9) or AMD MI300+ GPU, not {info.type}"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(info.device).gcnArchName
        ok = arch.startswith(("gfx94", "gfx95"))
        return ok, f"AMD {arch}: {'has' if ok else 'has no'} FP8 matrix cores (MI300 is gfx942)"
    cc = torch.cuda.get_device_capability(info.device)
    return cc >= (8, 9), f"NVIDIA compute capability {cc[0]}.{cc[1]} (FP8 needs 8.9 or newer)"


def to_float8(model):
    """Swap every linear whose sizes are multiples of 16, except the vocabulary head, for
    torchao's Float8Linear."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "head" and (
        m.in_features % 16 == 0 and m.out_features % 16 == 0))


# %%
def train_transformer(use_fp8):
    """The transformer compiled, under bf16 autocast; with use_fp8, torchao's float8 linears."""
    model = make_transformer()
    if use_fp8:
        to_float8(model)
    fp8_layers = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    net = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = StepTimer(info.device, warmup=preset.warmup + 1)  # the first step compiles
    losses = []

    for _ in tqdm(range(timer.warmup + min(preset.steps, 64)), desc="FP8" if use_fp8 else "bf16"):
        with timer.step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(info.type, dtype=torch.bfloat16):
                loss = sequence_loss(net(tokens), token_targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())

    timing = timer.timing
    return {"ms/step": timing.median * 1e3, "IQR (ms)": timing.iqr * 1e3,
            "first loss": losses[0], "final loss": losses[-1], "float8 layers": fp8_layers}


# %%
FP8_COMPILE = preset.name != "smoke"  # the test suite's preset skips the compiled runs
fp8_ok, fp8_reason = fp8_capable()
has_torchao = importlib.util.find_spec("torchao") is not None
print(f"FP8 hardware: {fp8_ok} ({fp8_reason}); torchao installed: {has_torchao}")
fp8_runs = {}
if fp8_ok and has_torchao and FP8_COMPILE:
    fp8_runs = {"bf16 AMP": train_transformer(False), "FP8 + bf16 AMP": train_transformer(True)}
    print(pd.DataFrame(fp8_runs).T.round(3))
    bf16_run, fp8_run = fp8_runs.values()
    assert fp8_run["float8 layers"] > 0 == bf16_run["float8 layers"]  # the conversion happened
    for r in fp8_runs.values():  # both learn: one fixed batch, so the loss must fall a lot
        assert math.isfinite(r["final loss"]) and r["final loss"] < 0.5 * r["first loss"], r
    assert abs(fp8_run["final loss"] - bf16_run["final loss"]) <= 0.1 * bf16_run["first loss"]
else:
    print("Would run: the transformer with torchao.float8.convert_to_float8_training (e4m3 "
          "weights and activations, e5m2 gradients, per-tensor dynamic scales), compiled, under "
          "bf16 autocast, against the same model in bf16 AMP.\nNot run here because: "
          + "; ".join(r for ok, r in ((fp8_ok, fp8_reason),
                                      (has_torchao, "torchao is not installed: pdm install -G fp8"),
                                      (FP8_COMPILE, "the smoke preset skips compiling"))
                      if not ok))

# %% [markdown]
# FP8 pays when the matmuls are large enough that the faster FP8 tensor cores win back the time
# spent finding scales and casting; small layers get slower. It also needs the same care as fp16
# had before bf16: a scale per tensor, and e5m2's range for gradients.

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in section 1, which runs on the CPU on every machine. Predict the
# outcome, then re-run from that cell.
#
# 1. **Smaller gradients.** Make `grads = torch.randn(4096) * 1e-6`. Without a scale every value now
#    becomes zero in both formats (zeros and error 1.0); the scale is 1000 times larger and the
#    scaled errors are as before (0.0274 and 0.0524): a per-tensor scale makes the error independent
#    of the tensor's magnitude.
# 2. **Overshoot the range.** Double the scale (`scale = 2 * torch.finfo(dtype).max / ...`). The
#    cell stops at its assert: in e5m2 the largest values overflow to inf, so its error is inf.
#    e4m3fn has no infinity; values past 448 come back as 448 here (torch 2.14), and its error grows
#    about 4x, 0.027 to 0.116 (print `rows`). That is why the scale aims at the largest value.

# %% [markdown]
# ## What to remember
#
# - FP8 needs a scale per tensor, hardware with FP8 matmuls (NVIDIA cc >= 8.9, AMD MI300+) and a
#   library (torchao float8 here) plus `torch.compile`; it pays for large matmuls.
