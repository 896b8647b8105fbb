# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 25
#     memory:
#       cpu: 8
#       paper: 16
#     minutes:
#       cpu: 0.2
#       small: 0.1
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
# # 10 · Autocast gotchas: what autocast does not do for you
#
# Lesson 01 showed how autocast picks a dtype per op from its lists; lesson 09 answered the
# questions about skipped float16 steps. This lesson collects the surprises that remain once an
# AMP loop runs, each answered by a cell that shows the behaviour on this machine and asserts it:
# the calls autocast does not touch (in-place ops, `out=`, explicit `dtype=`), its weight-cast
# cache and `torch.no_grad()`, autocast state and threads, and the gradient-penalty recipe with a
# GradScaler (lesson 02).
#
# Sections 1 to 3 run on this device in its autocast dtype. The gradient penalty uses float16
# with a GradScaler, on the GPU where there is one and on the CPU otherwise (CPU autocast accepts
# float16, and `torch.amp.GradScaler("cpu")` exists; lesson 02 uses the same setup). Seeds are
# fixed (`torch.manual_seed(0)`), so each run starts from the same numbers.

# %%
import copy
import threading

import pandas as pd
import torch
import torch.nn.functional as F
from IPython.display import display

from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, select_device
from amp_tutorial.gradients import snapshot, update_norm
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import fp16_width, get_preset

info = select_device()
preset = get_preset(device_type=info.type)
torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset))

# %% [markdown]
# ## 1. Calls autocast leaves alone
#
# The torch.amp docs ("Op-Specific Behavior") list what autocast does not touch: only out-of-place
# ops are eligible; **in-place** ops and calls with an **`out=`** tensor run on the dtypes they are
# given, autocast or not (an elementwise op such as `add_` writes its result in the target's dtype,
# and the matmul family refuses mixed dtypes: `ADDMM_META` in `LinearAlgebra.cpp` raises for
# `bf16.addmm_(fp32, fp32)`); and ops called with an **explicit `dtype=`** keep that dtype. To see
# autocast's own decision, every call below is compared with the same call with autocast off. `mm`
# is on autocast's lower-precision list on every device type; `prod` runs in float32 everywhere too:
# on the float32 list of the CPU and of MPS (plain `fp32`), and on CUDA and XPU on the
# float32-with-output-dtype list (`fp32_set_opt_dtype`), whose rule is to keep a dtype the caller
# passed (`aten/src/ATen/autocast_mode.cpp` and `.h`).

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


def refused(call) -> bool:
    """True if the call raises a dtype mismatch, as mixed-dtype matmuls do."""
    try:
        call()
    except RuntimeError as err:
        return "dtype" in str(err)
    return False


with torch.autocast(info.type, dtype=low):  # in place and out=: the dtypes given, no casts
    assert a.to(low).add_(b).dtype == low  # elementwise: written in the target's dtype
    assert refused(lambda: a.to(low).addmm_(a, b))  # "self and mat2 must have the same dtype"
    assert refused(lambda: torch.mm(a, b, out=torch.empty(64, 64, dtype=low, device=dev)))

# %% [markdown]
# So a hand-written `out=` buffer or an in-place update inside the autocast block runs at full
# precision (and full cost); and an explicit `dtype=` is obeyed even where autocast would have
# chosen float32 for safety.
#
# ## 2. The weight-cast cache, and `torch.no_grad()` inside autocast
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
# casts with grad enabled). Probed on torch 2.9.0, 2.11.0 and 2.14.1 here: 2.9 still has the
# gotcha (the second forward's output does not require grad, so `backward()` would raise),
# 2.11 and 2.14 are fixed. Measured on this torch:

# %%
layer = torch.nn.Linear(64, 64).to(dev)
results = {}
for cache in (True, False):
    layer.zero_grad(set_to_none=True)
    with torch.autocast(info.type, dtype=low, cache_enabled=cache):
        with torch.no_grad():
            layer(a)  # e.g. a metric or an EMA teacher, computed inside the region
        out = layer(a)
    if out.requires_grad:  # False where the cached no_grad cast cut the graph (torch 2.9)
        out.float().sum().backward()
    results[f"cache_enabled={cache}"] = layer.weight.grad is not None
print(f"torch {torch.__version__}: weight gets a gradient after a no_grad forward: {results}")
assert results["cache_enabled=False"]  # always safe
version = torch.torch_version.TorchVersion(torch.__version__)
if version >= (2, 11):
    assert results["cache_enabled=True"]  # fixed (2.11 and 2.14 probed)
elif version < (2, 10):
    assert not results["cache_enabled=True"]  # the gotcha, still in 2.9

# %% [markdown]
# On torch 2.9, if `out.requires_grad` is unexpectedly False, run the `no_grad` pass outside
# the autocast region or pass `cache_enabled=False`.
#
# ## 3. Autocast state belongs to the thread
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
# `torch.nn.DataParallel` runs each replica's forward in its own thread when it has two or more
# devices (with one, or on MPS or a CPU, it calls the module in your thread, under your
# autocast). Its worker (`torch/nn/parallel/parallel_apply.py`) reads `torch.is_autocast_enabled()`
# with no device type, which is **CUDA's** switch, and re-enters autocast with no dtype: as
# `torch.amp.autocast("cuda", enabled=...)` in torch 2.9 (DataParallel is CUDA-only there), as
# `torch.amp.autocast(device_type, enabled=...)` for the current accelerator's type in 2.11 and
# 2.14. The cell below shows which switch that bare call reads. On CUDA the replicas therefore
# use the thread's default autocast dtype, float16, not the one you chose: a bfloat16 region
# around a `DataParallel` model runs its replicas in float16. On other accelerators (XPU, torch
# 2.11 and newer) CUDA's switch is off, so the replicas run with autocast **off**. Prefer
# `DistributedDataParallel` with one process per GPU (lesson 11), or put
# `@torch.autocast(device_type=..., dtype=...)` on the model's `forward`, which runs inside each
# thread. The same goes for your own threads and thread pools.

# %%
from amp_tutorial.autocast_policy import autocast_flags

if outer != torch.get_autocast_dtype(info.type):  # the dtype does not cross into a new thread
    assert seen["default dtype"] != outer
bare = {}  # autocast switched on for one device type at a time: what the bare call says
for device_type in ("cuda", "xpu", "mps", "cpu"):
    with autocast_flags(device_type, low):
        bare[device_type] = torch.is_autocast_enabled()  # no device type given
print("torch.is_autocast_enabled(), with autocast switched on only for: "
      + ", ".join(f"{device_type} {on}" for device_type, on in bare.items()))
assert bare == {"cuda": True, "xpu": False, "mps": False, "cpu": False}  # CUDA's switch only

# %% [markdown]
# ## 4. Gradient penalty with a GradScaler
#
# A gradient penalty adds the norm of the gradients to the loss, so it needs gradients *inside*
# the step: `torch.autograd.grad(..., create_graph=True)`. With a GradScaler those gradients come
# from the scaled loss, so they are scaled too and must be unscaled **by hand** (not with
# `scaler.unscale_`, which works on `.grad` and the optimizer) before they enter the penalty. The
# recipe of the torch.amp examples page ("Gradient penalty"), with a check against float32:

# %%
# float16 + GradScaler on the GPU, or on the CPU (which accepts float16 too), as in lesson 02
fp16_device = info.device if torch.float16 in info.amp_dtypes or info.type == "cpu" else (
    torch.device("cpu"))
hidden = fp16_width(preset, fp16_device.type)  # see lesson 02
small_inputs, small_targets = make_problem(32, fp16_device)
torch.manual_seed(0)
small_model = ConvModel(hidden, preset.n_hidden_layers).to(fp16_device)
fp32_model = copy.deepcopy(small_model)  # the same starting weights, for the check below
print(f"float16 + GradScaler run on {fp16_device}; network width {hidden}")

# %%
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
# the float32 reference: the same starting weights, no autocast, no scaler
fp32_grads = torch.autograd.grad(F.mse_loss(fp32_model(small_inputs), small_targets),
                                 list(fp32_model.parameters()))
fp32_penalty = torch.stack([g.pow(2).sum() for g in fp32_grads]).sum().sqrt()
scaled_penalty = torch.stack([g.float().pow(2).sum() for g in scaled_grads]).sum().sqrt()
print(f"penalty: fp16 recipe {penalty.item():.5g}, fp32 {fp32_penalty.item():.5g}; "
      f"from the scaled gradients it would be {scaled_penalty.item():.5g}")
assert torch.isclose(penalty.float(), fp32_penalty, rtol=0.05)
# without the unscaling the penalty is the scale (2**10 here) times the fp32 one
assert torch.isclose(scaled_penalty, fp32_penalty / inv_scale, rtol=0.05)
# at 128+ channels (a GPU's width, run on a CPU) the penalty's float16 second backward gave NaN
# in the first layer's gradient at every scale (float32: finite); the scaler then skips the step
nonfinite = not all(torch.isfinite(p.grad).all() for p in params)
print("step skipped: a gradient was inf/NaN" if nonfinite else "step taken")
assert (update_norm(before, params) > 0) != nonfinite  # taken exactly when all were finite

# %% [markdown]
# Forgetting the `* inv_scale` makes the penalty `scale` times too large (65536 times at the
# default start), and it changes as the scale changes. If a scaled gradient overflowed, the
# penalty is inf, the total loss's gradients are inf too, and `scaler.step` skips the step as
# usual. Run on a CPU at a GPU's width (128 or 256 channels, `AMP_TUTORIAL_GPU_SIZES=1`), this
# recipe's float16 second backward gave NaN in the first convolution's gradients at every scale
# from 2^-8 to 2^10 (float32: finite), so every such step was skipped; whether a GPU's float16
# kernels do the same was not run (docs/gpu-register.md). Watch `scaler.get_scale()`: a scale that
# keeps halving says the penalty's steps are being skipped.

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **Out of place.** In section 1, replace `a.clone().addmm_(a, b)` with `a.clone().addmm(a, b)`.
#    That row's "autocast on" column now shows the low dtype, "same values" is False, and the
#    in-place assert fails: out-of-place `addmm`, like `mm`, is on autocast's lower-precision list.
# 2. **Autocast in the thread.** In section 3, wrap the body of `in_a_thread` in
#    `with torch.autocast(info.type, dtype=outer):`. The new thread now reports autocast on and
#    `mm` in `outer` (float16 on a CPU in bf16 mode, bfloat16 in fp16 mode), so the assert fails:
#    entering autocast inside the thread is the fix.
# 3. **Forget to unscale.** In section 4, replace `g * inv_scale` with `g`. The recipe's penalty
#    becomes about 1024 times fp32's, the cell's `init_scale=2.0**10` (2505.8 against 2.4418 at
#    `smoke` on a CPU), and the first assert fails.

# %% [markdown]
# ## What to remember
#
# - Autocast leaves in-place ops, `out=` calls and explicit `dtype=` alone.
# - The cast cache holds parameter casts for one autocast region; on torch 2.9, a `no_grad`
#   pass inside the region could cost the next forward its gradients.
# - Autocast state is per thread; `DataParallel`'s replica threads get CUDA's on/off, never the
#   dtype (elsewhere autocast is off in them).
# - Gradient penalty: `autograd.grad` of the scaled loss, multiply by `1 / scaler.get_scale()`,
#   penalty under autocast, then the usual `scaler.scale(total).backward()`, step, update.
