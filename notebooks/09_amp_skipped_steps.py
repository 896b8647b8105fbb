# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 20
#     memory:
#       cpu: 146
#       paper: 1030
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.2
#     needs: any device, CPU included
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
# # 09 · Skipped steps: why GradScaler skips float16 steps, and what its scale tells you
#
# Lesson 02 showed what the GradScaler does and lesson 03 put it in a training loop. Once such a
# loop runs, the questions people ask most are about the steps it skips: why the first float16
# steps are skipped, where the warning "Detected call of `lr_scheduler.step()` before
# `optimizer.step()`" comes from, how to notice a skipped step, how to log the scale, and what a
# collapsing scale means. Each is answered by a cell that shows the behaviour on this machine and
# asserts it. (Lesson 10 covers the calls autocast itself leaves alone.)
#
# float16 with a GradScaler runs on the GPU where there is one, and on the CPU otherwise (CPU
# autocast accepts float16, and `torch.amp.GradScaler("cpu")` exists; lesson 02 uses the same
# setup). Seeds are fixed (`torch.manual_seed(0)`), so each run starts from the same weights.

# %%
import warnings

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from IPython.display import display

from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, select_device
from amp_tutorial.gradients import snapshot, update_norm
from amp_tutorial.models import ConvModel
from amp_tutorial.plots import plot_scale_history
from amp_tutorial.presets import fp16_width, get_preset

info = select_device()
preset = get_preset(device_type=info.type)
torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset))

# %%
fp16_device = info.device if torch.float16 in info.amp_dtypes or info.type == "cpu" else (
    torch.device("cpu"))
hidden = fp16_width(preset, fp16_device.type)  # see lesson 02
inputs, targets = make_problem(preset.grid, fp16_device)
print(f"float16 + GradScaler run on {fp16_device}; network width {hidden}")


def new_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights every time
    return ConvModel(hidden, preset.n_hidden_layers).to(fp16_device)


# %% [markdown]
# ## 1. Skipped steps and learning-rate schedulers
#
# `GradScaler` starts at a scale of 2^16 = 65536 on purpose: too large is cheap (the step is
# skipped and the scale halves), too small would flush gradients for thousands of steps. So the
# first step or two of a float16 run are often skipped. A skipped step means `scaler.step` does
# **not** call `optimizer.step()`. A learning-rate scheduler that is stepped every iteration
# notices: on its first `scheduler.step()` it checks whether `optimizer.step()` has run yet, and
# warns if not (`torch/optim/lr_scheduler.py`). That is the famous warning; it does not mean
# your loop is in the wrong order.
#
# `train_with_scheduler` below is a normal AMP loop with a scheduler. Per step it logs the scale
# the step used, whether the step was skipped, and the learning rate. A skipped step is detected
# from the scale, without looking at the gradients: `scaler.update()` lowers it only after a
# skipped step. (If the first step does not overflow by itself on this device and size, the loop
# puts an inf into one gradient at step 0, as an overflow would.)

# %%
N_STEPS = 8


def amp_step(model, optimizer, scaler, step: int) -> dict:
    """One fp16 AMP step; returns what the log records about it."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(fp16_device.type, dtype=torch.float16):
        loss = F.mse_loss(model(inputs), targets)
    scaler.scale(loss).backward()
    overflowed = not all(torch.isfinite(p.grad).all() for p in model.parameters())
    if step == 0 and not overflowed:
        next(model.parameters()).grad.view(-1)[0] = float("inf")  # an overflow, forced
    scale_used = scaler.get_scale()
    before = snapshot(model.parameters())
    scaler.step(optimizer)
    scaler.update()
    skipped = scaler.get_scale() < scale_used  # the scale went down: the step was skipped
    return {"step": step, "scale used": scale_used, "skipped": skipped,
            "weights moved": update_norm(before, model.parameters()) > 0,
            "natural overflow": overflowed, "lr of the step": optimizer.param_groups[0]["lr"]}


# %%
def train_with_scheduler(step_scheduler_when_skipped: bool) -> tuple[pd.DataFrame, list[str]]:
    """fp16 AMP training with a StepLR scheduler; returns the per-step log and the warnings."""
    model = new_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    scaler = torch.amp.GradScaler(fp16_device.type)  # default init_scale: 65536
    log = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(N_STEPS):
            log.append(amp_step(model, optimizer, scaler, step))
            if step_scheduler_when_skipped or not log[-1]["skipped"]:
                scheduler.step()
    return pd.DataFrame(log).set_index("step"), [str(w.message) for w in caught]


# %%
naive_log, naive_warnings = train_with_scheduler(step_scheduler_when_skipped=True)
display(naive_log)
for message in naive_warnings:
    print("warning:", message[:110], "...")

# %%
SCHEDULER_WARNING = "Detected call of `lr_scheduler.step()` before `optimizer.step()`"
assert naive_log.loc[0, "skipped"]  # the first step was skipped ...
assert any(SCHEDULER_WARNING in m for m in naive_warnings)  # ... so the scheduler warned
assert (naive_log["skipped"] != naive_log["weights moved"]).all()  # scale down <=> no update
n_skipped = int(naive_log["skipped"].sum())
print(f"{n_skipped} of {N_STEPS} steps skipped; first step's overflow was "
      f"{'natural' if naive_log.loc[0, 'natural overflow'] else 'forced'}")

# %% [markdown]
# The warning is the scheduler's, and here it is mostly harmless: the schedule simply runs
# `n_skipped` steps ahead of the weights, because it also counted the steps that did nothing.
# For a long cosine or step schedule that is noise. Where the first steps matter (a short
# warm-up), step the scheduler only when the optimizer really stepped, which the scale tells you:

# %%
fixed_log, fixed_warnings = train_with_scheduler(step_scheduler_when_skipped=False)
assert not any(SCHEDULER_WARNING in m for m in fixed_warnings)
real_steps = (~fixed_log["skipped"]).cumsum()  # optimizer steps taken so far
lr_expected = 1e-3 * 0.9 ** (real_steps - (~fixed_log["skipped"]).astype(int))
assert np.allclose(fixed_log["lr of the step"], lr_expected)  # the lr follows real steps only
print(fixed_log[["scale used", "skipped", "lr of the step"]].to_string())
# one read per step is enough: the scale a step used is the one the previous update left
used = fixed_log["scale used"].to_numpy()
assert ((used[1:] < used[:-1]) == fixed_log["skipped"].to_numpy()[:-1]).all()

# %% [markdown]
# That rule is not free on a GPU: `scaler.get_scale()` returns `scale.item()`, a CPU-GPU sync
# that waits for the queued kernels, and `amp_step` calls it twice per step. `scaler.step` waits
# once more with an optimizer like this Adam (not fused): it reads `found_inf` with `.item()` to
# decide whether to step (`_maybe_opt_step` in `torch/amp/grad_scaler.py`); a `fused=True`
# optimizer takes the flag on the device instead (`_step_supports_amp_scaling`). Keep the value
# read after the last `update()` and compare it with the next one: one read of the scale per step,
# as the assert above shows is enough, which saves one sync of the three (this demo's own overflow
# check and `update_norm` add more; a real loop has neither).
#
# The `scale used` column is also the thing to **log** in a real run (next to the loss, every N
# steps, which is also when to pay for the sync). A healthy float16 run backs off a few times at
# the start, then holds or slowly grows (by 2x after `growth_interval`, 2000 good steps in a
# row). Skips are rare, isolated, and the scale settles far above 1.
#
# ## 2. A collapsing scale
#
# A scale that keeps falling is the signature of a different problem: the forward pass produces
# inf or NaN at **every** step, so every step is skipped and the scale halves each time. Here the
# inputs are not normalised (multiplied by 10^5), so float16 activations overflow (float16's
# largest value is 65504). Beside it, the same model and steps on the normal inputs:

# %%
COLLAPSE_STEPS = 30
small_inputs, small_targets = make_problem(32, fp16_device)


def scale_history(batch: torch.Tensor) -> tuple[list[float], list[bool], float]:
    """fp16 AMP steps from seed-0 weights: scale at start and after each update(), finite losses."""
    model = new_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(fp16_device.type)
    start = snapshot(model.parameters())
    scales, finite = [scaler.get_scale()], []
    for _ in range(COLLAPSE_STEPS):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(fp16_device.type, dtype=torch.float16):
            loss = F.mse_loss(model(batch), small_targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())  # after update(): the scale the next step will use
        finite.append(bool(torch.isfinite(loss)))
    return scales, finite, update_norm(start, model.parameters())


healthy, healthy_finite, _ = scale_history(small_inputs)
scales, finite_losses, moved = scale_history(small_inputs * 1e5)  # un-normalised data

# %%
print(f"scale after {COLLAPSE_STEPS} steps: {scales[-1]:.3g} (healthy run: {healthy[-1]:g}); "
      f"finite losses: {sum(finite_losses)} (healthy run: {sum(healthy_finite)})")
assert not any(finite_losses)  # the loss itself is not finite: a forward-pass problem
assert scales[-1] == 2.0**16 * 0.5**COLLAPSE_STEPS < 1e-4  # halved at every single step
assert moved == 0.0  # and the model never trained
assert all(healthy_finite) and healthy[-1] >= 2.0**10  # same steps, normal inputs: it settles
fig = plot_scale_history({"healthy run (normal inputs)": healthy,
                          "collapsing run (inf in every forward pass)": scales},
                         "GradScaler scale after each update(), same model and steps")

# %% [markdown]
# Both runs start from the same weights and take the same steps; each point is `scaler.get_scale()`
# read right after that step's `update()`, and a red dot marks a skipped step. Lowering the scale
# can fix an overflow **in the gradients**; it cannot fix an inf in the **loss**, which is
# computed before any scaling. So: if `scaler.get_scale()` falls below
# about 1 and keeps falling, stop and look at the forward pass (lesson 08's "The loss is inf or
# NaN" section finds the first module that produced it); typical causes are unnormalised inputs,
# a large logit exponentiated in float16, or a division by a tiny number. Checking
# `torch.isfinite(loss)` each step catches it on the first step instead of the hundredth.

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# The numbers were measured on a CPU; a GPU's fp16 follows the same rules with its own gradients.
#
# 1. **Start higher.** In `train_with_scheduler`, pass `init_scale=2.0**20` to the `GradScaler`.
#    The first steps now overflow by themselves ("natural overflow" True), each is skipped and
#    halves the scale: 4 of 8 at `smoke` (down to 65536), 5 at `cpu` (down to 32768). In the fixed
#    run the learning rate stays 0.001 through the first step that really ran.
# 2. **Grow sooner.** Pass `growth_interval=2` there instead. After two good steps the scale
#    doubles: back to 65536 at step 3, then 131072 at step 5, which overflows, is skipped and halves
#    again (2 of 8 skipped, at `smoke` and `cpu`). A real run tries this doubling after every
#    2000 good steps (the default `growth_interval`).
# 3. **Inputs in range.** In section 2, change `small_inputs * 1e5` to `small_inputs * 1e4`. All 30
#    losses are finite and the scale holds (65536 at `smoke`, 32768 at `cpu` after one early skip),
#    so the cell's asserts fail: without an inf in the forward pass, nothing collapses.

# %% [markdown]
# ## What to remember
#
# - The first float16 steps are often skipped while the scale finds its level; a scheduler
#   stepped every iteration then warns "Detected call of `lr_scheduler.step()` before
#   `optimizer.step()`". Usually harmless; to keep the schedule aligned, step it only when
#   `scaler.get_scale()` did not go down (one read per step: on a GPU each is a CPU-GPU sync).
# - Log `scaler.get_scale()`. A few early drops are normal; a scale that keeps halving means the
#   forward pass makes inf/NaN every step: check `torch.isfinite(loss)` and fix the cause.
