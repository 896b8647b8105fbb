# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 35
#     memory:
#       cpu: 359
#       paper: 2844
#     minutes:
#       cpu: 0.5
#       small: 0.2
#       smoke: 0.2
#     needs: any device, CPU included; the old `torch.cuda.amp` spellings work only
#       on CUDA
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
# # 08 · Migrating old AMP code, and troubleshooting
#
# Much AMP code in the wild predates `torch.amp`: it uses NVIDIA's Apex or the `torch.cuda.amp`
# spellings. The first section maps it to the modern API and shows the two ways old habits fail
# (silently, or with an error). The second is what to do when AMP misbehaves: a loss that turns
# into inf or NaN, no speedup, memory that does not drop. It builds on the loop of lessons 03 and
# 05, the checkpoints of lesson 05 and the fp32 regions of lesson 07.
#
# On a CPU, autocast runs in bfloat16; on NVIDIA and AMD GPUs, float16. Seeds are fixed
# (`torch.manual_seed`), so every run of this notebook starts from the same weights.

# %%
import warnings

import pandas as pd
import torch
from torch import nn

from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, dtype_name, select_device, tf32_state
from amp_tutorial.measure import saved_bytes
from amp_tutorial.models import seeded_conv_model
from amp_tutorial.nonfinite import NonFiniteLossError, check_finite_loss, first_nonfinite_module
from amp_tutorial.presets import get_preset

info = select_device()
preset = get_preset(device_type=info.type)
amp_dtype = info.amp_dtype
assert amp_dtype is not None, f"{info.device} has no usable AMP with this torch; try the CPU"
print(device_line(info, preset))

# %%
inputs, targets = make_problem(preset.grid, info.device)
loss_fn = nn.MSELoss()


def new_model(seed: int = 0) -> nn.Module:
    """The lesson-03 model, freshly initialised from ``seed``."""
    return seeded_conv_model(preset, info.device, seed)


# %% [markdown]
# ## 1. Migrating old code
#
# AMP began as NVIDIA's Apex extension (`apex.amp`), moved into PyTorch as `torch.cuda.amp`,
# and became device-generic as `torch.amp` / `torch.autocast`. Apex's `amp` is deprecated and the
# `torch.cuda.amp` / `torch.cpu.amp` spellings are deprecated aliases. The mapping:

# %%
renamed = [  # the deprecated torch.cuda.amp / torch.cpu.amp spellings
    ("from torch.cuda.amp import autocast; with autocast():",
     'with torch.autocast("cuda"):  (or device_type=info.type)'),
    ("torch.cuda.amp.autocast(dtype=torch.bfloat16)",
     'torch.autocast("cuda", dtype=torch.bfloat16)'),
    ("torch.cpu.amp.autocast()", 'torch.autocast("cpu")  (bfloat16 by default)'),
    ("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")'),
    ("@torch.cuda.amp.custom_fwd / custom_bwd",
     '@torch.amp.custom_fwd(device_type="cuda") / custom_bwd(device_type="cuda")'),
]

# %%
apex = [  # NVIDIA's Apex (apex.amp), deprecated
    ('Apex: model, opt = amp.initialize(model, opt, opt_level="O1")',
     "delete it; put torch.autocast around forward + loss"),
    ('Apex: opt_level="O2" ("almost fp16": fp16 model, fp32 master weights, fp32 BatchNorm)',
     "closest: FSDP's MixedPrecision(param_dtype=..., reduce_dtype=...) (fully_shard: "
     "MixedPrecisionPolicy): 16-bit compute per module, fp32 sharded weights for the optimizer"),
    ('Apex: opt_level="O3" (pure fp16: model.half(), no master weights; a speed baseline)',
     "fp32 weights + torch.autocast (O1's replacement). Pure 16-bit weights lose small updates "
     "(lesson 15); pure fp16 + GradScaler raises (below)"),
    ("Apex: with amp.scale_loss(loss, opt) as scaled: scaled.backward()",
     "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()"),
    ("Apex: clip_grad_norm_(amp.master_params(opt), max_norm)",
     "scaler.unscale_(opt); clip_grad_norm_(model.parameters(), max_norm)"),
    ("Apex: amp.state_dict() / amp.load_state_dict()",
     "scaler.state_dict() / scaler.load_state_dict()  (lesson 05, section 3)"),
]
migration = pd.DataFrame(renamed + apex, columns=["old", "modern"])
migration.style.hide(axis="index").set_properties(**{"text-align": "left"})

# %% [markdown]
# Apex is not installed here, so its rows are a table only (the O levels are from Apex's
# `apex.amp` documentation: O1 mixed precision, O2 "almost fp16", O3 pure fp16, which that
# documentation offers as a speed baseline that may not train stably). O3 has no modern
# equivalent to aim for: its weights are 16-bit, so an update smaller than about 1/256 (bf16) or
# 1/2048 (fp16) of a weight rounds away and the weight never moves (lesson 15 measures it). The
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

# %%
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
# ## 2. Troubleshooting
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
# 3. **Fix the cause:** normalise inputs, run that region in fp32 (lesson 07), use a loss that
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


# %%
def forward_fp16() -> None:
    with torch.autocast(info.type, dtype=torch.float16):
        model(raw_inputs)


culprit = first_nonfinite_module(model, forward_fp16)
print(f"first non-finite output: {culprit}")
assert culprit is not None and culprit.name == "layers.0" and culprit.dtype == torch.float16

if torch.bfloat16 in info.amp_dtypes or info.type == "cpu":  # not every GPU computes bf16
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
# - autocast's low-precision copies of the weights: it caches the cast of each leaf tensor that
#   requires grad (the parameters) and empties the cache when the outermost region exits, but in
#   training each convolution and linear layer also saves the copy it used for its backward, so
#   the copies live until backward frees the graph (in inference nothing is saved: they go with
#   the region);
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

    saved = saved_bytes(forward_and_loss, model)  # the fp32 weights it keeps are counted above
    forward_and_loss().backward()
    optimizer.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    return {"weights": weights, "gradients": gradients, "Adam state": state,
            "saved activations": saved.activations, "cast weights": saved.cast_weights}


# %%
memory = pd.DataFrame({"fp32": memory_breakdown(False),
                       f"AMP {dtype_name(amp_dtype)}": memory_breakdown(True)}) / 2**20
memory.loc["total"] = memory.sum()
ratio = memory.iloc[:, 1] / memory.iloc[:, 0]
assert (ratio[["weights", "gradients", "Adam state"]] == 1).all()  # AMP does not touch these
# MPS autocast keeps batch_norm in fp32 (KERNEL_MPS(batch_norm, fp32), autocast_mode.cpp), so
# there AMP saves fp32 BatchNorm inputs as well: more than fp32 in all (lesson 03 counts it)
assert ratio["saved activations"] <= (1.3 if info.type == "mps" else 0.55)
print(f"activations {ratio['saved activations']:.2f}x, total {ratio['total']:.2f}x of fp32")
memory.round(3).rename(columns=lambda c: f"{c} (MB)")

# %% [markdown]
# The weight copies are the cast weights row above. Here they are, watched by weak reference:
# alive after the autocast region has ended, gone once backward has run.

# %%
import weakref

model, copies = new_model(), []
weight_shapes = [p.shape for p in model.parameters() if p.dim() > 1]  # the conv weights


def note_weight_copies(saved: torch.Tensor) -> torch.Tensor:
    """A saved_tensors_hooks pack hook: note each 16-bit weight copy autograd saves."""
    saved = saved.detach()
    if saved.dtype == amp_dtype and saved.shape in weight_shapes:
        copies.append(weakref.ref(saved))
    return saved


with torch.autograd.graph.saved_tensors_hooks(note_weight_copies, lambda t: t):
    with torch.autocast(info.type, dtype=amp_dtype):
        loss = loss_fn(model(inputs), targets)
alive_after_region = sum(copy() is not None for copy in copies)
loss.backward()
print(f"{len(copies)} {dtype_name(amp_dtype)} weight copies saved for backward: "
      f"{alive_after_region} alive after the region, "
      f"{sum(copy() is not None for copy in copies)} after backward")
assert len(copies) == len(weight_shapes) == alive_after_region  # one per conv, kept alive
assert all(copy() is None for copy in copies)  # freed with the graph

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **Smaller raw units.** In "The loss is inf or NaN", change `inputs * 1e5` to `inputs * 1e4`.
#    Now the three steps run (`stopped: None`, so that cell's assert fails) and the next cell finds
#    no non-finite module (`None`): coordinates up to 10^4 fit under fp16's largest value, 65504,
#    and so do the first convolution's outputs (checked on a CPU, at `smoke` and `cpu`).
# 2. **Another optimizer.** In `memory_breakdown`, replace Adam with
#    `torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)`. The optimizer-state row (still
#    labelled "Adam state") halves to the size of the weights, one momentum buffer per weight
#    instead of Adam's two averages, and its AMP/fp32 ratio stays 1: AMP leaves the optimizer's
#    state in fp32, whichever optimizer it is.

# %% [markdown]
# ## What to remember
#
# - Replace `torch.cuda.amp.*` and Apex, and never hard-code `"cuda"`: without CUDA,
#   `GradScaler("cuda")` and `autocast("cuda")` quietly switch AMP off, old names or new. Pure
#   fp16 (Apex O3) with a GradScaler raises "Attempting to unscale FP16 gradients."
# - A non-finite loss is a forward-pass problem: stop, find the first module, fix the cause.
# - No speedup: check the problem size, multiples of 8, the TF32 baseline and warm-up.
# - AMP halves saved activations and adds 16-bit weight copies; weights, gradients and optimizer
#   state stay fp32.
