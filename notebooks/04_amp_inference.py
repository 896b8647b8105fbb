# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 20
#     memory:
#       cpu: 258
#       paper: 2054
#     minutes:
#       cpu: 0.4
#       small: 0.2
#       smoke: 0.2
#     needs: any device, CPU included; allocator peak memory on a GPU
#     track: core
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
# # 04 · AMP for inference
#
# Inference is the easy half of mixed precision: wrap the forward pass in `torch.autocast` and
# you are done. There are no gradients, so there is nothing to underflow and **no GradScaler**.
# This lesson trains the lesson-03 model in fp32, then serves it in fp32 and under autocast and
# compares time, memory and the predictions themselves.
#
# Two things every inference loop should have, AMP or not:
#
# - `model.eval()`: BatchNorm uses its running statistics instead of the batch's, dropout is off;
# - `torch.inference_mode()`: autograd records nothing and keeps no tensors for backward.
#
# The ROCm blog this course started from had the first but not the second: its inference runs
# called `model.eval()` on a fresh, untrained model and ran it without `inference_mode` or
# `no_grad`, so autograd recorded a graph on every call and kept the tensors it saves for
# backward, inflating the memory it reported for inference. Its clock had the faults lesson 03
# lists (stopped before synchronising, no warm-up, one total).

# %%
import pandas as pd
import torch
from tqdm.auto import tqdm

from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, dtype_name, fp32_baseline, select_device
from amp_tutorial.interleave import interleave
from amp_tutorial.measure import (
    Comparison,
    activation_output_bytes,
    step_peak,
    timing_columns,
)
from amp_tutorial.models import ConvModel
from amp_tutorial.plots import plot_bars, plot_outputs
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded
from amp_tutorial.steps import make_train_step

info = select_device()
preset = get_preset(device_type=info.type)
print(device_line(info, preset, sizes=f"grid {preset.grid}, hidden {preset.hidden}, "
                                    f"{preset.inference_steps} timed forward passes"))

# %% [markdown]
# ## A trained model
#
# We train in plain fp32 with the course package's training step (lesson 03 wrote the same loop out
# cell by cell). A model trained in fp32 can be served with AMP, and vice versa: the weights stay
# fp32 either way.

# %%
torch.manual_seed(0)
MEMORY_FORMAT = torch.channels_last  # the layout fast convolutions use (lesson 03 explains)
inputs, targets = make_problem(preset.grid, info.device, MEMORY_FORMAT)
model = ConvModel(preset.hidden, preset.n_hidden_layers)
model = model.to(info.device, memory_format=MEMORY_FORMAT)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_step = make_train_step(model, optimizer, inputs, targets)
losses = [train_step(i) for i in tqdm(range(preset.steps), desc="training (fp32)")]
del optimizer, train_step
model.eval()
print(f"trained {preset.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")

# %% [markdown]
# ## fp32 vs autocast inference
#
# The only difference between the two functions is the `torch.autocast` line.

# %%
def infer_fp32(i):
    with torch.inference_mode():
        return model(inputs)


def make_infer_amp(amp_dtype):
    def infer_amp(i):
        with torch.inference_mode(), torch.autocast(device_type=info.type, dtype=amp_dtype):
            return model(inputs)
    return infer_amp


# %%
baseline_name = fp32_baseline(info)
control = f"{baseline_name} again"  # the same forward timed twice: compared, 1.00x
candidates = {baseline_name: infer_fp32, control: infer_fp32}
candidates.update({f"AMP {dtype_name(d)}": make_infer_amp(d) for d in info.amp_dtypes})
timed = interleave({name: lambda f=infer: f(0) for name, infer in candidates.items()},
                   baseline_name, control, info.device, blocks=preset.inference_steps // 2,
                   warmup=preset.warmup, preset=preset.name)  # taking turns, as in lesson 03
comparisons = {c.name: c for c in timed.comparisons()}
print(f"timed in {timed.basis}" + (f" (torch threads: {timed.threads})" if timed.threads else ""))

runs = {}
for name, infer in candidates.items():
    if name == control:
        continue
    output, peak = step_peak(lambda f=infer: f(0), info.device)  # one more forward
    runs[name] = {
        "timing": timed.timings[name],
        "peak": peak,
        "layer outputs": activation_output_bytes(model, lambda f=infer: f(0)),
        "prediction": output.float(),
        "dtype": output.dtype,
    }
    del output
    print(f"{name:>28}: {runs[name]['timing']}, output dtype {runs[name]['dtype']}")

# %% [markdown]
# `layer outputs` adds up the bytes of every layer's output in one forward pass: the activations
# that inference has to hold, at least one at a time. On CPU, CUDA (and ROCm) and XPU each of them
# is 16-bit under autocast: the convolutions are lowered, and BatchNorm and ReLU are on no list
# there, so they keep their 16-bit input. MPS differs: its autocast puts `batch_norm` on its
# fp32 list (`KERNEL_MPS(batch_norm, fp32)` in `aten/src/ATen/autocast_mode.cpp`), so there the
# BatchNorm outputs and the ReLUs after them stay fp32, and only the convolution outputs shrink:
# about (1/2 + 1 + 1) / 3 = 0.83 of fp32's bytes instead of one half.

# %%
base = runs[baseline_name]
results = pd.DataFrame({
    name: {
        **timing_columns(r["timing"], base["timing"], r["peak"], preset.name,
                         comparisons.get(name)),
        "layer outputs (MB)": r["layer outputs"] / 2**20,
        "max |prediction - fp32|": (r["prediction"] - base["prediction"]).abs().max().item(),
    }
    for name, r in runs.items()
}).T
results.round(4)

# %%
for name, r in runs.items():
    if name == baseline_name:
        continue
    assert r["dtype"] != torch.float32, "autocast output should be in the lower precision"
    ratio = r["layer outputs"] / base["layer outputs"]
    # MPS keeps BatchNorm (and so the ReLU after it) in fp32: about 0.83 there, see above
    expected = 0.9 if info.type == "mps" else 0.55
    assert ratio <= expected, f"{name}: activations {ratio:.2f} of fp32's, expected <= {expected}"
    error = results.loc[name, "max |prediction - fp32|"]
    assert error < 0.1, f"{name}: predictions differ from fp32 by {error:.3f}"
saving = "shrinks (BatchNorm stays fp32 on MPS)" if info.type == "mps" else "halves"
print(f"AMP {saving} the activation bytes, and its predictions match fp32 to within 0.1 "
      "(targets span 0 to 1).")

# %%
bars = {"time per forward (ms)": results["time/step median (ms)"].to_dict(),
        "layer outputs (MB)": results["layer outputs (MB)"].to_dict()}
if info.has_allocator_stats:
    bars["peak memory (MB)"] = results["peak memory (MB)"].to_dict()
noise = Comparison.why_no_ratio(comparisons.values())  # why the bars give no ratio, or None
fig = plot_bars(bars, f"fp32 vs AMP inference on {info.type} ({preset.name} preset); "
                "whiskers: ± half the IQR",
                errors={"time per forward (ms)": results["time/step IQR (ms)"].div(2).to_dict()},
                noise={"time per forward (ms)": noise})

# %%
images = {"target": targets, **{name: r["prediction"] for name, r in runs.items()}}
fig = plot_outputs(images, "Predictions served in fp32 and under autocast")

# %% [markdown]
# ## What the inference gain depends on
#
# The blog reported 46% less time for training and 32% for inference on its GPU (with the faults
# listed above) and concluded that inference gains less because it has no backward pass. That is
# not a rule. Measured at the `cpu` preset (docs/benchmark.md), channels_last: on an EPYC (Zen 5)
# bf16 inference gained less than training (2.57x against 3.56x), on an EPYC (Zen 4) more (2.18x
# against 2.00x); on a Xeon with AMX it ranged from 2.5x to 10.8x across three runs, around
# training's 2.6x to 3.4x. On a CPU
# without native bf16 (no AVX512-BF16 or AMX on x86, no BF16 extension on Arm: the flags
# `amp_tutorial.device` looks for) bf16 is only emulated: there fp32 is the fast choice and AMP
# runs only to learn from (how much slower depends on your torch build's kernels). What decides it
# is whether
# the hardware computes in 16-bit natively, and then how much of the forward pass is convolution
# or matmul (lowered) rather than fixed costs (launches, BatchNorm, casting the fp32 weights to
# 16-bit on every call). Under `inference_mode` nothing is saved for backward, so the memory
# saved is in the activations alive during the forward pass. This run measured:

# %%
for c in comparisons.values():
    emulated = info.type == "cpu" and info.native_bf16 is False and "bf16" in c.name
    cause = " (this CPU has no native bf16, see the device line)" if emulated else ""
    print(f"inference on {info.name}, preset {preset.name}: "
          f"{with_recorded(c, f'04 infer {c.name.split()[-1]}', info)}"
          f"{cause if c.stated and c.ratio < 1 else ''}")

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **Two 16-bit formats side by side.** In "fp32 vs autocast inference", replace
#    `info.amp_dtypes` with `(torch.bfloat16, torch.float16)`. Both rows halve the layer outputs,
#    and fp16's `max |prediction - fp32|` is several times smaller than bf16's. On a CPU: 0.00031
#    against 0.0023 at `smoke`, 0.0082 against 0.053 at `cpu`. fp16 keeps 11 significant bits to
#    bf16's 8, and these activations are far from fp16's largest value.
# 2. **Switch autocast off.** In `make_infer_amp`, pass `enabled=False` to `torch.autocast`. The AMP
#    row's output dtype is now `torch.float32`, its layer outputs equal fp32's, its difference from
#    fp32 is exactly 0, and the check cell stops at "autocast output should be in the lower
#    precision": the checks catch an AMP path that does nothing.

# %% [markdown]
#
# ## What to remember
#
# - Inference AMP is `model.eval()`, `torch.inference_mode()` and `torch.autocast`: no scaler.
# - Check that predictions still match fp32 closely enough for your application.
# - Outputs come back in 16-bit: call `.float()` before anything that needs fp32 (metrics,
#   post-processing, numpy).
