# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 35
#     memory:
#       cpu: 258
#       paper: 2056
#     minutes:
#       cpu: 0.5
#       small: 0.4
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
# # 03 · Training with AMP: fp32 vs mixed precision, measured properly
#
# We train the same small convolutional network twice (or three times), once in plain fp32 and
# once per AMP dtype your device supports, and compare **time per step**, **memory** and **loss**.
#
# The problem is the one from AMD's ROCm blog on AMP: given the (x, y) coordinates of every pixel,
# predict a 2D cosine pattern that has been cut into four flat levels. The steps make it harder to
# fit than a smooth wave. The network sees the whole image in every step.
#
# Sizes come from a **preset**: `paper` (the blog's 512x512 grid, 256 channels, 512 steps) on a
# GPU, `cpu` on a CPU with native bf16, `small` on one that emulates it, `smoke` in the test
# suite. Set `AMP_TUTORIAL_PRESET` to choose.
# Seeds are fixed, so every run starts from the same weights.

# %%
import pandas as pd
import torch

from amp_tutorial.autocast_policy import has_autocast_kernel
from amp_tutorial.data import make_problem
from amp_tutorial.device import (
    device_line,
    dtype_name,
    fp32_baseline,
    has_fp32_precision_api,
    select_device,
    tf32_state,
)
from amp_tutorial.interleave import interleave
from amp_tutorial.measure import (
    Comparison,
    saved_bytes,
    step_peak,
    timing_columns,
)
from amp_tutorial.models import ConvModel
from amp_tutorial.plots import plot_bars, plot_image, plot_losses, plot_outputs
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded

# %%
info = select_device()
preset = get_preset(device_type=info.type)
print(device_line(info, preset))

# %% [markdown]
# ## The problem
#
# The tensors are stored **channels-last** (NHWC: all channels of one pixel next to each other).
# The shape still reads (batch, channels, H, W); only the layout in memory changes. oneDNN, the
# CPU's convolution library, computes in this layout and reorders NCHW data to it and back around
# each convolution, which can eat much of what AMP saves. On a GPU it depends on the kernel the
# library picks (a 1x1 convolution over one NCHW image is already a plain matrix multiply). Both
# the fp32 and the AMP runs use the same layout, so the comparison stays fair;
# `pdm run bench --memory-format contiguous` measures the NCHW layout on your device.
#
# **channels_last is not fast everywhere**: on AMD GPUs MIOpen gets NHWC tensors only with
# `PYTORCH_MIOPEN_SUGGEST_NHWC=1`, and its NHWC kernels can be slower than its NCHW ones
# (docs/benchmark.md, "Memory layout"). There, measure both and set `MEMORY_FORMAT` below.

# %%
MEMORY_FORMAT = torch.channels_last  # the switch: torch.contiguous_format for NCHW
inputs, targets = make_problem(preset.grid, info.device, MEMORY_FORMAT)
print(f"inputs {tuple(inputs.shape)} (batch, x/y channels, H, W); targets {tuple(targets.shape)}")
assert inputs.is_contiguous(memory_format=torch.channels_last)
levels = targets.unique().cpu()
assert torch.allclose(levels, torch.tensor([0, 1 / 3, 2 / 3, 1]))  # four levels in [0, 1]
fig = plot_image(targets, "Target: quantized 2D sinusoid, frequency (4, 2), 4 levels")

# %% [markdown]
# ## The model
#
# Every layer is a 1x1 convolution, so the network is really a small MLP applied to each pixel;
# BatchNorm and ReLU follow each hidden layer. What matters for AMP: the **activations** (one
# `hidden`-channel image per layer) are far larger than the **weights**, so halving the bytes of
# activations is where the memory goes.

# %%
sample_model = ConvModel(preset.hidden, preset.n_hidden_layers)
sample_model = sample_model.to(info.device, memory_format=MEMORY_FORMAT)
param_bytes = sum(p.numel() * p.element_size() for p in sample_model.parameters())
saved = saved_bytes(
    lambda: torch.nn.functional.mse_loss(sample_model(inputs), targets), sample_model)
print(sample_model)
print(f"weights: {param_bytes / 2**20:.2f} MB; saved for backward: {saved}")
assert saved.activations > param_bytes

# %% [markdown]
# ## How we measure (and what the original blog got wrong)
#
# The ROCm blog this problem comes from timed each run with a context manager around the whole
# 512-step loop. It read the clock *before* synchronising the GPU (GPUs run asynchronously, so
# work still queued was left out), timed the first steps (where MIOpen searches for kernels) with
# the rest, kept one total (no spread), and called `1 - t_amp / t_fp32` = 46% a "speedup" (as a
# speedup, `t_fp32 / t_amp`, that is 1 / (1 - 0.46) = 1.85x).
#
# The course's timer synchronises the device before every clock read, leaves warm-up steps
# untimed and times every step. On a shared machine one more thing decides whether a comparison
# means anything: **when** each run is timed. Timed one after the other, fp32 and AMP see
# different loads. So the runs take turns, step by step (`interleave`):
#
# - each block runs `fp32, AMP, fp32 again, fp32 again, AMP, fp32` (rotated from block to
#   block), so a load that changes during the block hits every run alike. Per block, the ratio of
#   the step times; over the blocks, the median and its 90% interval;
# - **fp32 again** is an identical fp32 model, a control whose true answer is 1.00x. If it says
#   otherwise, or an interval is wider than half its median, no ratio is stated, and the line
#   says why and prints the answer recorded on a quiet machine like yours;
# - where the warm-up shows other programs holding the cores, each run gets one thread and is
#   read in CPU time (the answer is then per core): with all threads a step waits for its slowest
#   thread, and the load moves the ratio itself (on a busy 2-core Zen 3, 0.66x instead of 0.16x).
#
# Peak memory is read from PyTorch's caching allocator on GPUs, over one more step of each run
# with the peak reset before it. A CPU has no allocator counter, so we also count what AMP
# changes on every device: the bytes autograd **saves for backward**, split into activations
# (what AMP halves) and autocast's 16-bit copies of the weights (what AMP adds). The fp32 weights
# that backward also keeps exist in every mode, so they are left out (`saved_bytes`).

# %% [markdown]
# ## 1. The fp32 step
#
# A standard step: zero the gradients, forward, loss, backward, step. Adam with lr 1e-3, MSE loss.
# `fp32_run` builds a fresh, seeded model and returns the step that trains it.

# %%
loss_fn = torch.nn.MSELoss()


def fp32_run():
    torch.manual_seed(0)
    model = ConvModel(preset.hidden, preset.n_hidden_layers)
    model = model.to(info.device, memory_format=MEMORY_FORMAT)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    return {"model": model, "step": step, "losses": losses}


# %% [markdown]
# On NVIDIA Ampere and newer GPUs, "fp32" convolutions actually use **TF32** tensor cores unless
# TF32 is switched off; the baseline's name below says which one you measured, and
# `pdm run bench --strict-fp32` compares against true fp32 (`device.set_strict_fp32(True)` sets
# it for convolutions, RNNs and matmuls, legacy flags included: docs/benchmark.md):

# %%
print(f"torch {torch.__version__}: fp32_precision settings "
      f"{'available' if has_fp32_precision_api() else 'absent, allow_tf32 used'}; "
      f"TF32 allowed now: {tf32_state()}")

# %% [markdown]
# ## 2. The AMP step
#
# Three changes, each marked:
#
# 1. the forward pass and the loss run inside `torch.autocast`;
# 2. for **float16**, the loss is multiplied by a large factor before `backward()` so small
#    gradients do not flush to zero (`scaler.scale(loss)`), and `scaler.step` un-scales them,
#    skips the step if any is inf/NaN, and `scaler.update()` adapts the factor (lesson 02);
# 3. for **bfloat16**, which has fp32's range, no scaler is needed: `enabled=False` turns every
#    scaler call into a plain pass-through, so one step serves both.

# %%
def amp_run(amp_dtype):
    torch.manual_seed(0)
    model = ConvModel(preset.hidden, preset.n_hidden_layers)
    model = model.to(info.device, memory_format=MEMORY_FORMAT)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(info.type, enabled=info.needs_grad_scaler(amp_dtype))  # (2, 3)
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=info.type, dtype=amp_dtype):  # (1) forward + loss
            outputs = model(inputs)
            loss = loss_fn(outputs, targets)
        scaler.scale(loss).backward()  # (2) scaled loss -> scaled gradients
        scaler.step(optimizer)  # unscale, skip if inf/NaN, else optimizer.step()
        scaler.update()  # adapt the scale factor
        losses.append(loss.item())

    return {"model": model, "step": step, "losses": losses, "scaler": scaler.is_enabled(),
            "amp_dtype": amp_dtype}


# %% [markdown]
# ## 3. Training them side by side
#
# Every run trains the same number of steps from the same weights; `interleave` calls their
# steps in turn and times each one.

# %%
baseline_name = fp32_baseline(info)
control = f"{baseline_name} again"  # the same fp32 run built twice: compared, 1.00x
runs = {baseline_name: fp32_run(), control: fp32_run(),
        **{f"AMP {dtype_name(d)}": amp_run(d) for d in info.amp_dtypes}}
timed = interleave({name: r["step"] for name, r in runs.items()}, baseline_name, control,
                   info.device, blocks=preset.steps // 2, warmup=preset.warmup,
                   preset=preset.name)
print(f"timed in {timed.basis}" + (f" (torch threads: {timed.threads})" if timed.threads else ""))
for name, r in runs.items():
    r["timing"] = timed.timings[name]
    print(f"{name}{' (with GradScaler)' if r.get('scaler') else ''}: {r['timing']}")
if info.type == "cpu":  # identical twins on a CPU: the same losses, bit for bit
    assert runs[baseline_name]["losses"] == runs[control]["losses"]


# %%
def after_training(r):
    """What a run reports besides losses and times: the allocator peak over one more step (the
    peak reset before it), the bytes saved for backward by one forward + loss (under autocast
    for AMP), and the output image."""
    _, peak = step_peak(r["step"], info.device)
    model, amp_dtype = r["model"], r.get("amp_dtype")

    def forward_and_loss():
        with torch.autocast(device_type=info.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            loss_fn(model(inputs), targets)

    model.eval()
    with torch.inference_mode():
        prediction = model(inputs).float().cpu()
    model.train()
    return {"peak": peak, "saved": saved_bytes(forward_and_loss, model), "prediction": prediction}


for r in runs.values():
    r.update(after_training(r))
shown = {name: r for name, r in runs.items() if name != control}  # the control's job is done

# %% [markdown]
# ## 4. Results

# %%
base = runs[baseline_name]
comparisons = {c.name: c for c in timed.comparisons()}
results = pd.DataFrame({
    name: {
        **timing_columns(r["timing"], base["timing"], r["peak"], preset.name,
                         comparisons.get(name)),
        "saved activations (MB)": r["saved"].activations / 2**20,
        "cast weights (MB)": r["saved"].cast_weights / 2**20,
        "activations vs fp32": r["saved"].activations / base["saved"].activations,
        "final loss": r["losses"][-1],
    }
    for name, r in shown.items()
}).T
results.round(4)

# %% [markdown]
# What the table must show, whatever the device (checked): AMP keeps at most about half the
# activation bytes of fp32, and its loss falls just as fp32's does. Time is a measurement, not a
# rule: the sentence below states this run's ratio only where it can be trusted (see "How we
# measure"; never at `smoke`, whose steps are all overhead), else NaN in the table and pale bars.

# %%
for name, r in shown.items():
    assert r["losses"][-1] < r["losses"][0], f"{name}: the loss did not go down"
    assert torch.isfinite(torch.tensor(r["losses"])).all(), f"{name}: non-finite loss"
    if name != baseline_name:
        ratio = r["saved"].activations / base["saved"].activations
        limit = 1.3 if info.type == "mps" else 0.55  # MPS keeps BatchNorm in fp32: section 5
        assert ratio <= limit, f"{name} saved {ratio:.2f} of fp32's activation bytes"
        assert r["losses"][-1] < 2 * base["losses"][-1] + 0.01, f"{name} trained much worse"
print(f"On {info.name} ({info.backend}), preset {preset.name}:")
for c in comparisons.values():
    print(f"  {with_recorded(c, f'03 train {c.name.split()[-1]}', info)}\n    it kept "
          f"{results.loc[c.name, 'activations vs fp32']:.0%} of fp32's activation bytes")

# %% [markdown]
# ### When AMP adds memory
#
# This network's activations dwarf its weights. Turn that round: four 1024x1024 `Linear` layers
# on a batch of 2. In fp32, backward keeps the weights themselves, which exist anyway; under
# autocast it keeps 16-bit copies of them, new memory (three of four: the first layer's input
# needs no gradient). Halving two rows of activations is nothing beside 6 MB of copies. A batch
# of 1024 tips it back (activations grow with the batch, copies do not), and so do weights kept
# in bf16 themselves (lesson 15: then there is no copy).

# %%
wide = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to(info.device)
low = info.amp_dtypes[0]


def saved_by_wide(batch, amp):
    x = torch.randn(batch, 1024, device=info.device)
    with torch.autocast(info.type, dtype=low, enabled=amp):
        return saved_bytes(lambda: wide(x).sum(), wide)


for batch in (2, 1024):
    fp32_saved, amp_saved = saved_by_wide(batch, False), saved_by_wide(batch, True)
    print(f"batch {batch}:\n  fp32 {fp32_saved}\n  AMP {dtype_name(low)} {amp_saved}")
    assert amp_saved.cast_weights == 3 * 1024 * 1024 * low.itemsize  # independent of the batch
    assert (amp_saved.new > fp32_saved.new) == (batch == 2)  # more at batch 2, less at 1024

# %% [markdown]
# ### The ceiling: how much faster can a step get on this device?
#
# The ConvModel's 1x1 convolutions are matmuls over the pixels; the rest of a step (BatchNorm,
# ReLU, autocast's casts, the optimizer) is passes over memory. Roughly the most AMP can gain in
# a matmul-bound step is what a low-precision matmul gains over fp32 here, measured now
# (`matmul_ceiling`: n x n matmuls at two sizes, median GFLOP/s, quartile range in brackets; on
# CUDA the fp32 matmul uses TF32 where the baseline's convolutions do). On a 2-core EPYC Zen 4
# (AVX512-BF16) bf16 matmuls ran about 2.2x fp32 and this model trained 2.0x faster at `cpu`.
# Two cases get no ceiling, and the line says why: **bf16 emulated** (no AVX512-BF16 or AMX; the
# model's convolutions take another slow path than the timed matmul, so the model can beat its
# ratio), and **noisy timings** (a rate marked NOISY is left out). `pdm run bench` prints the
# same line for both course models.

# %%
from amp_tutorial.ceiling import SIZES, matmul_ceiling

ceiling = matmul_ceiling(info, SIZES[preset.name])
print("\n".join(ceiling.lines()))
for c in comparisons.values():
    dtype = c.name.split()[-1]  # "AMP bf16" -> "bf16"
    if dtype in ceiling.low_dtypes and c.stated:
        print(f"{c.name}: training {c.stated:.2f}x, {ceiling.describe(dtype, c.stated)}")
if info.type == "cpu" and info.native_bf16 is False and "bf16" in ceiling.low_dtypes:
    assert ceiling.ceiling("bf16") is None  # emulated: the ratio bounds nothing
    assert ceiling.best_ratio("bf16") < 1.5, "emulated bf16 matmuls should gain nothing real"

# %%
bars = {"time per step (ms)": results["time/step median (ms)"].to_dict(),
        "saved activations (MB)": results["saved activations (MB)"].to_dict()}
if info.has_allocator_stats:
    bars["peak memory (MB)"] = results["peak memory (MB)"].to_dict()
noise = Comparison.why_no_ratio(comparisons.values())  # why the bars give no ratio, or None
fig = plot_bars(bars, f"fp32 vs AMP training on {info.type} ({preset.name} preset); "
                "whiskers: ± half the IQR",
                errors={"time per step (ms)": results["time/step IQR (ms)"].div(2).to_dict()},
                noise={"time per step (ms)": noise})

# %%
fig = plot_losses({n: r["losses"] for n, r in shown.items()}, "Training loss, fp32 vs AMP")

# %% [markdown]
# Both curves should fall together: AMP changes how each step is computed, not what is learned.
# Finally, what each model predicts, next to the target:

# %%
predictions = {"target": targets, **{name: r["prediction"] for name, r in shown.items()}}
fig = plot_outputs(predictions, "Target and each run's prediction (same colour scale)")

# %% [markdown]
# ## 5. The same count under a GPU's autocast
#
# Which tensors autograd saves, and in which dtype, is autocast's decision, so it can be counted
# for a GPU on any machine: the model and the image are built as **fake** CUDA tensors (shapes and
# dtypes, no data) and run through PyTorch's own dispatcher with CUDA's autocast switched on
# (`saved_bytes_on`). **MPS differs**: its autocast keeps `batch_norm` in float32
# (`KERNEL_MPS(batch_norm, fp32)` in `aten/src/ATen/autocast_mode.cpp`), so there BatchNorm saves
# fp32 inputs next to the convolutions' 16-bit copies, and AMP saves *more* than fp32 for this
# network (about 1.24x, estimated by emulating that rule on a CPU). Autograd cannot run on fake
# MPS tensors in this torch build, so for MPS the dispatcher's registry is read instead.

# %%
from amp_tutorial.autocast_policy import fake_autograd_problem, saved_bytes_on


def build_model():
    torch.manual_seed(0)
    return ConvModel(preset.hidden, preset.n_hidden_layers)


def image_batch(device):
    return torch.rand(1, 2, preset.grid, preset.grid), torch.rand(1, 1, preset.grid, preset.grid)


# a CPU-only torch build has no fake CUDA autograd; torch 2.9's fake random init needs a driver
why_not = fake_autograd_problem("cuda")
if why_not is None:
    fake_cuda = {dtype_name(d): saved_bytes_on("cuda", build_model, image_batch, d).activations
                 for d in (None, torch.float16, torch.bfloat16)}
    print(f"activations saved under CUDA's autocast (fake tensors, preset {preset.name}): "
          + ", ".join(f"{k} {v / 2**20:.2f} MB" for k, v in fake_cuda.items()))
    for low in ("fp16", "bf16"):
        assert 0.45 < fake_cuda[low] / fake_cuda["fp32"] <= 0.55  # halved on CUDA and ROCm too
else:
    print(f"not counted here: {why_not}. A CUDA build of torch counts it without a GPU from "
          f"torch 2.11 on (2.9 needs a CUDA driver to initialise the fake weights).")

# %%
has_rule = {d: has_autocast_kernel("aten::batch_norm", d) for d in ("cpu", "cuda", "xpu", "mps")}
print(f"an autocast rule for batch_norm: {has_rule}")
assert has_rule == {"cpu": False, "cuda": False, "xpu": False, "mps": True}

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **Layout is not shape.** In "The problem", set `MEMORY_FORMAT = torch.contiguous_format`. The
#    printed shape is the same, but the cell's `channels_last` assert fails: the layout lives in
#    the strides (`inputs.stride()` is `(2048, 1024, 32, 1)` at `smoke`, `(2048, 1, 64, 2)` before).
# 2. **A GradScaler on bf16.** On a CPU (bf16), in section 2 replace
#    `enabled=info.needs_grad_scaler(amp_dtype)` with `enabled=True`. The run now says "with
#    GradScaler", and its losses are the same as without it, bit for bit (checked at `smoke` and
#    `cpu`): multiplying by 65536 and dividing again is exact, and bf16, with fp32's range, never
#    overflows here, so no step is skipped.
# 3. **Start the scale too high.** On the fp16 path (a GPU, or a CPU with
#    `AMP_TUTORIAL_DTYPE=float16`), pass `init_scale=2.0**30` to the `GradScaler` in section 2. Each
#    step that overflows is skipped and halves the scale, so the fp16 loss curve starts flat until
#    the scale is back near 2^16: at least 14 steps (2^30 / 2^16 is 14 halvings). At `smoke`, 17
#    steps in all, that is most of the run, and section 4's loss check may stop the lesson.

# %% [markdown]
# ## What to remember
#
# - AMP training is three changes: autocast around forward + loss, a GradScaler for fp16, and
#   `scaler.step` / `scaler.update` instead of `optimizer.step`.
# - Measure with warm-up, device synchronisation and per-step medians, and reset peak memory
#   between runs; name the baseline (TF32 or strict fp32).
# - AMP halves the activation memory on CPU, CUDA/ROCm and XPU (asserted above, here and under
#   CUDA's policy); on MPS, where BatchNorm stays fp32, this network saves more. It adds 16-bit
#   copies of the weights: where weights outweigh activations (large layers, a small batch), AMP
#   holds more than fp32. Time depends on the
#   hardware: measured at the `cpu` preset, bf16 trained 2.0x faster than fp32 on a 2-core EPYC
#   (Zen 4) with AVX512-BF16, of a 2.2x bf16 matmul ceiling there (docs/benchmark.md). And where
#   bf16 is only emulated (a CPU without AVX512-BF16 or AMX), fp32 is the fast choice and AMP runs
#   only to learn from. Your run's gain and ceiling are printed above.
#
# **Lesson 04** does the same comparison for inference.
