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
# # 05 · AMP in practice: recipes, migration, troubleshooting, and DDP
#
# Lesson 03 wrote the basic AMP loop. Real training code needs more: a switch to turn AMP off,
# gradient accumulation, checkpoints, several models, regions that must stay in fp32, custom
# autograd functions, validation, old code to migrate, and a plan for when the loss turns into
# NaN. Each section below answers one of those questions with a short example that runs here and
# asserts what it claims. The last section scales the loop out to several processes with
# DistributedDataParallel (DDP).
#
# Every example uses the device the course package picks: on a CPU, autocast runs in bfloat16 and
# needs no GradScaler; on NVIDIA and AMD GPUs, float16 with a GradScaler. Seeds are fixed
# (`torch.manual_seed`), so every run of this notebook starts from the same weights.

# %%
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from amp_tutorial import ConvModel, describe_device, get_preset, make_problem, select_device
from amp_tutorial.checkpoint import load_checkpoint, save_checkpoint
from amp_tutorial.ddp import parameter_hash
from amp_tutorial.device import dtype_name, tf32_state
from amp_tutorial.measure import saved_activation_bytes
from amp_tutorial.nonfinite import NonFiniteLossError, check_finite_loss, first_nonfinite_module
from amp_tutorial.policy import FP32, FP32_OUT, header_rules

info = select_device()
preset = get_preset(device_type=info.type)
amp_dtype = info.amp_dtype
assert amp_dtype is not None, f"{info.device} has no usable AMP with this torch; try the CPU"
print(describe_device(info))
print(f"preset {preset.name!r}: grid {preset.grid}, hidden {preset.hidden}, {preset.steps} steps")

# Bit-for-bit comparisons below need deterministic kernels; on GPUs, ask cuDNN for them.
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False

inputs, targets = make_problem(preset.grid, info.device)
loss_fn = nn.MSELoss()
scratch = tempfile.TemporaryDirectory(prefix="amp05_")  # removed when the kernel stops
work_dir = Path(scratch.name)  # checkpoints and the DDP run go here


def new_model(seed: int = 0) -> nn.Module:
    """The lesson-03 model, freshly initialised from ``seed``."""
    torch.manual_seed(seed)
    return ConvModel(preset.hidden, preset.n_hidden_layers).to(info.device)


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


def accumulated_gradients(use_amp: bool, n_micro: int) -> list[torch.Tensor]:
    """One optimizer step from ``n_micro`` micro-batches; returns the unscaled gradients."""
    model = model_without_batchnorm()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(info.type, enabled=use_amp and info.needs_grad_scaler(amp_dtype))
    optimizer.zero_grad(set_to_none=True)
    for x, y in zip(inputs.chunk(n_micro, dim=2), targets.chunk(n_micro, dim=2), strict=True):
        with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
            loss = loss_fn(model(x), y) / n_micro
        scaler.scale(loss).backward()  # gradients add up in .grad
    scaler.unscale_(optimizer)  # only so we can look at them; step() would do it anyway
    gradients = [p.grad.clone() for p in model.parameters()]
    scaler.step(optimizer)  # once per accumulation
    scaler.update()
    return gradients


def relative_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    flat_a, flat_b = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
    return ((flat_a - flat_b).norm() / flat_b.norm()).item()


for use_amp in (False, True):
    diff = relative_difference(accumulated_gradients(use_amp, ACCUMULATION),
                               accumulated_gradients(use_amp, 1))
    label = dtype_name(amp_dtype) if use_amp else "fp32"
    print(f"{label}: {ACCUMULATION} accumulated micro-batches vs one batch, "
          f"relative gradient difference {diff:.2e}")
    assert diff < (2e-2 if use_amp else 1e-5)

# %% [markdown]
# In fp32 the two gradients agree to rounding error; under AMP they agree to the precision of the
# low-precision arithmetic, which is what AMP changes anyway.
#
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


def train_steps(run: dict, n: int, use_amp: bool = True) -> list[float]:
    model, optimizer, scaler = run["model"], run["optimizer"], run["scaler"]
    losses = []
    for _ in range(n):
        rows = torch.randperm(preset.grid, generator=run["data"])[: preset.grid // 4]
        rows = rows.to(info.device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
            loss = loss_fn(model(inputs[:, :, rows]), targets[:, :, rows])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


HALF = preset.steps // 2
uninterrupted = start_run()
train_steps(uninterrupted, 2 * HALF)

first_half = start_run()
train_steps(first_half, HALF)
checkpoint = save_checkpoint(work_dir / "amp.pt", first_half["model"], first_half["optimizer"],
                             first_half["scaler"], step=HALF,
                             data_rng=first_half["data"].get_state())

resumed = start_run(seed=123)  # different initial weights: everything must come from the file
extra = load_checkpoint(checkpoint, resumed["model"], resumed["optimizer"], resumed["scaler"],
                        map_location=info.device)
resumed["data"].set_state(extra["data_rng"])
train_steps(resumed, 2 * HALF - extra["step"])

print(f"scale after {2 * HALF} steps: uninterrupted {uninterrupted['scaler'].get_scale():.0f}, "
      f"resumed {resumed['scaler'].get_scale():.0f}")
assert same_parameters(resumed["model"], uninterrupted["model"])  # bit for bit
assert resumed["scaler"].get_scale() == uninterrupted["scaler"].get_scale()
assert resumed["scaler"].get_scale() > 2.0**10  # the scale did change during the run

# %% [markdown]
# What goes wrong when part of the state is missing: resume without the scaler's state and the
# scale restarts from its initial value; resume without the data generator's state and the
# second half trains on different batches.

# %%
no_scaler = start_run(seed=123)
load_checkpoint(checkpoint, no_scaler["model"], no_scaler["optimizer"], map_location=info.device)
no_scaler["data"].set_state(extra["data_rng"])
train_steps(no_scaler, 2 * HALF - extra["step"])
assert no_scaler["scaler"].get_scale() != uninterrupted["scaler"].get_scale()

no_data_state = start_run(seed=123)
load_checkpoint(checkpoint, no_data_state["model"], no_data_state["optimizer"],
                no_data_state["scaler"], map_location=info.device)
train_steps(no_data_state, 2 * HALF - extra["step"])
assert not same_parameters(no_data_state["model"], uninterrupted["model"])
print("missing scaler state -> scale differs; missing data state -> parameters differ")

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
                        amp_run["scaler"], map_location=info.device)
amp_run["data"].set_state(extra["data_rng"])
assert amp_run["scaler"].get_scale() == 2.0**10  # nothing to restore: initial scale
assert same_parameters(amp_run["model"], fp32_run["model"])
amp_losses = train_steps(amp_run, HALF, use_amp=True)
save_checkpoint(work_dir / "amp_from_fp32.pt", amp_run["model"], amp_run["optimizer"],
                amp_run["scaler"], step=2 * HALF)

back_to_fp32 = start_run(seed=7)
back_to_fp32["scaler"] = torch.amp.GradScaler(info.type, enabled=False)
load_checkpoint(work_dir / "amp_from_fp32.pt", back_to_fp32["model"], back_to_fp32["optimizer"],
                back_to_fp32["scaler"], map_location=info.device)
assert same_parameters(back_to_fp32["model"], amp_run["model"])
print(f"fp32 steps: loss {fp32_losses[0]:.4f} -> {fp32_losses[-1]:.4f}; "
      f"resumed with AMP: {amp_losses[0]:.4f} -> {amp_losses[-1]:.4f}")
assert amp_losses[-1] < fp32_losses[0]  # training carried on from where fp32 stopped

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

stepped_a = not same_parameters(model_a, before_a, buffers=False)
stepped_b = not same_parameters(model_b, before_b, buffers=False)
print(f"model a stepped: {stepped_a}; model b stepped: {stepped_b}; "
      f"scale {2.0**10:.0f} -> {scaler.get_scale():.0f}")
assert stepped_a and not stepped_b
assert scaler.get_scale() == 2.0**9

# %% [markdown]
# ## 5. Numerically sensitive regions and custom losses
#
# Autocast decides per op. On CUDA (and XPU) matmuls and convolutions run in low precision;
# `sum`, `prod`, `cumsum`, `cumprod`, `softmax`, `log_softmax` and the `linalg` vector and matrix
# norms return fp32 (unless you pass a `dtype=`); `exp`, `log`, `pow`, `logsumexp`, most losses
# and `layer_norm`, `group_norm`, `rms_norm` run in fp32. Other reductions, `mean`, `max`,
# `amax`, `var` and `std` among them, are on no list and stay in the dtype they are given. The
# CPU list differs (lesson 01), and so does MPS's (it keeps `batch_norm` in fp32, lesson 04).
# Your own code can need more care. Two tools:
#
# - `torch.autocast(device_type, enabled=False)` **inside** an autocast region turns autocasting
#   off for a block. Tensors coming in keep their dtype (bf16/fp16), so cast them explicitly with
#   `.float()`; mixing dtypes in a matmul would fail;
# - a custom loss that casts its inputs to fp32 first, so the reduction and the final value are
#   computed and stored in fp32 and keep their precision.

# %%
rules = header_rules()  # the CUDA/XPU lists of the installed torch's autocast_mode.h
if rules is not None:
    fp32_out = {"sum", "prod", "cumsum", "cumprod", "softmax.int", "log_softmax.int",
                "linalg_vector_norm", "linalg_matrix_norm"}
    assert all(rules[op] == FP32_OUT for op in fp32_out)
    assert all(rules[op] == FP32 for op in ("exp", "log", "logsumexp", "layer_norm", "mse_loss"))
    assert not {"mean", "max", "amax", "var", "std"} & set(rules)  # on no list
    print("reductions with an fp32 output on CUDA/XPU:", ", ".join(sorted(fp32_out)))

model = amp_model  # the AMP-trained model from section 1
model.eval()
with torch.autocast(info.type, dtype=amp_dtype):
    features = model.layers[:-1](inputs)  # everything before the last 1x1 conv
    with torch.autocast(info.type, enabled=False):
        # A Gram matrix over all pixels (a style-loss ingredient): sums of products of many
        # values, which we want in fp32. Without the cast it would run in the features' dtype.
        flat = features.float().flatten(2)
        gram = flat @ flat.transpose(1, 2) / flat.shape[-1]
    prediction = model.layers[-1](features)
model.train()
print(f"features {features.dtype}, gram {gram.dtype}, prediction {prediction.dtype}")
# the features end in BatchNorm + ReLU: 16-bit, except on MPS, whose autocast runs batch_norm
# in fp32 (lesson 04)
assert features.dtype == (torch.float32 if info.type == "mps" else amp_dtype)
assert prediction.dtype == amp_dtype
assert gram.dtype == torch.float32 and gram.isfinite().all()


def mse_in_fp32(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A custom loss that is safe under autocast: cast first, then compute and reduce in fp32."""
    return (prediction.float() - target.float()).pow(2).mean()


def mse_in_input_dtype(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The unsafe version: the loss is computed and stored in the prediction's dtype."""
    return (prediction - target.to(prediction.dtype)).pow(2).mean()


reference = F.mse_loss(prediction.float(), targets)
safe, unsafe = mse_in_fp32(prediction, targets), mse_in_input_dtype(prediction, targets)
eps = torch.finfo(amp_dtype).eps
print(f"reference {reference.item():.8f}; fp32 loss {safe.item():.8f} ({safe.dtype}); "
      f"{dtype_name(amp_dtype)} loss {unsafe.item():.8f} ({unsafe.dtype}, eps {eps:.1e})")
assert safe.dtype == torch.float32 and torch.allclose(safe, reference, rtol=1e-6)
assert unsafe.dtype == amp_dtype  # about 2.4 (bf16) or 3.3 (fp16) significant digits

# %% [markdown]
# ### Why `binary_cross_entropy` is refused, and `binary_cross_entropy_with_logits` is the fix
#
# On CUDA (and ROCm) and on Intel XPU, autocast refuses `F.binary_cross_entropy` / `nn.BCELoss`
# outright with a `RuntimeError`: both register `binary_cross_entropy_banned` for the op in
# PyTorch's `aten/src/ATen/autocast_mode.cpp`. The CPU's autocast puts it on its fp32 list
# instead and runs it in fp32 (measured below when this runs on a CPU). MPS does neither: its
# autocast registers nothing for `binary_cross_entropy`, so there it runs unprotected in fp16 or
# bf16, on whatever dtype it is given (and fails on 16-bit probabilities with fp32 targets, which
# is why the cell passes the targets in the probabilities' dtype). Either way the trouble starts
# one op earlier: a sigmoid computed in low precision rounds probabilities close
# to 1 to exactly 1.0, and the BCE of a wrong prediction of 1.0 is `-log(0)`. PyTorch clamps
# that log at -100, so instead of a large loss and a useful gradient you get a flat 100.
# `binary_cross_entropy_with_logits` takes the logits, fuses sigmoid and log into one stable
# formula, and autocast runs it in fp32 on every device.

# %%
model = new_model()
with torch.autocast(info.type, dtype=amp_dtype):
    logits = model(inputs)
    try:
        probabilities = torch.sigmoid(logits)
        bce = F.binary_cross_entropy(probabilities, targets.to(probabilities.dtype))
        refusal = None
    except RuntimeError as err:
        refusal = err
    bce_logits = F.binary_cross_entropy_with_logits(logits, targets)

if refusal is not None:
    print(f"{info.type} autocast refused it:\n  RuntimeError: {refusal}")
    assert "unsafe to autocast" in str(refusal)
    assert "binary_cross_entropy_with_logits" in str(refusal)
else:
    print(f"{info.type} autocast ran binary_cross_entropy in {bce.dtype} (no refusal here)")
    if info.type == "cpu":
        assert bce.dtype == torch.float32  # the CPU policy runs it in fp32
    if info.type == "mps":
        assert bce.dtype == amp_dtype  # on no MPS list: runs in 16-bit, unprotected
print(f"binary_cross_entropy_with_logits under autocast: {bce_logits.item():.4f} "
      f"({bce_logits.dtype})")
assert bce_logits.dtype == torch.float32 and bce_logits.isfinite()
bce_logits.backward()  # and it trains

# The underlying problem: a confident wrong prediction, logit 12, true label 0.
logit, label = torch.tensor([12.0]), torch.tensor([0.0])
p_low = torch.sigmoid(logit.to(amp_dtype))
via_probability = F.binary_cross_entropy(p_low.float(), label)
via_logits = F.binary_cross_entropy_with_logits(logit, label)
print(f"sigmoid(12) in {dtype_name(amp_dtype)} = {p_low.item()}; BCE from that probability "
      f"{via_probability.item():.1f}; BCE from the logit {via_logits.item():.6f}")
assert p_low.item() == 1.0 and via_probability.item() == 100.0  # clamped -log(0)
assert torch.allclose(via_logits, torch.tensor(12.0), atol=1e-4)

# %% [markdown]
# ## 6. Custom autograd functions: `torch.amp.custom_fwd` and `custom_bwd`
#
# Inside an autocast region, a custom `torch.autograd.Function` receives whatever dtypes the ops
# before it produced, and its `backward` runs later, outside the region. Two decorators make it
# behave:
#
# - `@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` on `forward`: inside an
#   autocast region, floating-point inputs are cast to fp32 and `forward` runs with autocast
#   **off** (without `cast_inputs`, `forward` runs under the caller's autocast state);
# - `@torch.amp.custom_bwd(device_type=...)` on `backward`: it runs with the same autocast state
#   as `forward` had.
#
# The example is a log-cosh loss, written in the stable form `|x| + log1p(exp(-2|x|)) - log 2`
# with the analytic gradient `tanh(x)`; it records the dtypes and autocast state it sees.

# %%
class LogCosh(torch.autograd.Function):
    """mean(log(cosh(prediction - target))), computed in fp32 whatever autocast is doing."""

    seen: dict = {}

    @staticmethod
    @torch.amp.custom_fwd(device_type=info.type, cast_inputs=torch.float32)
    def forward(ctx, prediction, target):
        LogCosh.seen["forward"] = (prediction.dtype, torch.is_autocast_enabled(info.type))
        diff = prediction - target
        ctx.save_for_backward(diff)
        per_pixel = diff.abs() + torch.log1p(torch.exp(-2 * diff.abs())) - torch.log(
            torch.tensor(2.0, device=diff.device))
        return per_pixel.mean()

    @staticmethod
    @torch.amp.custom_bwd(device_type=info.type)
    def backward(ctx, grad_output):
        (diff,) = ctx.saved_tensors
        LogCosh.seen["backward"] = (grad_output.dtype, torch.is_autocast_enabled(info.type))
        grad = grad_output * torch.tanh(diff) / diff.numel()
        return grad, -grad


model = new_model()
with torch.autocast(info.type, dtype=amp_dtype):
    prediction = model(inputs)
    loss = LogCosh.apply(prediction, targets)
loss.backward()
print(f"prediction {prediction.dtype}; forward saw {LogCosh.seen['forward']}, backward saw "
      f"{LogCosh.seen['backward']} (dtype, autocast enabled); loss {loss.dtype}")
assert prediction.dtype == amp_dtype
assert LogCosh.seen["forward"] == (torch.float32, False)
assert LogCosh.seen["backward"] == (torch.float32, False)
assert loss.dtype == torch.float32

# The analytic gradient agrees with autograd's for the same formula in fp32.
x = torch.randn(64, dtype=torch.float64, requires_grad=True)
zeros = torch.zeros(64, dtype=torch.float64)
assert torch.autograd.gradcheck(LogCosh.apply, (x, zeros))

# %% [markdown]
# ## 7. Validation under autocast
#
# Evaluation gets the same speed and memory benefit as training, and needs no scaler (there are
# no gradients). Three things belong in every evaluation loop: `model.eval()` (BatchNorm uses its
# running statistics and does not update them), `torch.inference_mode()` (no autograd graph), and
# the forward + loss under autocast. Put the model back in training mode afterwards.

# %%
@torch.inference_mode()
def evaluate(model: nn.Module, use_amp: bool) -> tuple[torch.Tensor, float]:
    was_training = model.training
    model.eval()
    with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
        output = model(inputs)
        loss = loss_fn(output, targets)
    model.train(was_training)
    return output, loss.item()


running_mean = amp_model.layers[1].running_mean.clone()
out_amp, val_amp = evaluate(amp_model, use_amp=True)
out_fp32, val_fp32 = evaluate(amp_model, use_amp=False)
print(f"validation loss of the AMP-trained model: {val_amp:.5f} under autocast "
      f"({out_amp.dtype}), {val_fp32:.5f} in fp32")
assert out_amp.dtype == amp_dtype and out_fp32.dtype == torch.float32
assert torch.is_inference(out_amp) and not out_amp.requires_grad
assert torch.equal(amp_model.layers[1].running_mean, running_mean)  # eval() froze BatchNorm
assert amp_model.training  # back in training mode
assert abs(val_amp - val_fp32) <= 0.05 * val_fp32

# %% [markdown]
# ## 8. Migrating old code
#
# AMP began as NVIDIA's Apex extension (`apex.amp`), moved into PyTorch as `torch.cuda.amp`,
# and became device-generic as `torch.amp` / `torch.autocast`. Apex's `amp` is deprecated and the
# `torch.cuda.amp` / `torch.cpu.amp` spellings are deprecated aliases. The mapping:

# %%
migration = pd.DataFrame([
    ("from torch.cuda.amp import autocast; with autocast():",
     'with torch.autocast("cuda"):  (or device_type=info.type)'),
    ("torch.cuda.amp.autocast(dtype=torch.bfloat16)",
     'torch.autocast("cuda", dtype=torch.bfloat16)'),
    ("torch.cpu.amp.autocast()", 'torch.autocast("cpu")  (bfloat16 by default)'),
    ("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")'),
    ("@torch.cuda.amp.custom_fwd / custom_bwd",
     '@torch.amp.custom_fwd(device_type="cuda") / custom_bwd(device_type="cuda")'),
    ('Apex: model, opt = amp.initialize(model, opt, opt_level="O1")',
     "delete it; put torch.autocast around forward + loss"),
    ('Apex: opt_level="O2" ("almost fp16": fp16 model, fp32 master weights, fp32 BatchNorm)',
     "closest: FSDP's MixedPrecision(param_dtype=..., reduce_dtype=...) (fully_shard: "
     "MixedPrecisionPolicy): 16-bit compute per module, fp32 sharded weights for the optimizer"),
    ('Apex: opt_level="O3" (pure fp16: model.half(), no master weights; a speed baseline)',
     "fp32 weights + torch.autocast (O1's replacement). Pure 16-bit weights lose small updates "
     "(lesson 09); pure fp16 + GradScaler raises (below)"),
    ("Apex: with amp.scale_loss(loss, opt) as scaled: scaled.backward()",
     "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()"),
    ("Apex: clip_grad_norm_(amp.master_params(opt), max_norm)",
     "scaler.unscale_(opt); clip_grad_norm_(model.parameters(), max_norm)"),
    ("Apex: amp.state_dict() / amp.load_state_dict()",
     "scaler.state_dict() / scaler.load_state_dict()  (section 3)"),
], columns=["old", "modern"])
migration.style.hide(axis="index").set_properties(**{"text-align": "left"})

# %% [markdown]
# Apex is not installed here, so its rows are a table only (the O levels are from Apex's
# `apex.amp` documentation: O1 mixed precision, O2 "almost fp16", O3 pure fp16, which that
# documentation offers as a speed baseline that may not train stably). O3 has no modern
# equivalent to aim for: its weights are 16-bit, so an update smaller than about 1/256 (bf16) or
# 1/2048 (fp16) of a weight rounds away and the weight never moves (lesson 09 measures it). The
# modern replacement is fp32 weights with autocast; pure bf16 weights (`model.to(torch.bfloat16)`,
# no scaler) run, with that same caveat. One O3 habit fails loudly in torch.amp: a model made
# `.half()` has fp16 gradients, and `GradScaler.step` refuses to unscale them (`unscale_` is called
# with `allow_fp16=False` in `torch/amp/grad_scaler.py`; FSDP's `ShardedGradScaler` passes
# `allow_fp16=True`). The scaler is built for fp32 master gradients: it divides them by the scale
# in place, in their own dtype, so the small true values it gives back fit in fp32 however far
# below fp16's range they are, and the step that follows updates fp32 weights, so small updates
# survive. With fp16 gradients and weights neither holds.

# %%
half_model = nn.Linear(4, 1).to(info.device).half()  # Apex O3 style: fp16 weights, fp16 grads
half_optimizer = torch.optim.SGD(half_model.parameters(), lr=0.1)
half_scaler = torch.amp.GradScaler(info.type)
half_scaler.scale(half_model(torch.ones(2, 4, device=info.device, dtype=torch.float16)).sum()
                  ).backward()
try:
    half_scaler.step(half_optimizer)
    refused = None
except ValueError as err:
    refused = err
print(f"GradScaler({info.type!r}).step with fp16 gradients: ValueError: {refused}")
assert str(refused) == "Attempting to unscale FP16 gradients."

# %% [markdown]
# The deprecated `torch.cuda.amp` and `torch.cpu.amp` spellings still run; here they run once with
# their warnings captured. Their danger is not the old name but the **hard-coded device**: on a
# machine without CUDA the CUDA spellings do not fail, they switch themselves off with a warning,
# so the "AMP" run is silently plain fp32. The new spellings with a hard-coded `"cuda"` do exactly
# the same: `torch.amp.GradScaler("cuda")` and `torch.autocast("cuda")` check for CUDA in their
# constructors (`torch/amp/grad_scaler.py`, `torch/amp/autocast_mode.py`) and disable themselves.
# And even where CUDA exists, `autocast("cuda")` only changes ops on CUDA tensors: a model left on
# the CPU runs in fp32 inside it. Pass the device type you actually use (`info.type` here).

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old_scaler = torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast():
        old_cuda_autocast_on = torch.is_autocast_enabled("cuda")
    with torch.cpu.amp.autocast():
        old_cpu_autocast_on = torch.is_autocast_enabled("cpu")

for w in caught:
    print(f"{w.category.__name__}: {w.message}")
future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
for old, new in [("torch.cuda.amp.GradScaler", "torch.amp.GradScaler('cuda'"),
                 ("torch.cuda.amp.autocast", "torch.amp.autocast('cuda'"),
                 ("torch.cpu.amp.autocast", "torch.amp.autocast('cpu'")]:
    assert any(old in m and "deprecated" in m and new in m for m in future), old
assert old_cpu_autocast_on
if torch.cuda.is_available():
    assert old_scaler.is_enabled() and old_cuda_autocast_on
else:
    assert not old_scaler.is_enabled() and not old_cuda_autocast_on  # silently off
    assert any(issubclass(w.category, UserWarning) and "Disabling" in str(w.message)
               for w in caught)
print(f"old GradScaler enabled: {old_scaler.is_enabled()}; old CUDA autocast active: "
      f"{old_cuda_autocast_on}")

with warnings.catch_warnings(record=True) as caught_new:  # the new names, "cuda" hard-coded
    warnings.simplefilter("always")
    new_scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda"):
        new_cuda_autocast_on = torch.is_autocast_enabled("cuda")
        cpu_autocast_on = torch.is_autocast_enabled("cpu")
        cpu_matmul = torch.ones(4, 4) @ torch.ones(4, 4)  # a CPU tensor, as in a CPU-only run
assert new_scaler.is_enabled() == old_scaler.is_enabled() == torch.cuda.is_available()
assert new_cuda_autocast_on == old_cuda_autocast_on
assert not cpu_autocast_on and cpu_matmul.dtype == torch.float32  # CPU ops untouched either way
if not torch.cuda.is_available():
    assert any("Disabling" in str(w.message) for w in caught_new)  # only a warning says so
for w in caught_new:
    print(f"new spelling, {w.category.__name__}: {w.message}")
print(f'GradScaler("cuda") enabled: {new_scaler.is_enabled()}; autocast("cuda") active: '
      f"{new_cuda_autocast_on}; a CPU matmul inside it: {cpu_matmul.dtype}")

# %% [markdown]
# ## 9. Troubleshooting
#
# ### The loss is inf or NaN
#
# With fp16, an occasional overflow in the *gradients* is normal: the GradScaler skips that step
# and halves the scale. A non-finite **loss** is different: the forward pass itself overflowed
# (or the data is bad), and no amount of step skipping fixes it; a scaler will just keep halving.
# So:
#
# 1. **Stop at once with a clear message.** `check_finite_loss(loss, step)` (from
#    `amp_tutorial.nonfinite`) raises `NonFiniteLossError` naming the step. Reading the loss
#    synchronises a GPU, so in long runs check every few steps.
# 2. **Find the op.** `first_nonfinite_module(model, fn)` runs `fn` with forward hooks on every
#    submodule and reports the first one whose output is inf/NaN although its inputs were
#    finite. For NaNs that appear only in backward, `torch.autograd.detect_anomaly()` names the
#    backward op (slowly).
# 3. **Fix the cause:** normalise inputs, run that region in fp32 (section 5), use a loss that
#    works on logits, or use bf16, which has fp32's range.
#
# The classic case: inputs in raw units. Here the coordinates are given in micrometres (up to
# 10^5) instead of [0, 1]. float16's largest value is 65504, so the first convolution's fp16
# input is already inf. We use fp16 autocast on every device for this demonstration (CPU autocast
# accepts float16 too) because fp16 is the dtype that overflows.

# %%
raw_inputs = inputs * 1e5  # micrometres instead of normalised coordinates
model = new_model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(info.type)
try:
    for step in range(3):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=torch.float16):
            loss = loss_fn(model(raw_inputs), targets)
        check_finite_loss(loss, step)  # the guard
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    stopped = None
except NonFiniteLossError as err:
    stopped = err
print(f"stopped: {stopped}")
assert isinstance(stopped, NonFiniteLossError) and "at step 0" in str(stopped)


def forward_fp16() -> None:
    with torch.autocast(info.type, dtype=torch.float16):
        model(raw_inputs)


culprit = first_nonfinite_module(model, forward_fp16)
print(f"first non-finite output: {culprit}")
assert culprit is not None and culprit.name == "layers.0" and culprit.dtype == torch.float16

with torch.autocast(info.type, dtype=torch.bfloat16):
    assert model(raw_inputs).isfinite().all()  # bf16 has fp32's range: no overflow
with torch.autocast(info.type, dtype=torch.float16):
    assert model(raw_inputs / 1e5).isfinite().all()  # normalised inputs: no overflow either

# %% [markdown]
# ### No speedup
#
# - **The network is too small or the GPU is starved.** AMP speeds up the arithmetic; if a step
#   is dominated by Python, kernel launches or data loading, there is nothing to gain. The
#   `smoke` preset (a 32x32 image, 16 channels) is such a case, which is why tests never assert a
#   speedup. Use the `paper` preset, larger batches, or `pdm run bench` to see the difference.
# - **Tensor-core-friendly sizes.** fp16/bf16 tensor cores work on tiles; channel counts, hidden
#   sizes and batch sizes that are multiples of 8 (fp16/bf16 on NVIDIA; larger multiples help
#   more) avoid padded or slower kernels. The cell below lists this model's layers that miss it.
# - **Your "fp32" was not fp32.** On NVIDIA Ampere and newer, cuDNN runs fp32 convolutions on
#   TF32 tensor cores by default (matmuls are not); torch >= 2.9 spells these switches
#   `torch.backends.cudnn.conv.fp32_precision` and `torch.backends.cuda.matmul.fp32_precision`,
#   older torch `allow_tf32`. The baseline is then already fast and AMP's gain is
#   smaller; lesson 03 names the baseline it measured, and `pdm run bench --strict-fp32` turns
#   TF32 off.
# - **First-call kernel search.** cuDNN (with `torch.backends.cudnn.benchmark = True`) and
#   MIOpen on ROCm can search for the fastest kernel the first time they see a shape; on ROCm that
#   first call can take seconds. MIOpen keeps what it found in its user database (by default
#   under `~/.config/miopen`, worth keeping in a volume in Docker). Warm up before timing, and
#   expect changing shapes (variable sequence lengths, a smaller last batch) to search again.

# %%
layer_sizes = pd.DataFrame([
    {"layer": name, "in channels": m.in_channels, "out channels": m.out_channels,
     "multiple of 8": m.in_channels % 8 == 0 and m.out_channels % 8 == 0}
    for name, m in new_model().named_modules() if isinstance(m, nn.Conv2d)
])
tf32 = tf32_state()  # read with the settings API this torch has
print(f"TF32 allowed for CUDA convolutions: {tf32['convolutions']}, matmuls: {tf32['matmuls']}")
assert tf32 == {"convolutions": True, "matmuls": False}  # PyTorch's defaults
assert not layer_sizes["multiple of 8"].iloc[[0, -1]].any()  # 2 coordinates in, 1 value out
assert get_preset("paper").hidden % 8 == 0  # the hidden layers, where the work is, are fine
layer_sizes.style.hide(axis="index")

# %% [markdown]
# Here only the first and last layers miss (2 input channels, 1 output), and they hold a
# negligible share of the work. Padding the input to 8 channels would not pay off.
#
# ### Memory does not drop (much)
#
# Peak GPU memory (`torch.cuda.max_memory_allocated`) counts **everything** alive at the peak:
#
# - weights, gradients and optimizer state: **fp32 under AMP too** (Adam keeps two more copies);
# - activations saved for backward: these are what AMP halves;
# - during the forward pass, autocast's cached low-precision copies of the weights (freed when the
#   region ends);
# - on top, the caching allocator holds freed blocks for reuse: `torch.cuda.memory_reserved()`
#   and `nvidia-smi` / `rocm-smi` show that larger number, and it does not shrink by itself.
#
# So a model whose memory is dominated by weights and optimizer state (large layers, small
# batches) gains little; a model dominated by activations (large images, long sequences, big
# batches) gains most. Counted for this model (the device-independent way, as in lesson 03):

# %%
def memory_breakdown(use_amp: bool) -> dict[str, float]:
    model = new_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def forward_and_loss():
        with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
            return loss_fn(model(inputs), targets)

    activations = saved_activation_bytes(forward_and_loss)
    forward_and_loss().backward()
    optimizer.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    return {"weights": weights, "gradients": gradients, "Adam state": state,
            "saved activations": activations}


memory = pd.DataFrame({"fp32": memory_breakdown(False),
                       f"AMP {dtype_name(amp_dtype)}": memory_breakdown(True)}) / 2**20
memory.loc["total"] = memory.sum()
ratio = memory.iloc[:, 1] / memory.iloc[:, 0]
assert (ratio[["weights", "gradients", "Adam state"]] == 1).all()  # AMP does not touch these
assert ratio["saved activations"] <= 0.55
print(f"activations {ratio['saved activations']:.2f}x, total {ratio['total']:.2f}x of fp32")
memory.round(3).rename(columns=lambda c: f"{c} (MB)")

# %% [markdown]
# ## 10. Several GPUs: DistributedDataParallel with AMP
#
# Once one device is not enough, the next step is data parallelism with `torch.distributed`:
# one process per device, each holding a full copy of the model and training on its own share of
# the data. After `backward()`, DDP all-reduces the gradients, so every process applies the same
# averaged gradient and the copies stay identical. AMP fits in unchanged:
#
# - autocast goes around the forward pass and loss **of the DDP-wrapped model**, as before;
# - each process has **its own GradScaler**. The gradients it checks are already all-reduced, so
#   an overflow anywhere shows up everywhere and all processes skip the step together;
# - the process group's backend moves the gradients: **NCCL** on NVIDIA GPUs (on ROCm the same
#   `nccl` name uses AMD's RCCL), **Gloo** on CPUs (here with bf16 autocast);
# - a `DistributedSampler` gives each process a different part of the data, and
#   `sampler.set_epoch(epoch)` reshuffles it every epoch (forget it and every epoch repeats the
#   first epoch's order);
# - only rank 0 prints and writes the checkpoint; every process calls
#   `destroy_process_group()` at the end, in a `finally` so that happens on errors too;
# - BatchNorm normalises with each process's *local* batch. On GPUs
#   `nn.SyncBatchNorm.convert_sync_batchnorm` computes the statistics over the global batch
#   instead; PyTorch's SyncBatchNorm does not run on CPU, so there each process keeps its own
#   batch statistics and DDP copies rank 0's running statistics to the others at each forward.
#
# `amp_tutorial.ddp` is such a training script for this lesson's problem: the image's rows are
# the dataset. `torchrun` starts the processes and tells each its rank:
#
# ```
# torchrun --standalone --nproc-per-node 4 -m amp_tutorial.ddp --checkpoint runs/ddp.pt
# python -m amp_tutorial.ddp --preset smoke      # one process, no torchrun
# ```
#
# Below it runs with 2 CPU processes at the `smoke` preset (`torchrun` is
# `python -m torch.distributed.run`; `--standalone` picks a free port on this machine).
# Rank 0 writes a JSON summary with every rank's hash of its parameters.

# %%
ddp_dir = work_dir / "ddp"
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "amp_tutorial.ddp", "--preset", "smoke", "--device", "cpu",
           "--checkpoint", str(ddp_dir / "model.pt"), "--summary", str(ddp_dir / "summary.json")]
print("$ torchrun", " ".join(command[3:]))
result = subprocess.run(command, capture_output=True, text=True, timeout=600)
print(result.stdout)
assert result.returncode == 0, result.stderr

# %%
summary = json.loads((ddp_dir / "summary.json").read_text())
print(f"{summary['world_size']} processes, backend {summary['backend']}, autocast "
      f"{summary['amp_dtype']}, {summary['steps']} steps; mean loss per epoch "
      f"{[round(x, 4) for x in summary['epoch_losses']]}")
for rank, digest in enumerate(summary["param_hashes"]):
    print(f"rank {rank}: parameters sha256 {digest[:16]}...")
assert summary["world_size"] == 2 and summary["backend"] == "gloo"
assert len(set(summary["param_hashes"])) == 1  # both processes ended with identical parameters
assert summary["epoch_losses"][-1] < summary["epoch_losses"][0]

# The checkpoint rank 0 wrote loads into a plain (unwrapped) model.
smoke = get_preset("smoke")
ddp_trained = ConvModel(smoke.hidden, smoke.n_hidden_layers)
extra = load_checkpoint(ddp_dir / "model.pt", ddp_trained)
assert parameter_hash(ddp_trained) == summary["param_hashes"][0]
print(f"checkpoint: step {extra['step']}, written by rank 0 of {extra['world_size']}")

# %% [markdown]
# On a machine with several GPUs, run the same script with one process per GPU:
# `torchrun --standalone --nproc-per-node $(nvidia-smi -L | wc -l) -m amp_tutorial.ddp`
# (on ROCm count with `rocm-smi`, or set the number yourself). Each process then uses
# `cuda:LOCAL_RANK`, NCCL/RCCL, fp16 autocast with its own GradScaler, and SyncBatchNorm.
#
# ## What to remember
#
# - `enabled=` on autocast and GradScaler gives one loop for fp32 and AMP.
# - Accumulate gradients with scaled micro-batch losses; `step` and `update` once per step.
# - Checkpoint model, optimizer **and** scaler (and your data order); fp32 and AMP checkpoints
#   are interchangeable because weights stay fp32.
# - One scaler for many models and optimizers: `step` each, `update` once.
# - Keep sensitive math in fp32 with `autocast(enabled=False)` and explicit casts; use
#   `binary_cross_entropy_with_logits`; decorate custom Functions with `custom_fwd`/`custom_bwd`.
# - Validate with `model.eval()`, `torch.inference_mode()` and autocast, no scaler.
# - Replace `torch.cuda.amp.*` and Apex, and never hard-code `"cuda"`: without CUDA,
#   `GradScaler("cuda")` and `autocast("cuda")` quietly switch AMP off, old names or new. Pure
#   fp16 (Apex O3) with a GradScaler raises "Attempting to unscale FP16 gradients."
# - A non-finite loss is a forward-pass problem: stop, find the first module, fix the cause.
# - DDP + AMP: autocast around the wrapped model, a scaler per process, `set_epoch`, rank 0 writes.
