# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 60
#     memory:
#       cpu: 3
#       paper: 3
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.2
#     needs: any device, CPU included (other devices' autocast lists are probed on fake
#       tensors)
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
# # 01 · Autocast basics: which dtype does each op run in?
#
# Mixed precision means running *some* of a network's work in a 16-bit float format while keeping
# the rest, and the master copy of the weights, in 32-bit. Done well it cuts training time and
# activation memory roughly in half; done carelessly it silently loses accuracy.
# `torch.autocast` is PyTorch's way of doing it *automatically*: inside an autocast region every op
# is looked up in a policy that says whether it is safe and worthwhile in 16-bit.
#
# In this lesson you will:
#
# 1. compare fp32, fp16 and bf16: range, precision, and what underflows;
# 2. see autocast lower a matrix multiply but leave an addition alone, on *your* device;
# 3. generate autocast's op policy live, for your device and every other one, because it differs;
# 4. see why only the forward pass and the loss belong inside autocast;
# 5. write the function that picks autocast's settings for any device (a checker grades it).
#
# Every claim below is checked by an `assert` in the cell that makes it, so if a future PyTorch
# changes the behaviour, this notebook fails instead of teaching something false.

# %%
import math

import pandas as pd
import torch

from amp_tutorial.autocast_policy import (
    BANNED,
    FP32,
    FP32_OUT,
    LOWERED,
    NO_RULE,
    PROMOTE,
    SOURCE_POLICY,
    autocast_policy,
    ops_by_rule,
    policy_table,
    visible_promotions,
)
from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.exercises.autocast_settings import check_autocast_settings
from amp_tutorial.plots import plot_autocast_rules, plot_dtype_ranges

# %%
torch.manual_seed(0)  # fixed seed: the numbers below are the same every run
info = select_device()  # set AMP_TUTORIAL_DEVICE=cpu (or cuda, mps, xpu) to choose
print(device_line(info))
assert info.amp_dtype is not None, "this torch has no usable autocast dtype here; upgrade torch"
amp_dtype = info.amp_dtype

# %% [markdown]
# ## 1. Three float formats
#
# A float spends its bits on an **exponent** (how large or small a number can be: the *range*) and a
# **mantissa** (how many significant digits it keeps: the *precision*). fp16 and bf16 both use
# 16 bits but split them differently: fp16 keeps more precision, bf16 keeps fp32's whole range.
# The table is read from `torch.finfo`, not typed in. Two columns are derived from it:
#
# - **rounds to 0 below**: a value smaller than half the smallest subnormal rounds to zero
#   (round to nearest); between that and the smallest subnormal it rounds *up* to the subnormal;
# - **decimal digits**: `(mantissa bits + 1) * log10(2)`, the significant decimal digits the
#   format carries (the +1 is the implicit leading bit of a normal number).

# %%
rows = []
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    fi = torch.finfo(dtype)
    mantissa_bits = -int(math.log2(fi.eps))
    subnormal = fi.smallest_normal * fi.eps
    rows.append({
        "dtype": dtype_name(dtype),
        "bits": fi.bits,
        "exponent bits": fi.bits - 1 - mantissa_bits,
        "mantissa bits": mantissa_bits,
        "largest": fi.max,
        "smallest normal": fi.smallest_normal,
        "smallest subnormal": subnormal,
        "rounds to 0 below": subnormal / 2,
        "decimal digits": (mantissa_bits + 1) * math.log10(2),
        "eps (1 -> next)": fi.eps,
    })
formats = pd.DataFrame(rows).set_index("dtype")
formats.style.format("{:.3g}", subset=formats.columns[3:])  # largest value onwards

# %%
fp16 = formats.loc["fp16"]
assert fp16["largest"] == 65504.0  # fp16 overflows just above 65 thousand
assert torch.finfo(torch.bfloat16).max > 3e38  # bf16 reaches as far as fp32
assert formats.loc["bf16", "exponent bits"] == formats.loc["fp32", "exponent bits"] == 8
assert fp16["smallest subnormal"] == 2.0**-24 and round(fp16["smallest subnormal"], 8) == 6e-8
assert round(fp16["rounds to 0 below"], 8) == 3e-8
half = fp16["rounds to 0 below"]  # what fp16 really does on either side of that line:
assert torch.tensor(0.99 * half, dtype=torch.float16).item() == 0.0
assert torch.tensor(1.01 * half, dtype=torch.float16).item() == fp16["smallest subnormal"]
digits = formats["decimal digits"].round(1)
assert (digits["fp16"], digits["bf16"], digits["fp32"]) == (3.3, 2.4, 7.2)
fig = plot_dtype_ranges()

# %% [markdown]
# The olive part of each bar is the **subnormal** range: numbers below the smallest normal value
# that can still be stored, with fewer and fewer significant bits. Below it, a value becomes zero.
# That is the danger for fp16 training: gradients are often tiny (1e-6 to 1e-9), fp16's
# smallest subnormal is 2^-24 (about 6e-8), and anything below half of that (about 3e-8) rounds
# to zero. Each dtype keeps its colour in every figure of the course: fp32 blue, fp16 orange,
# bf16 green.

# %%
tiny, huge, fine = 1e-8, 70_000.0, 1 + 1 / 512
demo = pd.DataFrame({
    dtype_name(d): {
        "1e-8 stored as": torch.tensor(tiny, dtype=d).item(),
        "70000 stored as": torch.tensor(huge, dtype=d).item(),
        "1 + 1/512 stored as": torch.tensor(fine, dtype=d).item(),
        "1 + 1e-5 (an update) as": (torch.tensor(1.0, dtype=d) + 1e-5).item(),
    }
    for d in (torch.float32, torch.float16, torch.bfloat16)
})
print(demo.to_string())
assert torch.tensor(tiny, dtype=torch.float16).item() == 0.0  # underflow: flushed to zero
assert torch.tensor(huge, dtype=torch.float16).isinf()  # overflow
assert torch.tensor(tiny, dtype=torch.bfloat16).item() > 0  # bf16 keeps it (roughly)
assert torch.tensor(fine, dtype=torch.bfloat16).item() == 1.0  # but bf16 rounds 1 + 1/512 to 1
assert torch.tensor(fine, dtype=torch.float16).item() == fine  # fp16 keeps it exactly
for d in (torch.float16, torch.bfloat16):  # a small update to a weight near 1: lost in 16 bits
    assert torch.tensor(1.0, dtype=d) + 1e-5 == 1.0 < torch.tensor(1.0) + 1e-5

# %% [markdown]
# So fp16 needs help with *range* (that help is the GradScaler of lesson 02), while bf16 has the
# range but only about 2.4 significant decimal digits (fp16 about 3.3). Neither is good for long
# sums or for values that must be accurate to many digits, which is why autocast does not lower
# every op, and why the weights stay fp32: an update of 1e-5 to a weight near 1 is lost in both
# 16-bit formats (the last row) and kept in fp32.
#
# ## 2. Autocast on your device
#
# Two float32 vectors; inside `torch.autocast` a matrix multiply and an addition. The
# `device_type` is `"cuda"` on NVIDIA **and** AMD (ROCm) GPUs, `"cpu"`, `"mps"` or `"xpu"`; the
# `dtype` defaults to float16 on GPUs and bfloat16 on CPU. Here we pass both explicitly.

# %%
x = torch.rand(1024, 1, device=info.device)
y = torch.rand(1024, 1, device=info.device)
print(f"inputs:  x {x.dtype}, y {y.dtype}")

with torch.autocast(device_type=info.type, dtype=amp_dtype):
    product = x @ y.T  # a matmul: on autocast's lower-precision list
    total = x + y  # an elementwise add: on no list, it keeps its inputs' dtype

print(f"outputs: x @ y.T -> {product.dtype}, x + y -> {total.dtype}")
assert product.dtype == amp_dtype
assert total.dtype == torch.float32

# %% [markdown]
# The inputs stay float32. Autocast casts *copies* on the way into each eligible op, which is why
# a model's weights remain float32 (the "master weights") and the optimizer updates them in full
# precision. The same holds for a layer:

# %%
layer = torch.nn.Linear(16, 4).to(info.device)
with torch.autocast(device_type=info.type, dtype=amp_dtype):
    out = layer(torch.randn(8, 16, device=info.device))
print(f"weight stays {layer.weight.dtype}; the layer's output is {out.dtype}")
assert layer.weight.dtype == torch.float32 and out.dtype == amp_dtype

# %% [markdown]
# ## 3. The op policy, read off this device
#
# Autocast decides op by op, from lists kept per device in PyTorch's C++ source
# (`aten/src/ATen/autocast_mode.cpp` and `autocast_mode.h`). Each list has a cast policy:
#
# - **lower precision**: float32 inputs are cast down to the autocast dtype;
# - **float32**: low-precision inputs are cast up to float32;
# - **float32 output dtype**: ops that take a `dtype=` argument are called with
#   `dtype=torch.float32`, unless you passed a dtype yourself;
# - **widest input**: inputs of mixed dtypes are cast to the widest of them, so an op that
#   insists on equal dtypes still runs;
# - **refused**: the op raises under autocast;
# - every other op is on **no list**: autocast changes nothing and the op's own rules decide.
#
# Which op is on which list differs between devices and PyTorch versions, so we probe the lists
# instead of copying a table, first on your device. An output dtype alone can mislead:
# `bf16 + fp32` gives fp32 by ordinary **type promotion**, with or without autocast. So each op
# runs twice, with autocast **off and on**, for float32 inputs, low-precision inputs, mixed inputs
# and (where the op takes one) an explicit `dtype=`, while a `TorchDispatchMode` records every
# dtype cast that reaches the kernels. Only what changes when autocast is switched on is
# autocast's decision. A call that fails shows as `raises`, in the table, not as a crash.

# %%
policy = autocast_policy(info.type, amp_dtype)
table = pd.DataFrame(policy_table(policy, amp_dtype)).set_index("op")
print(f"autocast on {info.type} with {dtype_name(amp_dtype)}, torch {torch.__version__}; "
      "each cell: output dtype with autocast off -> on")
table

# %% [markdown]
# The groups on this device, printed from the table rather than written in advance:

# %%
verdict = table["autocast rule"]
groups = ops_by_rule(policy)
for rule, ops in groups.items():
    print(f"{rule:>21}: {', '.join(ops) or '(none of the probed ops)'}")

by_op = {r.op: r for r in policy}
add = by_op["add (a + b)"].cases["mixed"]
assert add.off.dtype == add.on.dtype == torch.float32  # fp32 out either way: type promotion
assert not add.added_casts and verdict["add (a + b)"] == verdict["mul (a * b)"] == NO_RULE
assert {"matmul (a @ b)", "linear", "conv2d", "bmm"} <= set(groups[LOWERED])
assert verdict["mse_loss"] == FP32  # losses run in fp32 on every device probed here

# %% [markdown]
# **Widest input, where you can see it.** For most ops type promotion already widens mixed inputs,
# so the promote rule only shows in the casts column. For a few, the call fails outright on mixed
# dtypes without autocast and works with it; those are printed here, with the error autocast
# spared you.

# %%
shown = visible_promotions(policy)
for op in shown:
    print(f"{op}: without autocast -> {by_op[op].cases['mixed'].off.error}")
    print(f"{' ' * len(op)}  with autocast    -> {by_op[op].cases['mixed'].on}")
if info.type in SOURCE_POLICY:
    assert shown, "expected a promote-list op that fails on mixed dtypes without autocast"

# %% [markdown]
# **Every device, probed here.** The next table probes every device's lists for fp16 and bf16:
# CPU, CUDA (AMD GPUs under ROCm use the `cuda` device type and the same lists, hence
# "cuda/rocm"), Intel XPU and Apple MPS. A device that is here is probed on real tensors. One that
# is not is probed with **fake tensors** (`torch._subclasses.fake_tensor.FakeTensorMode`): tensors
# that carry a device and a dtype but no data. Each call still goes through PyTorch's dispatcher
# and that device's autocast kernels, which insert their casts as usual; only the arithmetic is
# replaced by "meta" functions that work out the output's shape and dtype. `torch.autocast("cuda")`
# switches itself off where CUDA is absent, so the probe sets the two switches it would set,
# `torch.set_autocast_enabled` and `torch.set_autocast_dtype`. An op whose fake call cannot run
# would be read from the dispatcher's registry of autocast kernels instead, which says only
# whether the device has a rule for it. Fake tensors tell the dtype of each op, not its speed.

# %%
DEVICES = {"cpu": "cpu", "cuda": "cuda/rocm", "xpu": "xpu", "mps": "mps"}
probes = {(dtype_name(low), label): autocast_policy(device_type, low)  # real or fake tensors
          for low in (torch.float16, torch.bfloat16) for device_type, label in DEVICES.items()}
rules = pd.DataFrame({column: {r.op: r.verdict for r in rows} for column, rows in probes.items()})
rules.columns.names = ["autocast dtype", "device"]
probed_by = pd.Series({column: ", ".join(sorted({r.how for r in rows}))
                       for column, rows in probes.items()}).unstack()[list(DEVICES.values())]
print(f"how each column was probed in this run (torch {torch.__version__}):")
print(probed_by.to_string())
rules

# %% [markdown]
# The same probe as a map, for a handful of the ops and your autocast dtype (fp16 and bf16 get the
# same rules): each cell is coloured by the dtype the op runs in under autocast. Read it by rows:
# matmul and conv2d are in the low dtype's colour on every device; exp, softmax, sum and layer_norm
# are blue (float32) on the GPUs but pale grey ("as given": on no list) on the CPU, so a bf16 input
# stays bf16 there; the plum "widest" cells of the CPU and of the GPUs never share a row.

# %%
fig = plot_autocast_rules(rules[dtype_name(amp_dtype)], amp_dtype)

# %% [markdown]
# Read the differences before moving code between devices; the next two cells assert each one
# but the second, which the course's tests check for every torch release it supports:
#
# - fp16 and bf16 get the same rules on every device; only the dtype autocast lowers to differs.
# - Each column is what PyTorch's source registers for that device: XPU registers CUDA's lists
#   (`AT_FORALL_*` in `autocast_mode.h`), MPS its own list in `autocast_mode.cpp`. The lists can
#   change between releases: check yours when you upgrade.
# - The ops CUDA keeps in float32 (exp, log, pow, sums, softmax, layer_norm, group_norm) are on
#   **no CPU list**: CPU autocast runs them in whatever dtype they are given, bf16 included.
# - The promote lists do not overlap: `cat`, `stack` and `index_copy` on CPU; `addcmul`, `dot`,
#   `index_put`, `scatter_add` and others on CUDA, XPU and MPS.
# - `binary_cross_entropy` runs in float32 on CPU, is refused on CUDA and XPU (lesson 07), and is
#   on no MPS list.
# - Only MPS runs `batch_norm` in float32. MPS also puts sums and softmax on its plain float32
#   list: with a `dtype=` of yours, autocast still casts their input up to float32 (the output
#   keeps your dtype); CUDA leaves such a call alone.

# %%
fp16, bf16 = rules["fp16"], rules["bf16"]
assert fp16.equals(bf16), "fp16 and bf16 follow different rules"
assert bf16["xpu"].equals(bf16["cuda/rocm"])  # XPU registers CUDA's lists
cpu, cuda, mps = bf16["cpu"], bf16["cuda/rocm"], bf16["mps"]

# %% [markdown]
# The first bullet holds: one set of rules for fp16 and bf16 (and XPU's column is CUDA's). The
# other bullets, in turn:

# %%
cuda_fp32 = ["exp", "log", "pow", "sum", "cumsum", "softmax", "layer_norm", "group_norm"]
assert (cpu[cuda_fp32] == NO_RULE).all() and cuda[cuda_fp32].isin([FP32, FP32_OUT]).all()
promote = {label: set(column[column == PROMOTE].index) for label, column in bf16.items()}
assert promote["cpu"] == {"cat", "stack", "index_copy"} and not promote["cpu"] & promote["mps"]
assert {"addcmul", "dot", "index_put", "scatter_add"} <= promote["cuda/rocm"] == promote["mps"]
bce = bf16.loc["binary_cross_entropy"]
assert (bce["cpu"], bce["cuda/rocm"], bce["xpu"], bce["mps"]) == (FP32, BANNED, BANNED, NO_RULE)
assert mps["batch_norm"] == FP32 and cpu["batch_norm"] == cuda["batch_norm"] == NO_RULE
assert (mps[["sum", "softmax"]] == FP32).all() and (cuda[["sum", "softmax"]] == FP32_OUT).all()
given = [r.cases["low, dtype=low"] for r in probes[("bf16", "mps")] if r.op in ("sum", "softmax")]
assert len(given) == 2 and all(c.on.dtype == torch.bfloat16  # your dtype out, after autocast
                               and c.added_casts[(torch.bfloat16, torch.float32)] for c in given)
differ = bf16[bf16.nunique(axis=1) > 1].index
print(f"{len(differ)} of {len(bf16)} probed ops follow different rules on different devices")

# %% [markdown]
# ## 4. Only the forward pass and the loss go inside autocast
#
# Autograd records the dtype each op ran in, and the backward pass runs every op's gradient in that
# same dtype automatically. So there is nothing to gain from putting `backward()` inside autocast,
# and the optimizer step must see the float32 weights and gradients. The pattern is:
#
# ```python
# with torch.autocast(device_type=..., dtype=...):
#     loss = loss_fn(model(inputs), targets)   # forward + loss: lowered where safe
# loss.backward()                              # outside: mirrors the forward's dtypes
# optimizer.step()                             # outside: updates the fp32 master weights
# ```

# %%
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
model = model.to(info.device)
inputs = torch.randn(64, 16, device=info.device)
with torch.autocast(device_type=info.type, dtype=amp_dtype):
    prediction = model(inputs)
    loss = torch.nn.functional.mse_loss(prediction, torch.zeros_like(prediction))
loss.backward()
grad_dtypes = {p.grad.dtype for p in model.parameters()}
print(f"prediction {prediction.dtype}, loss {loss.dtype}, gradients {grad_dtypes}")
assert prediction.dtype == amp_dtype
assert loss.dtype == torch.float32  # mse_loss is on the float32 list
assert grad_dtypes == {torch.float32}  # gradients land on the fp32 weights, in fp32

# %% [markdown]
# ## 5. Exercise: choose autocast's settings for any device
#
# Every cell above took `info.type` and `amp_dtype` from the course's `select_device`. Every AMP
# loop starts with that choice, so now you write it: `autocast_settings(device)` takes a
# `torch.device` and returns a tuple `(device_type, dtype, use_scaler)`.
#
# - `device_type`: the string for `torch.autocast`, the device's type without its index (`"cuda"`
#   for `torch.device("cuda", 0)`), read from the device, never a hard-coded `"cuda"`.
# - `dtype`: `torch.bfloat16` only where the device computes it natively, else `torch.float16`:
#   - `cpu`: `torch.bfloat16` on every CPU. It is CPU autocast's default; a CPU without bf16
#     instructions emulates it, and the device line at the top says which yours does.
#   - `cuda` (NVIDIA): bfloat16 if `torch.cuda.is_bf16_supported(including_emulation=False)`, else
#     float16. Plain `is_bf16_supported()` also counts emulated bf16 (read from
#     `torch/cuda/__init__.py`), so it says True on a V100 or a T4.
#   - `mps`: `torch.float16`; PyTorch cannot ask an Apple GPU whether its bf16 is native.
#   - `xpu` (Intel): bfloat16 if `torch.xpu.is_bf16_supported(including_emulation=False)`, else
#     float16.
# - `use_scaler`: `True` exactly when `dtype` is `torch.float16` (lesson 02 shows why).
#
# AMD GPUs (ROCm) are left out: there `torch.cuda.is_bf16_supported()` says True for every GPU,
# whatever the argument (read from `torch/cuda/__init__.py`), so the course reads the GPU's
# architecture instead. On an NVIDIA or AMD GPU with native bf16, `select_device` offers both
# dtypes and lists float16 first; this exercise takes bfloat16 wherever it is native.
#
# The checker calls your function for the CPU, `cuda:0` on a simulated Ampere GPU (native bf16)
# and T4 (bf16 only emulated), `mps`, `xpu:0` with and without native bf16, and devices drawn at
# random (other GPUs and indices), beside a right answer. It fakes, during the call,
# `torch.cuda.is_available`, `torch.cuda.is_bf16_supported`, `torch.cuda.get_device_capability`,
# `torch.backends.mps.is_available`, `torch.xpu.is_available` and `torch.xpu.is_bf16_supported`
# (ask no other device query), then quotes what `torch.autocast` does with your answer.

# %% tags=["exercise"] solution="autocast_settings.py"
# YOUR CODE: replace the body of this function, run this cell, then run the checker below.
def autocast_settings(device):
    """(device_type, dtype, use_scaler) for torch.autocast and a GradScaler on ``device``."""
    raise NotImplementedError(
        "Branch on device.type: bfloat16 on cpu, float16 on mps, and on cuda or xpu bfloat16 "
        "only if is_bf16_supported(including_emulation=False) says True; use_scaler follows "
        "from the dtype."
    )


# %%
result = check_autocast_settings(autocast_settings)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# Your function on this machine's device, next to the course's choice:

# %%
device_type, dtype, use_scaler = autocast_settings(info.device)
print(f"autocast_settings: {device_type!r}, {dtype}, GradScaler {use_scaler}")
print(f"select_device:     {info.type!r}, {amp_dtype}, GradScaler {info.needs_grad_scaler()}")
assert device_type == info.type and use_scaler == info.needs_grad_scaler(dtype)
assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # CPU autocast's default dtype
assert not hasattr(torch.mps, "is_bf16_supported")  # no way to ask MPS about native bf16

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# The outcomes were measured on a CPU, in both dtype modes (bf16, and fp16 with
# `AMP_TUTORIAL_DTYPE=float16`).
#
# 1. **A float32 region inside.** In section 2, put `product = x @ y.T` in a nested
#    `with torch.autocast(device_type=info.type, enabled=False):` block. The matmul now gives
#    `torch.float32` and the `product` assert fails, while `x + y` stays float32. The inner block
#    switches autocast off for its own ops only: a matmul after it, still inside the outer block,
#    gives the low dtype again.
# 2. **CUDA's lists, on this CPU.** In section 3's first cell, replace `info.type` with `"cuda"` in
#    the call to `autocast_policy`: the probe runs on fake CUDA tensors. The groups printed next
#    are CUDA's: exp, log, pow, layer_norm and group_norm join mse_loss in float32, sum, cumsum,
#    softmax and prod get a float32 output dtype, binary_cross_entropy is refused, and `dot` and
#    `scatter_add` replace `index_copy` as the ops that fail on mixed dtypes without autocast. The
#    asserts still pass: both devices lower matmul, linear, conv2d and bmm, keep mse_loss in
#    float32 and leave `add` alone.
# 3. **The loss outside autocast.** In section 4, move the `loss = ...` line out of the `with`
#    block. The prediction is still in the low dtype, and now so is the loss (`torch.bfloat16`, or
#    `torch.float16` in fp16 mode): the `loss.dtype` assert fails. `mse_loss` is on CPU autocast's
#    float32 list, but outside autocast it runs in its inputs' dtype. The gradients stay float32,
#    on the float32 weights.

# %% [markdown]
# ## What to remember
#
# - fp16: about 3.3 significant decimal digits, a narrow range (smallest subnormal about 6e-8,
#   values below about 3e-8 round to zero, overflow above 65504). bf16: fp32's range, about 2.4
#   digits.
# - `torch.autocast(device_type, dtype)` lowers the ops on its lower-precision list, runs the ops
#   on its float32 lists in fp32, and never changes your weights' dtype. Ops on no list keep
#   ordinary type promotion.
# - The lists depend on the device (CPU and CUDA differ a lot, MPS keeps batch_norm in fp32): probe
#   them, comparing autocast on and off, rather than trusting a table written for another device.
#   Fake tensors probe a device you do not have, through the same dispatcher.
# - `device_type` is `device.type`, never with an index; the dtype is bf16 where the device
#   computes it natively (`is_bf16_supported(including_emulation=False)` on NVIDIA and Intel, always
#   on a CPU), fp16 otherwise, and fp16 alone needs a GradScaler. On a CPU, too: where bf16 is only
#   emulated (a CPU without AVX512-BF16 or AMX), fp32 is the fast choice and AMP runs only to learn
#   from.
# - Wrap the forward pass and loss only. Next, **lesson 02** shows why fp16 gradients vanish and how
#   `torch.amp.GradScaler` rescues them; **lesson 03** trains a real model both ways.
