# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
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
# Lesson 01 showed that float16's smallest subnormal is 2^-24 (about 6e-8) and that anything below
# half of it (about 3e-8) rounds to zero. This lesson shows that this really happens to the
# gradients of a real network, and how `torch.amp.GradScaler` fixes it:
#
# 1. measure the problem: the gradients of the course's model, computed in fp16, against fp16's
#    smallest normal and subnormal numbers, and how many become exactly zero;
# 2. walk through one scaler step by hand: scale, backward, unscale, check, step or skip, update;
# 3. watch the scale over many steps, with an inf injected on purpose;
# 4. clip gradients the right way, and see what clipping scaled gradients does to SGD and to Adam;
# 5. see that bfloat16 needs none of this.
#
# Seeds are fixed (`torch.manual_seed(0)`), so each run starts from the same weights, and every
# claim is checked by an `assert` in the cell that makes it.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display
from tqdm.auto import tqdm

from amp_tutorial.data import make_problem
from amp_tutorial.device import describe_device, select_device
from amp_tutorial.gradients import grad_norm, snapshot, update_norm
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import get_preset

info = select_device()
preset = get_preset(device_type=info.type)
print(describe_device(info))
print(f"preset {preset.name!r}: {preset.description}")

FP16 = torch.finfo(torch.float16)
SMALLEST_NORMAL = FP16.smallest_normal  # 2^-14, about 6.1e-5
SMALLEST_SUBNORMAL = FP16.smallest_normal * FP16.eps  # 2^-24, about 6.0e-8
print(f"fp16 smallest normal {SMALLEST_NORMAL:.3g}, smallest subnormal {SMALLEST_SUBNORMAL:.3g}")
assert SMALLEST_SUBNORMAL == 2.0**-24  # below half of it fp16 rounds to 0, just above to 2^-24:
assert torch.tensor(0.49 * SMALLEST_SUBNORMAL, dtype=torch.float16).item() == 0.0
assert torch.tensor(0.51 * SMALLEST_SUBNORMAL, dtype=torch.float16).item() == SMALLEST_SUBNORMAL

# %% [markdown]
# ### Where the fp16 work runs
#
# GradScaler matters for **float16**, the default autocast dtype on CUDA and ROCm GPUs. On a CPU
# the fast path is bfloat16, but PyTorch's CPU autocast also accepts `dtype=torch.float16`, and
# `torch.amp.GradScaler("cpu")` exists (both checked on torch 2.14), so this lesson runs fp16 on
# the CPU too. The numbers are real fp16 gradients either way. Most CPUs have no fast fp16
# arithmetic, though, so on a CPU fp16 is *slower* than fp32 and we use a narrow network; the
# gradient magnitudes this lesson is about depend on the loss and the image size, not on the width.

# %%
fp16_ok_here = torch.float16 in info.amp_dtypes or info.type == "cpu"
fp16_device = info.device if fp16_ok_here else torch.device("cpu")
bf16_device = info.device if torch.bfloat16 in info.amp_dtypes else torch.device("cpu")
hidden = preset.hidden if fp16_device.type != "cpu" else min(preset.hidden, 16)
print(f"fp16 runs on {fp16_device}, bf16 on {bf16_device}; network width {hidden}")


def new_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights every time
    return ConvModel(hidden, preset.n_hidden_layers).to(device)


# %% [markdown]
# ## 1. The problem: fp16 gradients flush to zero
#
# The loss is the *mean* squared error over every pixel, so the gradient reaching each pixel's
# activation is about `2 * error / number_of_pixels`: the larger the image (or batch), the
# smaller each gradient. We use a 256x256 image (512x512 at the `paper` preset) and collect
# the gradient that flows back into every convolution's output: in fp16 autocast those are
# float16 tensors, exactly as the backward pass computes them.
#
# `loss_scale` multiplies the loss before `backward()`; we divide it out again in fp32 afterwards,
# which is what GradScaler does for you.

# %%
underflow_grid = max(preset.grid, 256)
demo_inputs, demo_targets = make_problem(underflow_grid, fp16_device)


def activation_grads(model, inputs, targets, dtype=None, loss_scale=1.0):
    """Gradients flowing into each conv output: (as computed, in their dtype; unscaled, in fp32)."""
    grads = []

    def keep_grad(module, args, output):
        output.register_hook(grads.append)

    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    handles = [conv.register_forward_hook(keep_grad) for conv in convs]
    with torch.autocast(inputs.device.type, dtype=dtype or torch.float32,
                        enabled=dtype is not None):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
    (loss * loss_scale).backward()
    for handle in handles:
        handle.remove()
    raw = torch.cat([g.flatten() for g in grads])
    return raw, raw.float() / loss_scale


model = new_model(fp16_device)
true_grads = activation_grads(model, demo_inputs, demo_targets)[1].cpu()
fp16_raw, fp16_grads = activation_grads(model, demo_inputs, demo_targets, torch.float16)
SCALE = 2.0**16  # GradScaler's default initial scale
scaled_raw, scaled_grads = activation_grads(model, demo_inputs, demo_targets, torch.float16, SCALE)
print(f"dtype of the gradients as computed: fp16 run {fp16_raw.dtype}, fp32 run {true_grads.dtype}")
assert fp16_raw.dtype == torch.float16


def zero_fraction(grads):
    return (grads == 0).float().mean().item()


flushed = pd.DataFrame({
    "fp32 (reference)": {"exactly zero": zero_fraction(true_grads)},
    "fp16, no scaling": {"exactly zero": zero_fraction(fp16_raw)},
    f"fp16, loss x 2^{int(np.log2(SCALE))}": {"exactly zero": zero_fraction(scaled_raw)},
}).T
flushed["below fp16 normal"] = [
    ((g.abs() < SMALLEST_NORMAL) & (g != 0)).float().mean().item()
    for g in (true_grads, fp16_raw.float(), scaled_raw.float())
]
print(flushed.to_string(float_format=lambda v: f"{v:.2%}"))

# %%
assert zero_fraction(fp16_raw) > zero_fraction(true_grads)  # fp16 loses gradients fp32 keeps
assert zero_fraction(scaled_raw) < zero_fraction(fp16_raw)  # scaling rescues them
assert flushed["below fp16 normal"].iloc[2] < flushed["below fp16 normal"].iloc[1]

# %% [markdown]
# Two losses, not one. The first column counts gradients that became exactly zero. The second
# counts the ones that survived only as **subnormals**: below 2^-14 fp16 has fewer than its 11
# significant bits, down to a single bit at 2^-24, so these gradients are stored coarsely. After
# scaling, almost none are left in either group.

# %% [markdown]
# Where do the gradients sit? The histogram shows the true (fp32) gradient magnitudes, and the
# same gradients multiplied by the scale, against fp16's thresholds. Everything below half the
# smallest subnormal (2^-25, about 3e-8) becomes 0 in fp16; between that and the smallest normal,
# values keep only a few significant bits. Multiplying by 2^16 slides the whole distribution 16
# binades to the right, into fp16's comfortable range.

# %%
magnitudes = np.log2(true_grads[true_grads != 0].abs().numpy())
fig, ax = plt.subplots(figsize=(8, 3.5))
bins = np.arange(np.floor(magnitudes.min()), np.ceil(magnitudes.max()) + 17, 0.5)
ax.hist(magnitudes, bins=bins, alpha=0.7, label="true gradients (fp32)")
ax.hist(magnitudes + np.log2(SCALE), bins=bins, alpha=0.7,
        label="x 2^16 (what GradScaler feeds fp16)")
ax.axvspan(bins[0], np.log2(SMALLEST_SUBNORMAL / 2), color="tab:red", alpha=0.12,
           label="rounds to 0 in fp16 (below 2^-25)")
ax.axvline(np.log2(SMALLEST_SUBNORMAL), color="tab:red", ls="--", label="fp16 smallest subnormal")
ax.axvline(np.log2(SMALLEST_NORMAL), color="tab:orange", ls="--", label="fp16 smallest normal")
ax.set(title=f"Activation gradients of ConvModel on a {underflow_grid}x{underflow_grid} image",
       xlabel="gradient magnitude (log2; -24 is about 6e-8)", ylabel="number of gradient values")
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()

below = (true_grads.abs() < SMALLEST_SUBNORMAL / 2).float().mean().item()
print(f"{below:.2%} of the true gradients are below half the smallest fp16 subnormal "
      f"(they round to 0); the fp16 run measured {zero_fraction(fp16_raw):.2%} zeros.")

# %% [markdown]
# The two numbers agree closely: the zeros are the gradients whose true value lies below fp16's
# reach (small differences come from the rest of the backward pass rounding in fp16).
#
# A flushed gradient is not noise: it is information the optimizer never sees, and the weight
# gradients are sums of these activation gradients. Scaling does not change the update
# (GradScaler divides by the same factor in fp32 before the optimizer step); it only moves the
# backward pass's numbers to where fp16 can hold them.
#
# ## 2. One GradScaler step, by hand
#
# `torch.amp.GradScaler(device_type)` keeps a scale `S` (2^16 at first). One training step:
#
# - `scaler.scale(loss)` returns `loss * S`; backward of it gives gradients `S` times too large.
# - `scaler.unscale_(optimizer)` divides each `.grad` by `S` in place (in fp32) and records
#   whether any of them is inf or NaN.
# - `scaler.step(optimizer)` unscales if you have not, then calls `optimizer.step()` **only if**
#   every gradient is finite; otherwise the step is skipped.
# - `scaler.update()`: after a skipped step `S *= backoff_factor`; after `growth_interval` good
#   steps in a row `S *= growth_factor`; otherwise `S` stays.
#
# Each call below is followed by a check of what it did. We use the preset's image and a fresh
# model on the fp16 device.

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
# If step 4 said `False` on your machine, you have just seen the scaler at work: the initial
# 2^16 is deliberately large, so the first step or two of a run can overflow and be skipped while
# the scale finds its level. That costs a step or two, once.
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

fig, ax = plt.subplots(figsize=(8, 3.5))
ax.step(range(N_STEPS + 1), np.log2(scales), where="post", label="scale used by the step")
skips = [s for s in range(N_STEPS) if skipped[s]]
ax.scatter(skips, np.log2([scales[s] for s in skips]), color="tab:red", zorder=3,
           label="skipped step (inf/NaN gradient)")
ax.axvline(INJECT_AT, color="tab:red", ls=":", label="inf injected")
ax.set(title=f"GradScaler: backoff x0.5 on overflow, growth x2 after {GROWTH_INTERVAL} good steps",
       xlabel="training step", ylabel="scale (log2)")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# ### The four parameters, and when to change them
#
# Read from a default scaler on this device:

# %%
default = torch.amp.GradScaler(fp16_device.type)
defaults = pd.DataFrame({
    "init_scale": [default.get_scale(), "the first scale; the first steps may overflow and skip, "
                   "which is cheap. Lower it only if many early steps are skipped."],
    "growth_factor": [default.get_growth_factor(), "how much the scale grows after a run of "
                      "good steps. Rarely worth changing."],
    "backoff_factor": [default.get_backoff_factor(), "how much it shrinks after an overflow. "
                       "Rarely worth changing."],
    "growth_interval": [default.get_growth_interval(), "good steps in a row before growing. "
                        "Lower it if the scale stays far below where it could be (e.g. after "
                        "an early run of overflows); raise it if it oscillates, skipping often."],
}, index=["default", "when to change it"]).T
assert (default.get_scale(), default.get_growth_interval()) == (2.0**16, 2000)
display(defaults)

# %% [markdown]
# The defaults suit nearly every model. What to watch instead: if `scaler.get_scale()` keeps
# falling towards 1, or many steps are skipped, the overflows are not rare spikes but a sign that
# something produces inf/NaN in the forward pass (lesson 07's `autocast(enabled=False)` regions
# and fp32 losses help there).
#
# ## 4. Gradient clipping: unscale first
#
# `clip_grad_norm_(params, max_norm)` rescales the gradients so their total norm is at most
# `max_norm`. After `scaler.scale(loss).backward()` the gradients are `S` times too large, so the
# norm it measures is `S` times too large too. The right order is:
#
# ```python
# scaler.scale(loss).backward()
# scaler.unscale_(optimizer)                                   # true gradients
# torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
# scaler.step(optimizer)                                       # knows they are unscaled
# scaler.update()
# ```
#
# What the wrong order costs depends on the **optimizer**. `train_clipped` below is the AMP loop
# with clipping in either order; per step it records the norm the clip measured, the norm of the
# (unscaled) gradients the optimizer then gets, and how far the step moved the weights
# (`amp_tutorial.gradients` measures the norms). A 64x64 image keeps it quick, and a fixed scale
# of 2^10 keeps the first step from overflowing.

# %%
ORDERS = ("unscale_ then clip", "clip then unscale_")
CLIP_SCALE = 2.0**10
clip_inputs, clip_targets = make_problem(min(preset.grid, 64), fp16_device)


def train_clipped(optimizer_class, order: str, max_norm: float, steps: int = 1) -> pd.DataFrame:
    """fp16 AMP training from seed-0 weights, clipping in ``order``; one row per step."""
    model = new_model(fp16_device)
    optimizer = optimizer_class(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(fp16_device.type, init_scale=CLIP_SCALE,
                                  growth_interval=10**6)  # the scale stays fixed here
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
sgd_shrink = one_step.loc[("SGD", ORDERS[0]), "update"] / one_step.loc[("SGD", ORDERS[1]), "update"]
adam_shrink = (one_step.loc[("Adam", ORDERS[0]), "update"]
               / one_step.loc[("Adam", ORDERS[1]), "update"])
print(f"the right order's update is {sgd_shrink:.4g}x the wrong order's with SGD, "
      f"{adam_shrink:.3g}x with Adam")
assert np.isclose(sgd_shrink, CLIP_SCALE, rtol=1e-2)  # clip fires either way: S times too small
assert 0.8 < adam_shrink < 1.25  # Adam: about the same step

# SGD with a clip meant for spikes (max_norm = 10 x the true norm): only the wrong order clips,
# so its step is S * ||g|| / max_norm = S / 10 times too small, not S times.
spike_sgd = {order: train_clipped(torch.optim.SGD, order, 10 * true_norm).iloc[0]
             for order in ORDERS}
spike_shrink = spike_sgd[ORDERS[0]]["update"] / spike_sgd[ORDERS[1]]["update"]
print(f"SGD, max_norm = 10 x true norm: the right order's update is {spike_shrink:.4g}x the "
      f"wrong order's (S / 10 = {CLIP_SCALE / 10:g})")
assert np.isclose(spike_shrink, CLIP_SCALE / 10, rtol=1e-2)

# %% [markdown]
# With **SGD** the update is `lr * gradient`, so the step shrinks exactly as the gradient did.
# Clipping first hands the optimizer `max_norm / S` where the right order hands it
# `min(||g||, max_norm)`: the step is `S * min(1, ||g|| / max_norm)` times too small (as long as
# `S * ||g||` exceeds `max_norm`, so that the wrong-order clip fires at all). Above, where the clip
# is meant to fire anyway, that is S: lr 1e-3 behaves like 1e-3 / S (1e-3 / 65536 at the default
# scale). With a clip meant for spikes (`max_norm` 10 times `||g||`) it is S / 10, still a run
# that crawls, and nothing warns you. **Adam** divides each gradient by its own running RMS, so a
# gradient that is uniformly S times smaller gives almost the same step (only its `eps=1e-8`
# term notices, once gradients get that small). The damage with Adam is elsewhere: the clip
# measured `S` times the true norm, so it acted as if `max_norm` were `max_norm / S`.
#
# ### Adam: a clip meant for spikes fires on every step
#
# A typical setting: `max_norm` well above the usual gradient norm (here 10 times the first
# step's), so that it only catches rare spikes. Trained for a few dozen steps with Adam, in both
# orders and without clipping:

# %%
CLIP_STEPS = max(preset.steps // 2, 6)
spike_norm = 10 * true_norm
adam_runs = {order: train_clipped(torch.optim.Adam, order, spike_norm, CLIP_STEPS)
             for order in ORDERS}
adam_runs["no clipping"] = train_clipped(torch.optim.Adam, ORDERS[0], float("inf"), CLIP_STEPS)
right, wrong, unclipped = (adam_runs[k] for k in (*ORDERS, "no clipping"))
clipped_steps = {k: int((run["clip saw"] > spike_norm).sum()) for k, run in adam_runs.items()}
print(f"max_norm {spike_norm:.3g}; steps the clip fired on, of {CLIP_STEPS}: {clipped_steps}")
final_losses = {k: round(float(run["loss"].iloc[-1]), 4) for k, run in adam_runs.items()}
print(f"final loss: {final_losses}")

assert clipped_steps[ORDERS[0]] == 0 and right["loss"].equals(unclipped["loss"])  # never fired
assert clipped_steps[ORDERS[1]] == CLIP_STEPS  # the wrong order clipped every single step
assert np.allclose(wrong["optimizer got"], spike_norm / CLIP_SCALE, rtol=1e-3)  # one fixed norm
assert not wrong["loss"].equals(right["loss"])  # a different training run

fig, ax = plt.subplots(figsize=(8, 3.5))
for order, run in adam_runs.items():
    ax.plot(run["update"], label=order, ls="--" if order == "no clipping" else "-")
ax.set(title=f"Adam, fp16, max_norm = {spike_norm:.3g}: size of each step",
       xlabel="training step", ylabel="weight update norm (2-norm)")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
late_right, late_wrong = right["update"].iloc[-1], wrong["update"].iloc[-1]
print(f"last step moved the weights by {late_right:.3g} (unscale_ first) and {late_wrong:.3g} "
      f"(clip first); first step {right['update'][0]:.3g} and {wrong['update'][0]:.3g}")

# %% [markdown]
# In the right order the clip never fires and the run is bit for bit the unclipped one. In the
# wrong order it fires on **every** step and hands Adam a gradient of the same norm each time,
# `max_norm / S`. Adam then no longer sees the gradient shrink as the loss falls, so its steps
# do not shrink either (compare the curves' ends): you are training with a different optimizer
# (normalised-gradient Adam) than the one you configured, and the spikes the clip was for are not
# treated differently from any other step. Whether the loss ends higher or lower after a few
# dozen steps depends on the problem; the point is that it is not the run you asked for, and when
# the scale changes (it doubles every `growth_interval` good steps) the effective threshold moves
# with it. Any other code that reads or changes `.grad` between backward and step (gradient
# logging, custom regularisers) needs `scaler.unscale_(optimizer)` first, too.
#
# ## 5. bfloat16 needs no scaler
#
# bf16 has fp32's 8 exponent bits, so its smallest normal number is fp32's, about 1e-38, far
# below the smallest gradient of part 1. The same measurement as in part 1, in bf16 without any
# scaling:

# %%
bf16_model = new_model(bf16_device)
bf16_raw, _ = activation_grads(bf16_model, *make_problem(underflow_grid, bf16_device),
                               torch.bfloat16)
print(f"gradients computed in {bf16_raw.dtype}; exactly zero: bf16 {zero_fraction(bf16_raw):.2%}, "
      f"fp16 without scaling {zero_fraction(fp16_raw):.2%}, fp32 {zero_fraction(true_grads):.2%}")
assert bf16_raw.dtype == torch.bfloat16
assert torch.finfo(torch.bfloat16).smallest_normal == torch.finfo(torch.float32).smallest_normal
assert zero_fraction(bf16_raw) < zero_fraction(fp16_raw)
# About as many zeros as fp32: the zeros are ReLU's, not underflow. Rounding can flip the ReLU
# mask of pre-activations near 0 (which ones depends on the hardware's kernels), so allow 1% of
# the elements either way rather than demand an exact match.
assert abs(zero_fraction(bf16_raw) - zero_fraction(true_grads)) <= 0.01
assert true_grads[true_grads != 0].abs().min() > torch.finfo(torch.bfloat16).smallest_normal
assert not info.needs_grad_scaler(torch.bfloat16)

# %% [markdown]
# bf16 pays for its range with precision (8 significant bits against fp16's 11), which the fp32
# master weights absorb. A GradScaler with bf16 does no harm, but it does nothing useful, so the
# usual pattern is one loop for both: `torch.amp.GradScaler(device_type, enabled=amp_dtype ==
# torch.float16)`; with `enabled=False` every scaler call passes straight through.
#
# ## What to remember
#
# - Real fp16 gradients underflow: the bigger the batch or image under a mean loss, the more.
# - GradScaler multiplies the loss by `S` before backward and divides the gradients by `S` (fp32)
#   before the step; it skips a step with inf/NaN gradients and backs the scale off, and grows it
#   after `growth_interval` good steps. The defaults rarely need changing.
# - Anything that touches `.grad` before the step, clipping first of all, comes after
#   `scaler.unscale_(optimizer)`. Clipping scaled gradients makes SGD's steps
#   `S * min(1, ||g|| / max_norm)` times too small (S when the clip would fire anyway);
#   with Adam the steps keep their size, but the clip acts at `max_norm / S` and fires on every
#   step.
# - bf16 has fp32's range: no scaler needed.
#
# **Lesson 03** trains the course model with all of this; **lesson 06** lets you write the loop
# yourself.
