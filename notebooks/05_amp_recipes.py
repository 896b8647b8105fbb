# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 90
#     memory:
#       cpu: 75
#       paper: 158
#     minutes:
#       cpu: 0.3
#       small: 1.0
#       smoke: 0.2
#     needs: any device, CPU included
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
# # 05 · AMP recipes: one flag, accumulation, checkpoints, several models
#
# Lesson 03 wrote the basic AMP loop and lesson 04 served the trained model. Real training code
# needs a little more around that loop: a switch to turn AMP off, gradient accumulation,
# checkpoints that resume exactly, and several models or losses sharing one scaler. Each section
# below answers one of those questions with a short example that runs here and asserts what it
# claims. Lessons 07 (fp32 regions, custom losses and autograd functions, validation), 08
# (migrating old code, troubleshooting) and 11 (several processes with DDP) build on these
# recipes. Two graded exercises let you write the accumulation loop and the checkpoint yourself.
#
# Every example uses the device the course package picks: on a CPU, autocast runs in bfloat16 and
# needs no GradScaler; on NVIDIA and AMD GPUs, float16 with a GradScaler. Seeds are fixed
# (`torch.manual_seed`), so every run of this notebook starts from the same weights.

# %%
import tempfile
from pathlib import Path

import torch
from torch import nn

from amp_tutorial.checkpoint import load_checkpoint, save_checkpoint
from amp_tutorial.data import make_problem
from amp_tutorial.device import (
    device_line,
    dtype_name,
    fp32_baseline,
    select_device,
    tf32_in_use,
)
from amp_tutorial.exercises.accumulation import check_train_accumulated
from amp_tutorial.exercises.checkpoint_resume import check_save_and_load
from amp_tutorial.models import seeded_conv_model
from amp_tutorial.plots import plot_resume
from amp_tutorial.presets import get_preset

# %%
info = select_device()
preset = get_preset(device_type=info.type)
amp_dtype = info.amp_dtype
assert amp_dtype is not None, f"{info.device} has no usable AMP with this torch; try the CPU"
# Recipes are about correctness, not speed: at most a 128x128 image (a quarter of the cpu
# preset's) keeps every run short, also on CPUs that emulate bf16.
GRID = min(preset.grid, 128)
print(device_line(info, preset, sizes=f"grid {GRID}, hidden {preset.hidden}, {preset.steps} steps"))

# Bit-for-bit comparisons below need deterministic kernels; on GPUs, ask cuDNN for them.
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False

# %%
inputs, targets = make_problem(GRID, info.device)
loss_fn = nn.MSELoss()
scratch = tempfile.TemporaryDirectory(prefix="amp05_")  # removed when the kernel stops
work_dir = Path(scratch.name)  # the checkpoints go here


def new_model(seed: int = 0) -> nn.Module:
    """The lesson-03 model, freshly initialised from ``seed``."""
    return seeded_conv_model(preset, info.device, seed)


def same_parameters(a: nn.Module, b: nn.Module, buffers: bool = True) -> bool:
    """True when every parameter (and buffer: BatchNorm's running statistics) is bit-identical."""
    sa, sb = (a.state_dict(), b.state_dict()) if buffers else (
        dict(a.named_parameters()), dict(b.named_parameters()))
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# %% [markdown]
# ## 1. One loop, one flag: `enabled=`
#
# `torch.autocast` and `torch.amp.GradScaler` both take `enabled=`. With `enabled=False`,
# autocast does nothing and every scaler call passes straight through (`scale(loss)` returns the
# loss, `step` calls `optimizer.step()`, `update` does nothing). So a single loop serves fp32 and
# AMP runs, and a command-line flag can switch between them. The scaler is only switched on where
# the dtype needs one (float16).

# %%
def train(use_amp: bool, steps: int = preset.steps) -> tuple[nn.Module, list[float]]:
    model = new_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(info.type, enabled=use_amp and info.needs_grad_scaler(amp_dtype))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return model, losses


# %%
def train_plain_fp32(steps: int = preset.steps) -> nn.Module:
    """The same training without any AMP code at all, as a reference."""
    model = new_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
    return model


fp32_model, fp32_losses = train(use_amp=False)
amp_model, amp_losses = train(use_amp=True)
print(f"fp32: loss {fp32_losses[0]:.4f} -> {fp32_losses[-1]:.4f}")
print(f"AMP ({dtype_name(amp_dtype)}): loss {amp_losses[0]:.4f} -> {amp_losses[-1]:.4f}")

assert same_parameters(fp32_model, train_plain_fp32())  # enabled=False is exactly plain fp32
assert not same_parameters(fp32_model, amp_model)  # AMP computes differently...
assert amp_losses[-1] < amp_losses[0] and abs(amp_losses[-1] - fp32_losses[-1]) < 0.05  # ...as well

# %% [markdown]
# ## 2. Gradient accumulation with a scaler
#
# To train with a batch larger than memory allows, run several micro-batches and add up their
# gradients before one optimizer step. With AMP, three rules:
#
# - divide each micro-batch loss by the number of micro-batches, so the sum is the mean;
# - `scaler.scale(loss).backward()` for every micro-batch: all of them use the same scale, so the
#   accumulated gradient is consistently scaled;
# - `scaler.step` and `scaler.update` once per optimizer step, not per micro-batch (the scale must
#   not change in the middle of an accumulation).
#
# Here the image's rows are cut into 4 micro-batches. BatchNorm computes its statistics per batch,
# so a model with BatchNorm does not give the same gradient for 4 small batches as for one large
# one; to check the equivalence we use the same network without BatchNorm.

# %%
ACCUMULATION = 4


def model_without_batchnorm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, preset.hidden, 1), nn.ReLU(),
                         nn.Conv2d(preset.hidden, 1, 1)).to(info.device)


# %%
def accumulated_gradients(use_amp: bool, n_micro: int) -> list[torch.Tensor]:
    """One optimizer step from ``n_micro`` micro-batches; returns the unscaled gradients."""
    model = model_without_batchnorm()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    # init_scale: the default 2**16 overflows fp16 on this first step at the paper size (scaled
    # gradients past 65504: step() would skip it, lesson 02); a smaller start leaves one to compare.
    scaler = torch.amp.GradScaler(info.type, init_scale=2.0**10,
                                  enabled=use_amp and info.needs_grad_scaler(amp_dtype))
    optimizer.zero_grad(set_to_none=True)
    for x, y in zip(inputs.chunk(n_micro, dim=2), targets.chunk(n_micro, dim=2), strict=True):
        with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
            loss = loss_fn(model(x), y) / n_micro
        scaler.scale(loss).backward()  # gradients add up in .grad
    scaler.unscale_(optimizer)  # only so we can look at them; step() would do it anyway
    gradients = [p.grad.clone() for p in model.parameters()]
    assert all(g.isfinite().all() for g in gradients), "overflow: this step would be skipped"
    scaler.step(optimizer)  # once per accumulation
    scaler.update()
    return gradients

# %%
def relative_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    flat_a, flat_b = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
    return ((flat_a - flat_b).norm() / flat_b.norm()).item()


fp32_tolerance = 1e-3 if tf32_in_use(info) else 1e-5  # TF32: 10 mantissa bits, fp32: 23
for use_amp in (False, True):
    diff = relative_difference(accumulated_gradients(use_amp, ACCUMULATION),
                               accumulated_gradients(use_amp, 1))
    label = dtype_name(amp_dtype) if use_amp else fp32_baseline(info)
    print(f"{label}: {ACCUMULATION} accumulated micro-batches vs one batch, "
          f"relative gradient difference {diff:.2e}")
    assert diff < (2e-2 if use_amp else fp32_tolerance)

# %% [markdown]
# In fp32 the two agree to rounding error (TF32's where convolutions run in TF32, lesson 03: 1.3e-4
# on an H100); under AMP to the precision of the low-precision arithmetic, as AMP changes anyway.
#
# ### Exercise: write the accumulation loop
#
# `train_accumulated(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps,
# device_type, amp_dtype, max_grad_norm=None)` steps once per group of `accumulation_steps`
# micro-batches, in order; a shorter last group steps too. Each step's gradient is that of its
# group as one batch (divide by the group's size), clipped to `max_grad_norm` if given. Use the
# `scaler` passed in (disabled for bfloat16) and return one float per step: the group's mean
# loss. The checker runs your function beside a right answer (CPU, float16 and bfloat16, counts
# that do not always divide) and compares the results; where they differ, it names the mistake.

# %% tags=["exercise"] solution="train_accumulated.py"
# YOUR CODE: replace the body of this function, run this cell, then the checker below.
def train_accumulated(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps,
                      device_type, amp_dtype, max_grad_norm=None):
    """One optimizer step per group of micro-batches; return each step's (mean) loss."""
    raise NotImplementedError(
        "Per group: zero the gradients; per micro-batch: the forward and loss / len(group) under "
        "autocast, then scaler.scale(...).backward(); after the group's last micro-batch: "
        "unscale_ and clip if asked, scaler.step(optimizer), scaler.update().")


# %%
result = check_train_accumulated(train_accumulated)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# ## 3. Checkpoints: save and resume model, optimizer and scaler together
#
# A run resumed from a checkpoint should continue exactly as if it had never stopped. That needs
# everything that influences the next step:
#
# - the model's `state_dict()` (parameters **and** buffers such as BatchNorm's running statistics),
# - the optimizer's (Adam's moment estimates and step count),
# - the scaler's (current scale and how many good steps since it last grew): without it a
#   resumed fp16 run starts over at the initial scale and overflows again while it re-learns it,
# - whatever draws the data, here a seeded `torch.Generator` that picks each step's rows.
#
# `save_checkpoint` and `load_checkpoint` from `amp_tutorial.checkpoint` store the first three
# and any extra values you pass. In this section the scaler is switched on on every device, even
# for bfloat16 (harmless: multiplying by a power of two and dividing again is exact), so that it
# really has state to carry; a small `growth_interval` makes the scale change within a few steps.

# %%
def start_run(seed: int = 0) -> dict:
    model = new_model(seed)
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "scaler": torch.amp.GradScaler(info.type, init_scale=2.0**10, growth_interval=3),
        "data": torch.Generator().manual_seed(1),  # picks the rows of each step's batch
    }


# %%
def train_steps(run: dict, n: int, use_amp: bool = True) -> list[float]:
    model, optimizer, scaler = run["model"], run["optimizer"], run["scaler"]
    losses = []
    for _ in range(n):
        rows = torch.randperm(GRID, generator=run["data"])[: GRID // 4].to(info.device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
            loss = loss_fn(model(inputs[:, :, rows]), targets[:, :, rows])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


# %%
HALF = preset.steps // 2
uninterrupted = start_run()
straight = train_steps(uninterrupted, 2 * HALF)  # the loss of every step

first_half = start_run()
train_steps(first_half, HALF)
checkpoint = save_checkpoint(work_dir / "amp.pt", first_half["model"], first_half["optimizer"],
                             first_half["scaler"], step=HALF,
                             data_rng=first_half["data"].get_state())

resumed = start_run(seed=123)  # different initial weights: everything must come from the file
extra = load_checkpoint(checkpoint, resumed["model"], resumed["optimizer"], resumed["scaler"])
resumed["data"].set_state(extra["data_rng"])
after_resume = train_steps(resumed, 2 * HALF - extra["step"])

print(f"scale after {2 * HALF} steps: uninterrupted {uninterrupted['scaler'].get_scale():.0f}, "
      f"resumed {resumed['scaler'].get_scale():.0f}")
assert same_parameters(resumed["model"], uninterrupted["model"])  # bit for bit
assert resumed["scaler"].get_scale() == uninterrupted["scaler"].get_scale()
assert resumed["scaler"].get_scale() > 2.0**10  # the scale did change during the run

# %% [markdown]
# What goes wrong when part of the state is missing: resume without the scaler's state and the
# scale restarts from its initial value; resume without the data generator's state and the second
# half trains on different batches. In the figure the resumed run (dashed) lies exactly on the
# straight-through run, its difference (right) flat at 0; without the data state it is not.

# %%
no_scaler = start_run(seed=123)
load_checkpoint(checkpoint, no_scaler["model"], no_scaler["optimizer"])
no_scaler["data"].set_state(extra["data_rng"])
saved_scale = first_half["scaler"].get_scale()
print(f"resumed without the scaler's state: scale {no_scaler['scaler'].get_scale():.0f}, "
      f"saved {saved_scale:.0f}")
assert no_scaler["scaler"].get_scale() == 2.0**10 != saved_scale  # back to the initial scale
train_steps(no_scaler, 2 * HALF - extra["step"])

no_data_state = start_run(seed=123)
load_checkpoint(checkpoint, no_data_state["model"], no_data_state["optimizer"],
                no_data_state["scaler"])
other_batches = train_steps(no_data_state, 2 * HALF - extra["step"])
assert not same_parameters(no_data_state["model"], uninterrupted["model"])
assert after_resume == straight[HALF:] != other_batches  # equal bit for bit; not without data
runs = {"resumed from the checkpoint": after_resume, "resumed, no data state": other_batches}
fig = plot_resume(straight, runs, HALF, amp_dtype, ylabel="MSE loss")  # loss_fn: nn.MSELoss()

# %% [markdown]
# ### Exercise: write `save` and `load`
#
# `save(path, model, optimizer, scaler, step)` writes a checkpoint to `path` (a `pathlib.Path`;
# files beside it are fine, JSON too; `torch.load` must read its files with `weights_only=True`);
# `load(path, model, optimizer, scaler)` restores it into the objects it is given and returns the
# step. The checker trains a BatchNorm network on the CPU (fp16 with a GradScaler that skipped
# steps, bf16 with a disabled one; Adam, SGD; a decaying lr), saves, loads into fresh objects,
# trains on, and compares bit for bit with a run that never stopped (scale after every step too).

# %% tags=["exercise"] solution="save_and_load.py"
# YOUR CODE: replace both bodies, run this cell, then the checker below.
def save(path, model, optimizer, scaler, step):
    """Write everything the next training step depends on to ``path``."""
    raise NotImplementedError("torch.save one dict: the three state_dict()s and the step.")


def load(path, model, optimizer, scaler):
    """Restore the checkpoint at ``path`` into the objects given; return the saved step."""
    raise NotImplementedError("torch.load it, load_state_dict into each object, return the step.")


# %%
result = check_save_and_load(save, load)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# ### fp32 checkpoint, AMP resume, and back
#
# AMP never changes the stored weights: they stay fp32, and autocast only casts copies inside the
# forward pass. So checkpoints move freely between fp32 and AMP training. A disabled scaler has no
# state (`state_dict()` is `{}`); `load_checkpoint` then leaves the resuming run's scaler at its
# initial scale, and a run without a scaler ignores a saved scale.

# %%
fp32_run = start_run()
fp32_run["scaler"] = torch.amp.GradScaler(info.type, enabled=False)
fp32_losses = train_steps(fp32_run, HALF, use_amp=False)
assert fp32_run["scaler"].state_dict() == {}
save_checkpoint(work_dir / "fp32.pt", fp32_run["model"], fp32_run["optimizer"],
                fp32_run["scaler"], step=HALF, data_rng=fp32_run["data"].get_state())

amp_run = start_run(seed=123)  # an enabled scaler at its initial scale, 2**10
extra = load_checkpoint(work_dir / "fp32.pt", amp_run["model"], amp_run["optimizer"],
                        amp_run["scaler"])
amp_run["data"].set_state(extra["data_rng"])
assert amp_run["scaler"].get_scale() == 2.0**10  # nothing to restore: initial scale
assert same_parameters(amp_run["model"], fp32_run["model"])
amp_losses = train_steps(amp_run, HALF, use_amp=True)
mixed = save_checkpoint(work_dir / "amp_from_fp32.pt", amp_run["model"], amp_run["optimizer"],
                        amp_run["scaler"], step=2 * HALF)

# %%
back_to_fp32 = start_run(seed=7)
back_to_fp32["scaler"] = torch.amp.GradScaler(info.type, enabled=False)
load_checkpoint(mixed, back_to_fp32["model"], back_to_fp32["optimizer"], back_to_fp32["scaler"])
assert same_parameters(back_to_fp32["model"], amp_run["model"])
print(f"fp32 steps: loss {fp32_losses[0]:.4f} -> {fp32_losses[-1]:.4f}; resumed with AMP: "
      f"{amp_losses[0]:.4f} -> {amp_losses[-1]:.4f} (each step a new batch: losses move a little)")
assert abs(amp_losses[0] - fp32_losses[-1]) < abs(amp_losses[0] - fp32_losses[0])  # carried on

# %% [markdown]
# ## 4. Several models, losses and optimizers, one scaler
#
# One GradScaler serves any number of models and optimizers (GANs, an encoder with its own
# optimizer, auxiliary heads):
#
# - scale each loss with the same scaler and call `backward` on each (or on their sum);
# - `scaler.step(opt)` for each optimizer: each one checks **its own** gradients for inf/NaN
#   and is skipped on its own;
# - `scaler.update()` **once** per iteration, after all the steps: if any optimizer saw inf/NaN,
#   the scale is lowered (once).
#
# Below, two models learn the target and its complement. We plant an inf in the second model's
# gradient, as an fp16 overflow would: only the second optimizer skips its step, and the scale is
# halved. The scaler is switched on on every device so its bookkeeping is visible.

# %%
model_a, model_b = new_model(0), new_model(1)
opt_a = torch.optim.Adam(model_a.parameters(), lr=1e-3)
opt_b = torch.optim.Adam(model_b.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(info.type, init_scale=2.0**10)
before_a, before_b = new_model(0), new_model(1)  # copies of the starting weights

for opt in (opt_a, opt_b):
    opt.zero_grad(set_to_none=True)
with torch.autocast(info.type, dtype=amp_dtype):
    loss_a = loss_fn(model_a(inputs), targets)
    loss_b = loss_fn(model_b(inputs), 1 - targets)
scaler.scale(loss_a).backward()
scaler.scale(loss_b).backward()
with torch.no_grad():
    model_b.layers[0].weight.grad[0, 0] = float("inf")  # simulate an overflow in model b only
scaler.step(opt_a)
scaler.step(opt_b)
scaler.update()

# %%
stepped_a = not same_parameters(model_a, before_a, buffers=False)
stepped_b = not same_parameters(model_b, before_b, buffers=False)
print(f"model a stepped: {stepped_a}; model b stepped: {stepped_b}; "
      f"scale {2.0**10:.0f} -> {scaler.get_scale():.0f}")
assert stepped_a and not stepped_b
assert scaler.get_scale() == 2.0**9

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# Measured on a CPU at `smoke` and `cpu`, in both dtype modes.
#
# 1. **Forget to divide.** In `accumulated_gradients`, delete `/ n_micro`. The fp32 row's relative
#    difference jumps from 1.2e-07 to 3.00e+00 (at `smoke`) and its assert stops the cell: four
#    micro-batch means add up to four times the batch's mean, and (4g - g) / g = 3.
# 2. **Unscale per micro-batch.** In the same function, indent `scaler.unscale_(optimizer)` into the
#    loop, as if to clip after every backward. In fp16 mode the AMP row raises
#    `RuntimeError: unscale_() has already been called on this optimizer since the last update()` at
#    the second micro-batch: a clip goes once per step, after the last micro-batch. In bf16 mode
#    nothing changes: the scaler is disabled, and its `unscale_` returns at once.
# 3. **A default scaler on resume.** After `resumed = start_run(seed=123)`, add
#    `resumed["scaler"] = torch.amp.GradScaler(info.type)`. Every assert still passes, with the same
#    final scale (16384 at `smoke`): loading the checkpoint replaces the constructor's 2^16 and
#    `growth_interval=2000` with the saved scale, growth and backoff factors, `growth_interval=3`
#    and count of good steps.

# %% [markdown]
# ## What to remember
#
# - `enabled=` on autocast and GradScaler gives one loop for fp32 and AMP.
# - Accumulate gradients with scaled micro-batch losses; `step` and `update` once per step.
# - Checkpoint model, optimizer **and** scaler (and your data order); fp32 and AMP checkpoints
#   are interchangeable because weights stay fp32.
# - One scaler for many models and optimizers: `step` each, `update` once.
#
# Next: lesson 06 is the exercise, where you write this loop yourself.
