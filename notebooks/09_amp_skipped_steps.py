# ---
# jupyter:
#   amp_tutorial:
#     minutes:
#       cpu: 0.4
#       smoke: 0.4
#     needs: any device, CPU included
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
# # 09 · AMP pitfalls: skipped steps, schedulers, and what autocast leaves alone
#
# The questions people ask most once their AMP loop runs, each answered by a cell that shows the
# behaviour on this machine and asserts it:
#
# 1. **Skipped steps and learning-rate schedulers**: why the first float16 steps are skipped,
#    where the warning "Detected call of `lr_scheduler.step()` before `optimizer.step()`" comes
#    from, how to notice a skipped step, how to log the scale, and what a collapsing scale means.
# 2. **Autocast gotchas**: calls autocast does not touch (in-place ops, `out=`, explicit
#    `dtype=`), its weight-cast cache and `torch.no_grad()`, autocast state and threads, and the
#    gradient-penalty recipe with a GradScaler.
#
# float16 with a GradScaler runs on the GPU where there is one, and on the CPU otherwise (CPU
# autocast accepts float16, and `torch.amp.GradScaler("cpu")` exists; lesson 02 uses the same
# setup). Seeds are fixed (`torch.manual_seed(0)`), so each run starts from the same weights.

# %%
import threading
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from IPython.display import display

from amp_tutorial.data import make_problem
from amp_tutorial.device import describe_device, select_device
from amp_tutorial.gradients import snapshot, update_norm
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import get_preset

info = select_device()
preset = get_preset(device_type=info.type)
print(describe_device(info))
print(f"preset {preset.name!r}: {preset.description}")

# %%
fp16_device = info.device if torch.float16 in info.amp_dtypes or info.type == "cpu" else (
    torch.device("cpu"))
hidden = preset.hidden if fp16_device.type != "cpu" else min(preset.hidden, 16)  # see lesson 02
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
# the cheap way, from the scale: `scaler.update()` lowers it only after a skipped step. (If the
# first step does not overflow by itself on this device and size, the loop puts an inf into one
# gradient at step 0, as an overflow would.)

# %%
N_STEPS = 8


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
            log.append({"step": step, "scale used": scale_used, "skipped": skipped,
                        "weights moved": update_norm(before, model.parameters()) > 0,
                        "natural overflow": overflowed,
                        "lr of the step": optimizer.param_groups[0]["lr"]})
            if step_scheduler_when_skipped or not skipped:
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

# %% [markdown]
# The `scale used` column is also the thing to **log** in a real run (next to the loss, every N
# steps): `scaler.get_scale()` is a cheap float. A healthy float16 run backs off a few times at
# the start, then holds or slowly grows (by 2x after `growth_interval`, 2000 good steps in a
# row). Skips are rare, isolated, and the scale settles far above 1.
#
# ### A collapsing scale
#
# A scale that keeps falling is the signature of a different problem: the forward pass produces
# inf or NaN at **every** step, so every step is skipped and the scale halves each time. Here the
# inputs are not normalised (multiplied by 10^5), so float16 activations overflow (float16's
# largest value is 65504):

# %%
COLLAPSE_STEPS = 30
model = new_model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(fp16_device.type)
small_inputs, small_targets = make_problem(32, fp16_device)
bad_inputs = small_inputs * 1e5  # un-normalised data
start = snapshot(model.parameters())
scales, finite_losses = [], []
for _ in range(COLLAPSE_STEPS):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(fp16_device.type, dtype=torch.float16):
        loss = F.mse_loss(model(bad_inputs), small_targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    scales.append(scaler.get_scale())
    finite_losses.append(bool(torch.isfinite(loss)))

# %%
print(f"scale after {COLLAPSE_STEPS} steps: {scales[-1]:.3g}; finite losses: {sum(finite_losses)}")
assert not any(finite_losses)  # the loss itself is not finite: a forward-pass problem
assert scales[-1] == 2.0**16 * 0.5**COLLAPSE_STEPS < 1e-4  # halved at every single step
assert update_norm(start, model.parameters()) == 0.0  # and the model never trained

fig, ax = plt.subplots(figsize=(8, 3.5))
ax.plot(range(1, N_STEPS + 1), np.log2(naive_log["scale used"].to_numpy() / 2), marker="o",
        label="healthy run (normal inputs)")
ax.plot(range(1, COLLAPSE_STEPS + 1), np.log2(scales), marker=".",
        label="collapsing run (inf in every forward pass)")
ax.set(title="GradScaler scale after each step", xlabel="training step",
       ylabel="scale (log2)")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# (The healthy curve is drawn from the `scale used` log shifted by one step, close enough for a
# picture.) Lowering the scale can fix an overflow **in the gradients**; it cannot fix an inf in
# the **loss**, which is computed before any scaling. So: if `scaler.get_scale()` falls below
# about 1 and keeps falling, stop and look at the forward pass (lesson 08's "The loss is inf or
# NaN" section finds the first module that produced it); typical causes are unnormalised inputs,
# a large logit exponentiated in float16, or a division by a tiny number. Checking
# `torch.isfinite(loss)` each step catches it on the first step instead of the hundredth.
#
# ## 2. Autocast gotchas
#
# ### Calls autocast leaves alone
#
# The torch.amp docs ("Op-Specific Behavior") list what autocast does not touch: only
# out-of-place ops are eligible; **in-place** ops and calls with an **`out=`** tensor run in the
# dtype of the tensors they write to; and ops called with an **explicit `dtype=`** keep that
# dtype. To see autocast's own decision, every call below is compared with the same call with
# autocast off. `mm` is on autocast's lower-precision list on every device type; `prod` runs in
# float32 everywhere too: on the float32 list of the CPU and of MPS (plain `fp32`), and on CUDA
# and XPU on the float32-with-output-dtype list (`fp32_set_opt_dtype`), whose rule is to keep a
# dtype the caller passed (`aten/src/ATen/autocast_mode.cpp` and `.h`).

# %%
low = info.amp_dtype
dev = info.device
torch.manual_seed(0)
a, b = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)
near_one = (1 + 0.01 * torch.randn(32, device=dev)).to(low)  # a product that stays in range


def calls(autocast_on: bool) -> dict[str, torch.Tensor]:
    with torch.autocast(info.type, dtype=low, enabled=autocast_on):
        result = {"mm(a, b)": torch.mm(a, b)}
        result["mm(a, b, out=fp32)"] = torch.mm(a, b, out=torch.empty(64, 64, device=dev))
        result["c.addmm_(a, b), in place"] = a.clone().addmm_(a, b)
        result["prod(x_low)"] = torch.prod(near_one)
        result["prod(x_low, dtype=low)"] = torch.prod(near_one, dtype=low)
    return result


on, off = calls(True), calls(False)
table = pd.DataFrame({name: {"autocast off": str(off[name].dtype), "autocast on": str(t.dtype),
                             "same values": torch.equal(t, off[name])}
                      for name, t in on.items()}).T
display(table)

# %%
assert on["mm(a, b)"].dtype == low and not torch.equal(on["mm(a, b)"].float(), off["mm(a, b)"])
assert on["mm(a, b, out=fp32)"].dtype == torch.float32  # out=: not autocast
assert torch.equal(on["mm(a, b, out=fp32)"], off["mm(a, b, out=fp32)"])  # computed in fp32
assert torch.equal(on["c.addmm_(a, b), in place"], off["c.addmm_(a, b), in place"])  # in place
assert off["prod(x_low)"].dtype == low and on["prod(x_low)"].dtype == torch.float32  # fp32 list
assert on["prod(x_low, dtype=low)"].dtype == low  # explicit dtype= wins

# %% [markdown]
# So a hand-written `out=` buffer or an in-place update inside the autocast block runs at full
# precision (and full cost); and an explicit `dtype=` is obeyed even where autocast would have
# chosen float32 for safety.
#
# ### The weight-cast cache, and `torch.no_grad()` inside autocast
#
# Inside one autocast region, autocast casts each float32 weight to the low dtype once and reuses
# the copy (`cached_cast` in `autocast_mode.cpp`). It caches only **leaf** float32 tensors that
# **require grad**, i.e. parameters; other tensors are cast at every use. The cache is dropped
# when the outermost autocast region exits. The two uses of a weight below share one cast node
# in the autograd graph; a non-leaf copy of the same weight does not:

# %%
weight = torch.nn.Parameter(torch.randn(64, 64, device=dev))
not_leaf = weight * 1.0
with torch.autocast(info.type, dtype=low):
    uses = [torch.mm(a, weight), torch.mm(b, weight), torch.mm(a, not_leaf), torch.mm(b, not_leaf)]
cast_nodes = [u.grad_fn.next_functions[1][0] for u in uses]
print([type(n).__name__ for n in cast_nodes])
assert cast_nodes[0] is cast_nodes[1]  # the parameter was cast once and reused
assert cast_nodes[2] is not cast_nodes[3]  # the non-leaf tensor was cast at each use
with torch.autocast(info.type, dtype=low, cache_enabled=False):
    uncached = [torch.mm(a, weight), torch.mm(b, weight)]
assert uncached[0].grad_fn.next_functions[1][0] is not uncached[1].grad_fn.next_functions[1][0]

# %% [markdown]
# The documented caveat is what happens when part of the region runs under `torch.no_grad()`:
# a cast made there has no autograd history, and older PyTorch releases put it in the cache
# anyway, so a later forward in the same autocast region silently lost its gradient (PyTorch
# issues #112583 and #158232; pull request #165068, which fixes #158232, always makes cached
# casts with grad enabled). Measured on this torch:

# %%
layer = torch.nn.Linear(64, 64).to(dev)
results = {}
for cache in (True, False):
    layer.zero_grad(set_to_none=True)
    with torch.autocast(info.type, dtype=low, cache_enabled=cache):
        with torch.no_grad():
            layer(a)  # e.g. a metric or an EMA teacher, computed inside the region
        out = layer(a)
    out.float().sum().backward()
    results[f"cache_enabled={cache}"] = layer.weight.grad is not None
print(f"torch {torch.__version__}: weight gets a gradient after a no_grad forward: {results}")
assert results["cache_enabled=False"]  # always safe
if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 14):
    assert results["cache_enabled=True"]  # fixed in the torch this course pins

# %% [markdown]
# On an older torch, if `out.requires_grad` is unexpectedly False, run the `no_grad` pass outside
# the autocast region or pass `cache_enabled=False`.
#
# ### Autocast state belongs to the thread
#
# The autocast docs: "The autocast state is thread-local. If you want it enabled in a new thread,
# the context manager or decorator must be invoked in that thread." A thread started inside an
# autocast block runs its ops at full precision:

# %%
seen = {}


def in_a_thread() -> None:
    seen["enabled"] = torch.is_autocast_enabled(info.type)
    seen["mm dtype"] = torch.mm(a, b).dtype
    seen["default dtype"] = torch.get_autocast_dtype(info.type)


other = torch.float16 if low == torch.bfloat16 else torch.bfloat16  # not the device default
outer = other if other in info.amp_dtypes or info.type == "cpu" else low
with torch.autocast(info.type, dtype=outer):
    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    main_mm = torch.mm(a, b).dtype
print(f"main thread: mm in {main_mm}; new thread: autocast on {seen['enabled']}, mm in "
      f"{seen['mm dtype']}, autocast dtype if it turned autocast on: {seen['default dtype']}")
assert main_mm == outer and not seen["enabled"] and seen["mm dtype"] == torch.float32

# %% [markdown]
# `torch.nn.DataParallel` runs each replica's forward in its own thread. Its worker
# (`torch/nn/parallel/parallel_apply.py`) re-enters autocast itself, but passes on only whether
# it was **enabled**, not the dtype: the replicas use the device's default autocast dtype, which
# the thread above shows is the default (float16 on CUDA), not the one you chose. A bfloat16
# region around a `DataParallel` model therefore runs its replicas in float16. Prefer
# `DistributedDataParallel` with one process per GPU (lesson 10), or put
# `@torch.autocast(device_type=..., dtype=...)` on the model's `forward`, which runs inside each
# thread. The same goes for your own threads and thread pools.

# %%
if outer != torch.get_autocast_dtype(info.type):  # the dtype does not cross into a new thread
    assert seen["default dtype"] != outer

# %% [markdown]
# ### Gradient penalty with a GradScaler
#
# A gradient penalty adds the norm of the gradients to the loss, so it needs gradients *inside*
# the step: `torch.autograd.grad(..., create_graph=True)`. With a GradScaler those gradients come
# from the scaled loss, so they are scaled too and must be unscaled **by hand** (not with
# `scaler.unscale_`, which works on `.grad` and the optimizer) before they enter the penalty. The
# recipe of the torch.amp examples page ("Gradient penalty"), with a check against float32:

# %%
small_model = new_model()
optimizer = torch.optim.Adam(small_model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(fp16_device.type, init_scale=2.0**10)
params = list(small_model.parameters())

optimizer.zero_grad(set_to_none=True)
with torch.autocast(fp16_device.type, dtype=torch.float16):
    loss = F.mse_loss(small_model(small_inputs), small_targets)
scaled_grads = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
inv_scale = 1.0 / scaler.get_scale()
grads = [g * inv_scale for g in scaled_grads]  # unscaled by hand, still part of the graph
with torch.autocast(fp16_device.type, dtype=torch.float16):
    penalty = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    total = loss + penalty
scaler.scale(total).backward()
before = snapshot(params)
scaler.step(optimizer)
scaler.update()

# %%
fp32_model = new_model()  # the same starting weights, no autocast, no scaler
fp32_grads = torch.autograd.grad(F.mse_loss(fp32_model(small_inputs), small_targets),
                                 list(fp32_model.parameters()))
fp32_penalty = torch.stack([g.pow(2).sum() for g in fp32_grads]).sum().sqrt()
scaled_penalty = torch.stack([g.float().pow(2).sum() for g in scaled_grads]).sum().sqrt()
print(f"penalty: fp16 recipe {penalty.item():.5g}, fp32 {fp32_penalty.item():.5g}; "
      f"from the scaled gradients it would be {scaled_penalty.item():.5g}")
assert torch.isclose(penalty.float(), fp32_penalty, rtol=0.05)
assert torch.isclose(scaled_penalty / penalty.float(), torch.tensor(2.0**10), rtol=1e-2)
assert update_norm(before, params) > 0  # the step was taken

# %% [markdown]
# Forgetting the `* inv_scale` makes the penalty `scale` times too large (65536 times at the
# default start), and it changes as the scale changes. If a scaled gradient overflowed, the
# penalty is inf, the total loss's gradients are inf too, and `scaler.step` skips the step as
# usual.
#
# ## What to remember
#
# - The first float16 steps are often skipped while the scale finds its level; a scheduler
#   stepped every iteration then warns "Detected call of `lr_scheduler.step()` before
#   `optimizer.step()`". Usually harmless; to keep the schedule aligned, step it only when
#   `scaler.get_scale()` did not go down.
# - Log `scaler.get_scale()`. A few early drops are normal; a scale that keeps halving means the
#   forward pass makes inf/NaN every step: check `torch.isfinite(loss)` and fix the cause.
# - Autocast leaves in-place ops, `out=` calls and explicit `dtype=` alone.
# - The cast cache holds parameter casts for one autocast region; on an old torch, a `no_grad`
#   pass inside the region could cost the next forward its gradients.
# - Autocast state is per thread; `DataParallel` passes on only on/off, not the dtype.
# - Gradient penalty: `autograd.grad` of the scaled loss, multiply by `1 / scaler.get_scale()`,
#   penalty under autocast, then the usual `scaler.scale(total).backward()`, step, update.
