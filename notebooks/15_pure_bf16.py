# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 30
#     memory:
#       cpu: 163
#       paper: 1162
#     minutes:
#       cpu: 0.5
#       small: 0.7
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
# # 15 · Pure bf16 is not AMP: what `model.to(torch.bfloat16)` loses, and when it is right
#
# Lesson 03 trained the 1x1-conv `ConvModel` with AMP: fp32 weights, bf16 (or fp16) matmuls under
# autocast. Why not simply cast the whole model to bf16 instead? This lesson measures what that
# costs in training (lost weight updates, bf16 optimizer state), what AMP's fp32 master weights
# cost in memory, and where casting once is the right choice: inference, served under autocast
# in lesson 04. bf16's 8 significant bits are lesson 01's.
#
# The model and its data are lesson 03's at the preset's sizes (`course_models`, shared with the
# benchmark). Seeds are fixed, so every run starts from the same weights.

# %%
import copy

import pandas as pd
import torch
import torch.nn.functional as F

from amp_tutorial.device import device_line, select_device
from amp_tutorial.interleave import interleave
from amp_tutorial.models import course_models
from amp_tutorial.plots import plot_losses
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded
from amp_tutorial.stochastic_rounding import StochasticRoundingAdam, stochastic_round_bf16

info = select_device()
preset = get_preset(device_type=info.type)
# bf16 weights need bf16 tensors, which CPUs and CUDA GPUs (emulated on pre-Ampere ones) always
# have, other devices only where bf16 is offered
assert torch.bfloat16 in info.amp_dtypes or info.type in ("cpu", "cuda"), (
    f"{info.type} offers no bf16 here (see the device line); run this lesson with "
    "AMP_TUTORIAL_DEVICE=cpu")
print(device_line(info, preset))
torch.manual_seed(0)  # every run starts from the same numbers
make_conv, image_in, image_target, _ = course_models(preset, info.device)["ConvModel"]

# %% [markdown]
# ## 1. Updates that round away
#
# `model.to(torch.bfloat16)` with an ordinary optimizer runs every matmul in bf16, like AMP, but
# it also stores the **weights** in bf16. bf16 keeps 8 significant bits (7 stored, 1 implicit), so
# its numbers are 2^-7 = 0.0078 apart in [1, 2) and 2^-8 = 0.0039 apart in [0.5, 1). A sum is
# rounded to the nearest bf16 number, so an update smaller than half the gap is **lost**: for a
# weight between 0.5 and 1, anything below 2^-9 = 0.00195. A power of two has the smaller gap
# below it: 1.0 loses a step down below 2^-9 and a step up below 2^-8. At exactly half a gap the
# sum is a tie, and ties go to the neighbour whose last bit is even: the update is lost or doubled.

# %%
one = torch.tensor(1.0)
for update in (1e-2, 1e-3, 1e-4):
    print(f"1.0 - {update:g}: fp32 -> {(one - update).item():.6f}, "
          f"bf16 -> {(one.bfloat16() - update).item():.6f}")
assert (one.bfloat16() - 1e-3) == 1.0 and (one - 1e-3) != 1.0
assert torch.finfo(torch.bfloat16).eps == 2**-7  # the gap above 1.0; below 1.0 it is 2^-8
w = torch.tensor([0.75, 0.75 + 2**-8], dtype=torch.bfloat16)  # neighbours, gap 2^-8
assert torch.equal(w + 0.99 * 2**-9, w) and torch.equal(w - 0.99 * 2**-9, w)  # lost
assert torch.equal(w + 1.01 * 2**-9, w + 2**-8)  # just over half the gap: one gap up
print(f"a tie, {w.tolist()} + 2^-9 -> {(w + 2**-9).tolist()}")
assert (w + 2**-9).tolist() == [0.75, 0.75 + 2**-7]  # to the even neighbour: lost, or doubled
assert one.bfloat16() - 2**-9 == 1.0 and one.bfloat16() - 1.01 * 2**-9 == 1 - 2**-8
assert one.bfloat16() + 2**-8 == 1.0 and one.bfloat16() + 1.01 * 2**-8 == 1 + 2**-7

# %% [markdown]
# Adam's first step moves every weight by about the learning rate (1e-3 here) against its
# gradient. In a pure-bf16 ConvModel, how many of those updates survive? BatchNorm's weights
# start at exactly 1.0, so we expect all of theirs to vanish; the rest depends on each weight's
# size.

# %%
def pure_bf16_model():
    return make_conv().to(torch.bfloat16)


def lost_update_share(model, optimizer, x, y):
    """One plain training step; returns the share of weights with a gradient that did not move."""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad(set_to_none=True)
    F.mse_loss(model(x), y).backward()
    had_grad = [p.grad != 0 for p in model.parameters()]
    optimizer.step()
    lost = sum(((p == b) & g).sum().item()
               for p, b, g in zip(model.parameters(), before, had_grad, strict=True))
    return lost / sum(g.sum().item() for g in had_grad)


# %%
bf16_in, bf16_target = image_in.bfloat16(), image_target.bfloat16()
model = pure_bf16_model()
bn_weight_before = model.layers[1].weight.detach().clone()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
share = lost_update_share(model, optimizer, bf16_in, bf16_target)
print(f"pure bf16, Adam lr 1e-3: {share:.1%} of the weight updates in the first step were lost")
print(f"BatchNorm weights unchanged: {torch.equal(model.layers[1].weight, bn_weight_before)}")
assert torch.equal(model.layers[1].weight, bn_weight_before)  # 1.0 - 1e-3 rounds to 1.0
assert share > 0  # the BatchNorm weights at least: 1.4% of the updates at `cpu`, 0.75% at `paper`

# %% [markdown]
# **Optimizer state** is created like the parameters, so Adam's two moving averages are bf16 too:
# half the bytes of AMP's fp32 state, and the same rounding applies to every update of them.

# %%
state = optimizer.state[model.layers[0].weight]
print({k: v.dtype for k, v in state.items() if torch.is_tensor(v)})
assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16

# %% [markdown]
# Now train both ways for the preset's number of steps, counting the lost updates at every step
# of the pure-bf16 run: AMP (fp32 weights, bf16 matmuls under autocast) against pure bf16.

# %%
def train_amp_bf16():
    model = make_conv()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(preset.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(image_in), image_target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, optimizer, losses


def train_pure_bf16(make_optimizer=lambda params: torch.optim.Adam(params, lr=1e-3)):
    model = pure_bf16_model()
    optimizer = make_optimizer(model.parameters())
    losses, lost = [], []
    for _ in range(preset.steps):
        with torch.no_grad():  # the loss of the bf16 prediction, computed in fp32
            losses.append(F.mse_loss(model(bf16_in).float(), image_target).item())
        lost.append(lost_update_share(model, optimizer, bf16_in, bf16_target))
    return model, optimizer, losses, lost

# %%
def training_bytes_per_weight(model, optimizer):
    """Bytes held per weight after a step: the weight, its gradient and Adam's two averages."""
    held = 0
    for p in model.parameters():
        state = [v for v in optimizer.state[p].values()
                 if torch.is_tensor(v) and v.shape == p.shape]
        held += sum(t.numel() * t.element_size() for t in (p, p.grad, *state))
    return held / sum(p.numel() for p in model.parameters())


amp_model, amp_optimizer, amp_losses = train_amp_bf16()
pure_model, pure_optimizer, pure_losses, lost_shares = train_pure_bf16()
print(f"final loss: AMP bf16 {amp_losses[-1]:.4f}, pure bf16 {pure_losses[-1]:.4f}; "
      f"lost updates per step in pure bf16: {min(lost_shares):.1%} to {max(lost_shares):.1%} "
      f"(mean {sum(lost_shares) / len(lost_shares):.1%})")
assert amp_model.layers[0].weight.dtype == torch.float32  # AMP never touched the stored weights
assert min(lost_shares) > 0
per_weight = {"AMP bf16": training_bytes_per_weight(amp_model, amp_optimizer),
              "pure bf16": training_bytes_per_weight(pure_model, pure_optimizer)}
print(f"bytes per weight (weight + gradient + Adam's exp_avg, exp_avg_sq): {per_weight}")
assert per_weight == {"AMP bf16": 16, "pure bf16": 8}

# %% [markdown]
# This is why AMP keeps **fp32 master weights**: autocast casts a weight to bf16 only as the input
# of one matmul, while the stored weight, its gradient and the optimizer state stay fp32, so
# thousands of small updates add up instead of rounding away. The price is memory: with Adam,
# 16 bytes per weight (fp32 weight, fp32 gradient and two fp32 moving averages) against 8 in
# pure bf16, as measured above.
#
# A larger learning rate is no cure. Only Adam's first step moves every weight by about the
# learning rate: its update is lr * m/(sqrt(v) + eps) with bias-corrected averages m and v, which
# are g and g^2 at step one. Once gradients shrink or change sign, m falls faster than sqrt(v)
# (v averages over ~1000 steps, m over ~10), and the updates sink below half a gap again
# (Try it 2). What keeps bf16 weights trainable:
#
# - **fp32 master weights**: AMP, as above; or a bf16 model whose optimizer updates an fp32 copy
#   and copies it back to bf16 after each step. 4 more bytes per weight.
# - **Stochastic rounding**: compute the new weight in fp32, then round it up or down at random,
#   up with probability (distance from the lower neighbour) / gap. Its expected value is exact:
#   a step of 1e-3 moves a weight at 1.0 a whole gap (2^-8) about one time in four, 1e-3 on
#   average. No extra bytes. torchao.optim's optimizers (`AdamW8bit`, `Adam8bit`, `AdamWFp8`,
#   the full-state `_AdamW`, ...) take `bf16_stochastic_round=True` (`torchao/optim/adam.py`:
#   the step in fp32, the bf16 weight rounded stochastically). The moments are stored as each
#   optimizer keeps them: `_AdamW` in the weight's dtype, rounded to nearest; the 8-bit ones
#   quantized per block of 256 values to an 8-bit code, `AdamWFp8` scaled per block and cast to
#   float8 (tensors under 4096 values keep plain moments, `_new_buffer`).
# - **Kahan-compensated updates**: keep each weight's rounding error in a second bf16 tensor and
#   add it to the next update. 2 more bytes per weight.
#
# `amp_tutorial.stochastic_rounding` has the rounding (16 random bits added below bf16's last
# bit of the fp32 pattern, then cut off) and an Adam that uses it as torchao does. A weight of
# 1.0, a hundred steps of -0.001:

# %%
ones = torch.ones(10_000, dtype=torch.bfloat16)
nearest, stochastic, generator = ones, ones, torch.Generator().manual_seed(0)
for _ in range(100):
    nearest = (nearest.float() - 1e-3).bfloat16()  # what bf16 weights do
    stochastic = stochastic_round_bf16(stochastic.float() - 1e-3, generator)
print(f"exact 0.9; round to nearest: {nearest.float().mean():.4f}; stochastic rounding: mean "
      f"{stochastic.float().mean():.4f} over 10,000 weights, {stochastic.unique().numel()} values")
assert torch.all(nearest == 1.0)  # every update lost
assert abs(stochastic.float().mean() - 0.9) < 1e-3  # the mean varies by 1.7e-4 (sd)

# %% [markdown]
# The same ConvModel, pure bf16, with that Adam instead of torch's (the generator is seeded, so
# the run repeats on the same kind of CPU kernels). How many weights did not move in one step is
# no longer the measure: a weight whose update is a quarter of the gap stays put three steps in
# four. What matters is whether
# the updates add up. BatchNorm's weights start at 1.0, so watch them move:

# %%
sr_model, sr_optimizer, sr_losses, sr_lost = train_pure_bf16(
    lambda params: StochasticRoundingAdam(  # a CPU generator serves every device
        params, lr=1e-3, generator=torch.Generator().manual_seed(0)))
bn_moved = {name: (model.layers[1].weight.float() - 1).abs().mean().item()
            for name, model in (("AMP bf16", amp_model), ("pure bf16", pure_model),
                                ("pure bf16, stochastic rounding", sr_model))}
losses = {"AMP bf16": amp_losses[-1], "pure bf16": pure_losses[-1],
          "pure bf16, stochastic rounding": sr_losses[-1]}
print(pd.DataFrame({"final loss": losses, "BatchNorm weights: mean |w - 1|": bn_moved}).round(5))
# at smoke, small and cpu this is exactly 0: every update of every BatchNorm weight lost, all
# run long; a longer run (paper: 512 steps) may move a few, so the assert asks for far less
assert bn_moved["pure bf16"] < bn_moved["pure bf16, stochastic rounding"] / 4
assert bn_moved["pure bf16, stochastic rounding"] > bn_moved["AMP bf16"] / 2
assert sr_losses[-1] < pure_losses[-1]
assert training_bytes_per_weight(sr_model, sr_optimizer) == 8  # pure bf16's memory
fig = plot_losses({"AMP bf16 (fp32 weights)": amp_losses, "pure bf16 (bf16 weights)": pure_losses,
                   "pure bf16, stochastic rounding": sr_losses},
                  "Training loss: AMP against model.to(bfloat16)")

# %% [markdown]
# ## 2. When pure bf16 is right: inference
#
# A trained model never updates its weights again, so nothing can be lost. Cast it **once**: the
# weights take half the memory, and no per-call casts are left (autocast casts the fp32 weights
# again on every forward).

# %%
def forward(model, x, amp_dtype):
    """One inference forward of ``model`` on ``x``, under autocast where amp_dtype is given."""
    model.eval()

    def step():
        with torch.inference_mode(), torch.autocast(info.type, dtype=amp_dtype or torch.float32,
                                                     enabled=amp_dtype is not None):
            return model(x)

    return step


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


# %%
fp32_bytes = weight_bytes(amp_model)
with torch.inference_mode():
    reference = amp_model.eval()(image_in).float()
cast_once = copy.deepcopy(amp_model).to(torch.bfloat16)  # a deployment would cast in place
forwards = {"autocast bf16": forward(amp_model, image_in, torch.bfloat16),
            "autocast bf16 again": forward(amp_model, image_in, torch.bfloat16),  # the control
            "fp32": forward(amp_model, image_in, None),
            "cast once to bf16": forward(cast_once, bf16_in, None)}
timed = interleave(forwards, "autocast bf16", "autocast bf16 again", info.device,
                   blocks=preset.inference_steps // 2, warmup=preset.warmup, preset=preset.name,
                   progress=False)  # taking turns, as in lesson 03
with torch.inference_mode():
    max_diff = (cast_once(bf16_in).float() - reference).abs().max().item()
runs = ("fp32", "autocast bf16", "cast once to bf16")
inference = pd.DataFrame({
    "ms/forward": {n: timed.timings[n].median * 1e3 for n in runs},
    "IQR (ms)": {n: timed.timings[n].iqr * 1e3 for n in runs},
    "weights (KB)": {"fp32": fp32_bytes / 1024, "autocast bf16": fp32_bytes / 1024,
                     "cast once to bf16": weight_bytes(cast_once) / 1024}})
print(f"largest difference from the fp32 prediction: {max_diff:.4f} (targets lie in [0, 1])")
print(with_recorded(timed.comparison("cast once to bf16"), "15 cast once bf16", info))
assert weight_bytes(cast_once) * 2 == fp32_bytes
assert max_diff < 0.1
inference.round(3)

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **An update that survives.** In section 1's first cell, change the loop's `1e-3` to `3e-3`.
#    bf16 now gives 0.996094, which is 1 - 2^-8: just below 1.0 bf16's numbers are 2^-8 = 0.0039
#    apart, and 0.003 is more than half that gap, so the result rounds down, not back to 1.0.
# 2. **A larger learning rate, for one step.** In the cell that takes one pure-bf16 step, set
#    Adam's `lr=1e-2`. No update is lost (0.0%, at `smoke` and `cpu`; the message still says
#    1e-3), the BatchNorm weights move, and the assert fails: Adam's first step is about 0.01 for
#    every weight, more than half the 0.0039 gap. That is the first step only. Set `lr=1e-2` in
#    `train_pure_bf16`'s default as well and re-run from there: the printed range starts at 0.0%
#    (step one; the assert after it fails), but at `cpu` (seeded: the same figures on a CPU of
#    the same kind; one whose bf16 kernels differ, AVX2 against AVX512-BF16 or AMX, rounds
#    differently and gives nearby ones) 3.7% of the updates are lost at step 10 and 72% at step
#    64, as many as at 1e-3, and the final loss is 0.052, against 0.023 at 1e-3 and 0.020 with
#    AMP (2-core AMD EPYC Zen 4). Larger steps do not keep the small ones.

# %% [markdown]
# ## What to remember
#
# - `model.to(torch.bfloat16)` is not AMP: updates smaller than half a bf16 gap vanish (below
#   2^-9 for weights between 0.5 and 1), and the optimizer state is bf16 too. A larger learning
#   rate does not help past Adam's first step.
# - AMP keeps fp32 master weights. To keep bf16 weights, round the update stochastically (torchao's
#   `bf16_stochastic_round=True`) or compensate it (Kahan). For inference, cast once.
