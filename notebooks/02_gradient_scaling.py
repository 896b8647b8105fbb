# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 65
#     memory:
#       cpu: 846
#       paper: 6741
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.2
#     needs: any device, CPU included; fp16 gradients are measured on the GPU where
#       there is one
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
# # 02 · Gradient scaling: why fp16 gradients vanish, and how GradScaler saves them
#
# Lesson 01 showed that fp16 rounds values below about 3e-8 (half its smallest subnormal, 2^-24,
# about 6e-8) to zero. Here it hits a real network's gradients, and `torch.amp.GradScaler` fixes it:
#
# 1. measure the problem: how many of the course model's fp16 gradients become zero or subnormal;
# 2. walk through one scaler step by hand: scale, backward, unscale, check, step or skip, update;
# 3. watch the scale over many steps, with an inf injected on purpose;
# 4. clip the right way, see what clipping scaled gradients does to SGD and Adam, write the step;
# 5. see that bfloat16 needs none of this.
#
# GradScaler matters for **float16**, the default autocast dtype on CUDA and ROCm GPUs. Without a
# GPU this lesson computes real fp16 gradients on the CPU (CPU autocast takes `dtype=torch.float16`
# and `torch.amp.GradScaler("cpu")` exists), in a network at most 16 channels wide
# (`fp16_width`), as most CPUs lack fast fp16 arithmetic: the gradient magnitudes depend on the loss
# and the image size, not on the width. Fixed seeds (`torch.manual_seed(0)`) give each run the same
# weights; asserts check every claim.

# %%
import numpy as np
import pandas as pd
import torch
from IPython.display import display
from tqdm.auto import tqdm

from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, select_device
from amp_tutorial.exercises.fp16_step import check_fp16_step
from amp_tutorial.gradients import activation_grads, grad_norm, snapshot, update_norm, zero_fraction
from amp_tutorial.models import ConvModel
from amp_tutorial.plots import plot_gradient_magnitudes, plot_losses, plot_scale_history
from amp_tutorial.presets import fp16_width, get_preset

info = select_device()
preset = get_preset(device_type=info.type)
print(device_line(info, preset))

# %%
fp16_ok_here = torch.float16 in info.amp_dtypes or info.type == "cpu"
fp16_device = info.device if fp16_ok_here else torch.device("cpu")
bf16_device = info.device if torch.bfloat16 in info.amp_dtypes else torch.device("cpu")
hidden = fp16_width(preset, fp16_device.type)
print(f"fp16 runs on {fp16_device}, bf16 on {bf16_device}; network width {hidden}")

FP16 = torch.finfo(torch.float16)
SMALLEST_NORMAL = FP16.smallest_normal  # 2^-14, about 6.1e-5
SMALLEST_SUBNORMAL = FP16.smallest_normal * FP16.eps  # 2^-24, about 6.0e-8
print(f"fp16 smallest normal {SMALLEST_NORMAL:.3g}, smallest subnormal {SMALLEST_SUBNORMAL:.3g}")
assert SMALLEST_SUBNORMAL == 2.0**-24  # below half of it fp16 rounds to 0, just above to 2^-24:
assert torch.tensor(0.49 * SMALLEST_SUBNORMAL, dtype=torch.float16).item() == 0.0
assert torch.tensor(0.51 * SMALLEST_SUBNORMAL, dtype=torch.float16).item() == SMALLEST_SUBNORMAL


def new_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights every time
    return ConvModel(hidden, preset.n_hidden_layers).to(device)


# %% [markdown]
# ## 1. The problem: fp16 gradients flush to zero
#
# Under a *mean* squared error over all pixels, each pixel's activation gets a gradient of about
# `2 * error / number_of_pixels`: the larger the image (or batch), the smaller. On a 256x256 image
# (512x512 at `paper`), `activation_grads` (from `amp_tutorial.gradients`) runs a forward under
# autocast in the given dtype and `backward()` on the loss times `loss_scale`; it returns each
# convolution's output gradient as computed (fp16 under fp16 autocast) and divided by `loss_scale`
# in fp32, as GradScaler does.

# %%
underflow_grid = max(preset.grid, 256)
demo_inputs, demo_targets = make_problem(underflow_grid, fp16_device)
model = new_model(fp16_device)
true_grads = activation_grads(model, demo_inputs, demo_targets)[1].cpu()
fp16_raw, fp16_grads = activation_grads(model, demo_inputs, demo_targets, torch.float16)
SCALE = 2.0**16  # GradScaler's default initial scale
scaled_raw, scaled_grads = activation_grads(model, demo_inputs, demo_targets, torch.float16, SCALE)
print(f"dtype of the gradients as computed: fp16 run {fp16_raw.dtype}, fp32 run {true_grads.dtype}")
assert fp16_raw.dtype == torch.float16

flushed = pd.DataFrame({
    "fp32 (reference)": {"exactly zero": zero_fraction(true_grads)},
    "fp16, no scaling": {"exactly zero": zero_fraction(fp16_raw)},
    f"fp16, loss x 2^{int(np.log2(SCALE))}": {"exactly zero": zero_fraction(scaled_raw)},
}).T
flushed["below fp16 normal"] = [((g.abs() < SMALLEST_NORMAL) & (g != 0)).float().mean().item()
                                for g in (true_grads, fp16_raw.float(), scaled_raw.float())]
print(flushed.to_string(float_format=lambda v: f"{v:.2%}"))
assert zero_fraction(fp16_raw) > zero_fraction(true_grads)  # fp16 loses gradients fp32 keeps
assert zero_fraction(scaled_raw) < zero_fraction(fp16_raw)  # scaling rescues them
assert flushed["below fp16 normal"].iloc[2] < flushed["below fp16 normal"].iloc[1]

# %% [markdown]
# Two losses: gradients flushed to exactly zero, and ones kept only as **subnormals** (below 2^-14
# fp16 has fewer than its 11 significant bits, down to one at 2^-24); after scaling, almost none are
# in either group. The histogram shows the true gradients and their scaled copies over fp16's bands:
# below 2^-25 (half the smallest subnormal, about 3e-8, shaded red) they become 0 in fp16; times
# 2^16 the whole distribution moves 16 binades up, nearly all of it out of the olive subnormal band
# into the grey normal one. The red line is fp16's largest value, 65504: past it a value is inf.

# %%
fig = plot_gradient_magnitudes(true_grads, SCALE, f"Activation gradients of ConvModel on a "
                               f"{underflow_grid}x{underflow_grid} image")
below = (true_grads.abs() < SMALLEST_SUBNORMAL / 2).float().mean().item()
print(f"{below:.2%} of the true gradients are below half the smallest fp16 subnormal "
      f"(they round to 0); the fp16 run measured {zero_fraction(fp16_raw):.2%} zeros.")

# %% [markdown]
# The two agree closely: the zeros are the gradients whose true value is below fp16's reach (the
# fp16 backward explains small differences). A flushed gradient is information the optimizer never
# sees: weight gradients are sums of these. Scaling leaves the update alone (GradScaler divides by
# the factor again, in fp32, before the step); it moves the backward's numbers into fp16's range.
#
# ## 2. One GradScaler step, by hand
#
# `torch.amp.GradScaler(device_type)` keeps a scale `S` (2^16 at first). One training step, each
# call checked below, on a fresh model on the fp16 device:
#
# - `scaler.scale(loss)` returns `loss * S`; backward of it gives gradients `S` times too large.
# - `scaler.unscale_(optimizer)` divides each `.grad` by `S` in place (fp32), noting any inf or NaN.
# - `scaler.step(optimizer)` unscales if you have not, then calls `optimizer.step()` **only if**
#   every gradient is finite; otherwise the step is skipped.
# - `scaler.update()`: after a skipped step `S *= backoff_factor`; after `growth_interval` good
#   steps in a row `S *= growth_factor`; otherwise `S` stays.

# %%
inputs, targets = make_problem(preset.grid, fp16_device)
model = new_model(fp16_device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(fp16_device.type)
params = list(model.parameters())
optimizer.zero_grad(set_to_none=True)
with torch.autocast(fp16_device.type, dtype=torch.float16):  # forward + loss only
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
S = scaler.get_scale()
scaled_loss = scaler.scale(loss)  # 1. scale
print(f"1. scale:    loss {loss.item():.5f} -> scaled loss {scaled_loss.item():.1f} (S = {S:g})")
assert torch.allclose(scaled_loss, loss * S)

# %%
scaled_loss.backward()  # 2. backward, outside autocast
grads_scaled = [p.grad.clone() for p in params]
print(f"2. backward: largest scaled gradient {max(g.abs().max().item() for g in grads_scaled):.4g}")
scaler.unscale_(optimizer)  # 3. unscale (in place, fp32)
for p, g in zip(params, grads_scaled, strict=True):
    torch.testing.assert_close(p.grad * S, g, equal_nan=True)  # divided by S, nothing else
print(f"3. unscale:  largest gradient now {max(p.grad.abs().max().item() for p in params):.4g}")
finite = all(torch.isfinite(p.grad).all().item() for p in params)  # 4. the check step() makes
print(f"4. check:    all gradients finite? {finite}")
before = [p.detach().clone() for p in params]
scaler.step(optimizer)  # 5. step, or skip
stepped = any(not torch.equal(b, p) for b, p in zip(before, params, strict=True))
print(f"5. step:     weights {'updated' if stepped else 'unchanged: step skipped'}")
assert stepped == finite
scaler.update()  # 6. update the scale
print(f"6. update:   scale {S:g} -> {scaler.get_scale():g}")
assert scaler.get_scale() == (S if finite else S * scaler.get_backoff_factor())

# %% [markdown]
# If step 4 said `False` here, you have seen the scaler at work: the initial 2^16 is deliberately
# large, so the first step or two of a run may overflow and be skipped while the scale settles.
#
# ## 3. The scale over time
#
# To see backing off and growing within a few dozen steps we use a small `growth_interval` and a
# lower initial scale, and at one step we put an `inf` into a gradient by hand, as an overflow in
# a real network would. For every step we record the scale it used and whether the weights moved.

# %%
GROWTH_INTERVAL = 5
INJECT_AT = 8
N_STEPS = 4 * GROWTH_INTERVAL + INJECT_AT
model = new_model(fp16_device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(fp16_device.type, init_scale=2.0**10, growth_factor=2.0,
                              backoff_factor=0.5, growth_interval=GROWTH_INTERVAL)
params = list(model.parameters())
scales, skipped = [], []
for step in tqdm(range(N_STEPS), desc="fp16 + GradScaler"):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(fp16_device.type, dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
    scaler.scale(loss).backward()
    if step == INJECT_AT:
        params[0].grad.view(-1)[0] = float("inf")  # an overflow, injected
    before = [p.detach().clone() for p in params]
    scales.append(scaler.get_scale())
    scaler.step(optimizer)
    scaler.update()
    skipped.append(all(torch.equal(b, p) for b, p in zip(before, params, strict=True)))
scales.append(scaler.get_scale())

# %%
assert skipped[INJECT_AT], "the step with an inf gradient must be skipped"
assert scales[INJECT_AT + 1] == scales[INJECT_AT] * 0.5  # backed off
good_run = 0
for step in range(N_STEPS):  # every step follows the rule in the table above
    good_run = 0 if skipped[step] else good_run + 1
    grow = good_run == GROWTH_INTERVAL
    expected = scales[step] * (0.5 if skipped[step] else 2.0 if grow else 1.0)
    assert scales[step + 1] == expected, f"step {step}"
    good_run = 0 if grow else good_run
assert max(scales[INJECT_AT + 1:]) > scales[INJECT_AT + 1]  # and it grew again afterwards
print(f"skipped steps: {[s for s in range(N_STEPS) if skipped[s]]}; scale {scales[0]:g} -> "
      f"{scales[-1]:g}")
fig = plot_scale_history(
    scales, f"GradScaler: backoff x0.5 on overflow, growth x2 after {GROWTH_INTERVAL} good steps",
    skipped=skipped, marked_step=INJECT_AT)

# %% [markdown]
# ### The four parameters, and when to change them
#
# `init_scale`: early overflows skip a step or two, which is cheap; lower it only if many early
# steps skip. `growth_interval` (good steps in a row before growing): lower it if the scale stays
# low after early overflows, raise it if it oscillates, skipping often. `growth_factor` and
# `backoff_factor` are rarely changed. The defaults, read from a scaler on this device:

# %%
default = torch.amp.GradScaler(fp16_device.type)
print({name: getattr(default, f"get_{name}")()
       for name in ("scale", "growth_factor", "backoff_factor", "growth_interval")})
assert (default.get_scale(), default.get_growth_interval()) == (2.0**16, 2000)

# %% [markdown]
# They suit nearly every model. Watch instead for a `scaler.get_scale()` that keeps falling
# towards 1, or many skipped steps: then the overflows are not rare spikes, something produces
# inf/NaN in the forward pass (lesson 07's `autocast(enabled=False)` regions and fp32 losses help).
#
# ## 4. Gradient clipping: unscale first
#
# `clip_grad_norm_(params, max_norm)` rescales the gradients to a total norm of at most `max_norm`;
# after `scaler.scale(loss).backward()` they and that norm are `S` times too large. The right order:
#
# ```python
# scaler.scale(loss).backward()
# scaler.unscale_(optimizer)                                   # true gradients
# torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
# scaler.step(optimizer)                                       # knows they are unscaled
# scaler.update()
# ```
#
# What the wrong order costs depends on the **optimizer**. `train_clipped` clips in either order and
# records per step the norm the clip saw, the (unscaled) gradient norm the optimizer got, and the
# weight update. A 64x64 image keeps it quick; a fixed scale of 2^10 keeps step 1 from overflowing.

# %%
ORDERS = ("unscale_ then clip", "clip then unscale_")
CLIP_SCALE = 2.0**10  # fixed: train_clipped's scaler never grows it
clip_inputs, clip_targets = make_problem(min(preset.grid, 64), fp16_device)

# %%
def train_clipped(optimizer_class, order: str, max_norm: float, steps: int = 1) -> pd.DataFrame:
    """fp16 AMP training from seed-0 weights, clipping in ``order``; one row per step."""
    model = new_model(fp16_device)
    optimizer = optimizer_class(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(fp16_device.type, init_scale=CLIP_SCALE, growth_interval=10**6)
    rows = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(fp16_device.type, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(clip_inputs), clip_targets)
        scaler.scale(loss).backward()
        if order == "unscale_ then clip":
            scaler.unscale_(optimizer)
        clip_saw = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
        if order == "clip then unscale_":
            scaler.unscale_(optimizer)  # what scaler.step would do next
        optimizer_got = grad_norm(model.parameters())
        before = snapshot(model.parameters())
        scaler.step(optimizer)
        scaler.update()
        rows.append((loss.item(), clip_saw, optimizer_got, update_norm(before, model.parameters())))
    return pd.DataFrame(rows, columns=["loss", "clip saw", "optimizer got", "update"])


# %% [markdown]
# ### One step: SGD shrinks by the scale, Adam does not
#
# The same first step with `max_norm` at half the true gradient norm, so clipping should halve
# the gradients, for SGD and for Adam (the optimizer the course trains with), both with lr 1e-3:

# %%
true_norm = train_clipped(torch.optim.SGD, "unscale_ then clip", float("inf"))["optimizer got"][0]
max_norm = true_norm / 2
one_step = pd.DataFrame({
    (opt.__name__, order): train_clipped(opt, order, max_norm).iloc[0]
    for opt in (torch.optim.SGD, torch.optim.Adam) for order in ORDERS}).T
print(f"true gradient norm {true_norm:.4g}, max_norm {max_norm:.4g}, scale {CLIP_SCALE:g}")
display(one_step.drop(columns="loss").style.format("{:.3g}"))
for opt in ("SGD", "Adam"):
    right, wrong = one_step.loc[(opt, ORDERS[0])], one_step.loc[(opt, ORDERS[1])]
    assert np.isclose(right["optimizer got"], max_norm, rtol=1e-3)  # halved, as asked
    assert np.isclose(wrong["clip saw"], true_norm * CLIP_SCALE, rtol=1e-3)  # the scaled norm
    assert np.isclose(wrong["optimizer got"], max_norm / CLIP_SCALE, rtol=1e-3)  # S times smaller
shrink = {opt: one_step.loc[(opt, ORDERS[0]), "update"] / one_step.loc[(opt, ORDERS[1]), "update"]
          for opt in ("SGD", "Adam")}
print("the right order's update over the wrong order's: "
      + ", ".join(f"{opt} {x:.4g}x" for opt, x in shrink.items()))
assert np.isclose(shrink["SGD"], CLIP_SCALE, rtol=1e-2)  # clip fires either way: S times too small
assert 0.8 < shrink["Adam"] < 1.25  # Adam: about the same step

# %%
# SGD, max_norm = 10 x the true norm (a clip for spikes): only the wrong order clips, S/10 too small
spike_sgd = {order: train_clipped(torch.optim.SGD, order, 10 * true_norm).iloc[0]
             for order in ORDERS}
spike_shrink = spike_sgd[ORDERS[0]]["update"] / spike_sgd[ORDERS[1]]["update"]
print(f"SGD, max_norm = 10 x true norm: the right order's update is {spike_shrink:.4g}x the "
      f"wrong order's (S / 10 = {CLIP_SCALE / 10:g})")
assert np.isclose(spike_shrink, CLIP_SCALE / 10, rtol=1e-2)

# %% [markdown]
# With **SGD** (update `lr * gradient`), clipping first hands the optimizer `max_norm / S` instead
# of `min(||g||, max_norm)`: a step `S * min(1, ||g|| / max_norm)` times too small whenever the
# wrong clip fires (`S * ||g||` above `max_norm`). For a clip meant to fire that is S (lr 1e-3 acts
# like 1e-3 / 65536 at the default scale), for one meant for spikes S / 10, and nothing warns you.
# **Adam** divides each gradient by its own running RMS, so a gradient uniformly S times smaller
# gives almost the same step (only `eps=1e-8` notices), but the clip acted at `max_norm / S`.
#
# ### Adam: a clip meant for spikes fires on every step
#
# A typical setting: `max_norm` well above the usual gradient norm (here 10 times the first step's),
# to catch only rare spikes. A few dozen Adam steps in both orders, and without clipping:

# %%
CLIP_STEPS = min(max(preset.steps // 2, 6), 64)
torch.backends.cudnn.deterministic = True  # GPU runs compared bit for bit below: no racing kernels
spike_norm = 10 * true_norm
adam_runs = {order: train_clipped(torch.optim.Adam, order, spike_norm, CLIP_STEPS)
             for order in ORDERS}
adam_runs["no clipping"] = train_clipped(torch.optim.Adam, ORDERS[0], float("inf"), CLIP_STEPS)
right, wrong, unclipped = (adam_runs[k] for k in (*ORDERS, "no clipping"))
clipped_steps = {k: int((run["clip saw"] > spike_norm).sum()) for k, run in adam_runs.items()}
final_loss = {k: round(float(run["loss"].iloc[-1]), 4) for k, run in adam_runs.items()}
print(f"max_norm {spike_norm:.3g}; the clip fired on {clipped_steps} of {CLIP_STEPS} steps; "
      f"final loss {final_loss}")

assert clipped_steps[ORDERS[0]] == 0 and right["loss"].equals(unclipped["loss"])  # never fired
# the wrong order clips while S * ||g|| > max_norm, i.e. until ||g|| falls S / 10 ~ 100-fold:
assert clipped_steps[ORDERS[1]] >= 0.9 * CLIP_STEPS  # (nearly) every step
fired = wrong["clip saw"] > spike_norm
assert np.allclose(wrong["optimizer got"][fired], spike_norm / CLIP_SCALE, rtol=1e-3)  # fixed norm
assert not wrong["loss"].equals(right["loss"])  # a different training run

# %%
fig = plot_losses({order: run["update"].tolist() for order, run in adam_runs.items()},
                  f"Adam, fp16, max_norm = {spike_norm:.3g}: size of each step",
                  xlabel="training step", ylabel="weight update norm (2-norm)", dtype="fp16")
print(f"update norm, first -> last step: unscale_ first {right['update'].iloc[0]:.3g} -> "
      f"{right['update'].iloc[-1]:.3g}, clip first {wrong['update'].iloc[0]:.3g} -> "
      f"{wrong['update'].iloc[-1]:.3g}")

# %% [markdown]
# In the right order the clip never fires: the run is bit for bit the unclipped one. In the wrong
# order it fires on (nearly) **every** step, until the true gradient norm falls about S / 10 times
# below the first step's, each time handing Adam a gradient of one fixed norm, `max_norm / S`, so
# its steps stop shrinking as the loss falls (compare the curves' ends): normalised-gradient Adam,
# not the optimizer you configured, its threshold moving with the scale. Code touching `.grad`
# between backward and step (logging, regularisers) needs `scaler.unscale_(optimizer)` first.
#
# A lower loss for the wrong order ranks two optimizers, not two orders: its one you never chose,
# its threshold moving with every change of scale. The right order is the clip you configured.
#
# ### Exercise: one fp16 step with clipping
#
# Write `fp16_step`: zero the gradients, run the forward pass and the loss under float16 autocast
# for `inputs.device.type`, then this section's five lines; return the loss as a float. The checker
# runs a few steps of a small CPU problem with SGD and Adam beside a right answer, compares the
# losses, weights and scale with its, and starts one run at scale 2^24 so the first step
# overflows: it must be skipped, the scale halved.

# %% tags=["exercise"] solution="fp16_step.py"
# YOUR CODE: replace the body, run this cell, then the checker below.
def fp16_step(model, optimizer, scaler, inputs, targets, loss_fn, max_norm):
    """One float16 training step with gradient clipping; return the loss as a float."""
    raise NotImplementedError("zero_grad, forward + loss under autocast, then section 4's lines")


# %%
result = check_fp16_step(fp16_step)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# ## 5. bfloat16 needs no scaler
#
# bf16 has fp32's 8 exponent bits, so its smallest normal number is fp32's, about 1e-38, far
# below the smallest gradient of part 1. Part 1's measurement, in bf16 without any scaling:

# %%
bf16_model = new_model(bf16_device)
bf16_raw, _ = activation_grads(bf16_model, *make_problem(underflow_grid, bf16_device),
                               torch.bfloat16)
print(f"gradients computed in {bf16_raw.dtype}; exactly zero: bf16 {zero_fraction(bf16_raw):.2%}, "
      f"fp16 without scaling {zero_fraction(fp16_raw):.2%}, fp32 {zero_fraction(true_grads):.2%}")
assert bf16_raw.dtype == torch.bfloat16
assert torch.finfo(torch.bfloat16).smallest_normal == torch.finfo(torch.float32).smallest_normal
assert zero_fraction(bf16_raw) < zero_fraction(fp16_raw)
# About as many zeros as fp32: they are ReLU's, not underflow. Rounding can flip the ReLU mask of
# pre-activations near 0 (which ones depends on the kernels), so allow 1% either way.
assert abs(zero_fraction(bf16_raw) - zero_fraction(true_grads)) <= 0.01
assert true_grads[true_grads != 0].abs().min() > torch.finfo(torch.bfloat16).smallest_normal
assert not info.needs_grad_scaler(torch.bfloat16)

# %% [markdown]
# bf16 pays for its range with precision (8 significant bits against fp16's 11), which the fp32
# master weights absorb. A GradScaler with bf16 does nothing useful, so one loop serves both:
# `torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)`.
#
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# Measured on a CPU at `smoke` and `cpu`; this lesson's fp16 runs there in both dtype modes, alike.
#
# 1. **Fewer binades.** In section 1, set `SCALE = 2.0**4`. The last row's zeros nearly vanish
#    (0.05% at `smoke`, 0.09% at `cpu`, from 0.80% and 1.43%), but 54% and 62% of the gradients stay
#    subnormal (fewer than 11 significant bits), against 0.03% and 0.04% at 2^16.
# 2. **One binade too many.** In section 2, pass `init_scale=2.0**17` to the `GradScaler`. The
#    largest scaled gradient (4.9e4 at `smoke` with 2^16) is now inf: step 4 says `False`, the step
#    is skipped, the scale halves to 65536 (the same at `cpu`, where even 2^16 overflows here).
# 3. **Grow every step.** In section 3, set `GROWTH_INTERVAL = 1`. The scale doubles each step, to
#    2^17 by step 7, and keeps overshooting: steps 8 (the inf) and 10 of 12 are skipped at `smoke`,
#    7, 8 and 11 at `cpu`. A scale that oscillates like this asks for a larger `growth_interval`.
#
# ## What to remember
#
# - Real fp16 gradients underflow: the bigger the batch or image under a mean loss, the more.
# - GradScaler multiplies the loss by `S` before backward and divides the gradients by `S` (fp32)
#   before the step; it skips a step with inf/NaN gradients and backs the scale off, and grows it
#   after `growth_interval` good steps. The defaults rarely need changing.
# - Anything that touches `.grad` before the step, clipping first of all, comes after
#   `scaler.unscale_(optimizer)`. Clipping scaled gradients makes SGD's steps too small by a factor
#   `S * min(1, ||g|| / max_norm)` (S when the clip would fire anyway); with Adam the steps keep
#   their size, but the clip acts at `max_norm / S` and fires on every step.
# - bf16 has fp32's range: no scaler needed.
#
# **Lesson 03** trains the course model with all of this; **lesson 06** has you write the loop.
