# ---
# jupyter:
#   amp_tutorial:
#     minutes:
#       cpu: 0.4
#       smoke: 0.6
#     needs: any device, CPU included; the check against PyTorch's CUDA lists runs on
#       an NVIDIA or AMD GPU
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
# 3. generate autocast's op policy live, because it differs between CPU and GPU;
# 4. see why only the forward pass and the loss belong inside autocast.
#
# Every claim below is checked by an `assert` in the cell that makes it, so if a future PyTorch
# changes the behaviour, this notebook fails instead of teaching something false.

# %%
import math

import pandas as pd
import torch

from amp_tutorial.device import describe_device, dtype_name, select_device
from amp_tutorial.plots import plot_dtype_ranges
from amp_tutorial.policy import (
    BANNED,
    FP32,
    FP32_OUT,
    LOWERED,
    NO_RULE,
    PROMOTE,
    SOURCE_POLICY,
    autocast_policy,
    header_policy,
    ops_by_rule,
    policy_table,
    registered_ops,
    visible_promotions,
)

torch.manual_seed(0)  # fixed seed: the numbers below are the same every run
info = select_device()  # set AMP_TUTORIAL_DEVICE=cpu (or cuda, mps, xpu) to choose
print(describe_device(info))
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
formats.style.format("{:.3g}", subset=formats.columns[4:])

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
# The orange part of each bar is the **subnormal** range: numbers below the smallest normal value
# that can still be stored, with fewer and fewer significant bits. Below it, a value becomes zero.
# That is the danger for fp16 training: gradients are often tiny (1e-6 to 1e-9), fp16's
# smallest subnormal is 2^-24 (about 6e-8), and anything below half of that (about 3e-8) rounds
# to zero.

# %%
tiny, huge, fine = 1e-8, 70_000.0, 1 + 1 / 512
demo = pd.DataFrame({
    dtype_name(d): {
        "1e-8 stored as": torch.tensor(tiny, dtype=d).item(),
        "70000 stored as": torch.tensor(huge, dtype=d).item(),
        "1 + 1/512 stored as": torch.tensor(fine, dtype=d).item(),
    }
    for d in (torch.float32, torch.float16, torch.bfloat16)
})
print(demo.to_string())
assert torch.tensor(tiny, dtype=torch.float16).item() == 0.0  # underflow: flushed to zero
assert torch.tensor(huge, dtype=torch.float16).isinf()  # overflow
assert torch.tensor(tiny, dtype=torch.bfloat16).item() > 0  # bf16 keeps it (roughly)
assert torch.tensor(fine, dtype=torch.bfloat16).item() == 1.0  # but bf16 rounds 1 + 1/512 to 1
assert torch.tensor(fine, dtype=torch.float16).item() == fine  # fp16 keeps it exactly

# %% [markdown]
# So fp16 needs help with *range* (that help is the GradScaler of lesson 02), while bf16 has the
# range but only about 2.4 significant decimal digits (fp16 about 3.3). Neither is good for long
# sums or for values that must be accurate to many digits, which is why autocast does not lower
# every op.
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
# Which op is on which list differs between devices and PyTorch versions, so we probe the running
# device instead of copying a table. An output dtype alone can mislead: `bf16 + fp32` gives fp32
# by ordinary **type promotion**, with or without autocast. So each op runs twice, with autocast
# **off and on**, for float32 inputs, low-precision inputs, mixed inputs and (where the op takes
# one) an explicit `dtype=`, while a `TorchDispatchMode` records every dtype cast that reaches the
# kernels. Only what changes when autocast is switched on is autocast's decision. A call that
# fails shows as `raises`, in the table, not as a crash.

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
# **CPU and CUDA keep different lists.** The next table puts the measured rules next to what the
# source registers for CPU, CUDA (ROCm uses CUDA's lists) and XPU (the same lists as CUDA). Only
# the column marked *measured* was probed; the others are read from PyTorch's source, and their
# lists of ops are checked against the kernels this torch build registers for each device, which
# works without a GPU.

# %%
compare = pd.DataFrame({
    f"measured here ({info.type})": verdict,
    **{f"{dev} (source)": pd.Series(rules) for dev, rules in SOURCE_POLICY.items()},
})
if info.type in SOURCE_POLICY:
    wrong = {op: (verdict[op], rule) for op, rule in SOURCE_POLICY[info.type].items()
             if verdict[op] != rule}
    assert not wrong, f"probe and source disagree (measured, source): {wrong}"
for dev, rules in SOURCE_POLICY.items():
    registered = registered_ops(policy, dev)
    if registered is not None:  # this torch has an autocast kernel exactly for the listed ops
        assert registered == {op: rule != NO_RULE for op, rule in rules.items()}, dev
differ = compare[compare["cpu (source)"] != compare["cuda (source)"]]
print(f"{len(differ)} of {len(compare)} probed ops follow different rules on CPU and CUDA:")
differ

# %% [markdown]
# Read the differences before moving code between devices. The ops CUDA protects with its float32
# lists (exp, log, pow, sums, softmax, layer_norm) are on **no CPU list**: CPU autocast runs them
# in whatever dtype they are given, bf16 included. The promote lists do not overlap at all: `cat`,
# `stack` and `index_copy` on CPU, `addcmul`, `dot`, `index_put`, `scatter_add` and others on CUDA.
# `binary_cross_entropy` runs in float32 on CPU and is refused on CUDA (lesson 07).
#
# These sentences read the source columns of the table, so the table is checked first. The CPU
# column was checked above where this runs on a CPU (measured); the CUDA/XPU column is checked
# here against the lists (`AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`,
# `AT_FORALL_FP32_SET_OPT_DTYPE`, `AT_FORALL_PROMOTE`) that the installed torch's
# `include/ATen/autocast_mode.h` defines and `autocast_mode.cpp` registers for CUDA and XPU.
# The ban on `binary_cross_entropy` is registered in `autocast_mode.cpp` itself, on none of them.

# %%
cpu_rules, cuda_rules = SOURCE_POLICY["cpu"], SOURCE_POLICY["cuda"]
from_header = header_policy(policy)  # None where this torch build ships no C++ headers
if from_header is not None:
    assert from_header == {op: NO_RULE if rule == BANNED else rule
                           for op, rule in cuda_rules.items()}, from_header
    print("the cuda/xpu source column matches the installed torch's autocast_mode.h")
cuda_fp32 = ["exp", "log", "pow", "sum", "cumsum", "softmax", "layer_norm"]
assert all(cpu_rules[op] == NO_RULE and cuda_rules[op] in (FP32, FP32_OUT) for op in cuda_fp32)
promote = {dev: {op for op, rule in rules.items() if rule == PROMOTE}
           for dev, rules in SOURCE_POLICY.items()}
assert promote["cpu"] == {"cat", "stack", "index_copy"} and not promote["cpu"] & promote["cuda"]
assert {"addcmul", "dot", "index_put", "scatter_add"} <= promote["cuda"]
assert (cpu_rules["binary_cross_entropy"], cuda_rules["binary_cross_entropy"]) == (FP32, BANNED)
for op in cuda_fp32:
    print(f"{op:>10}: measured here ({info.type}): {verdict[op]:<20} "
          f"source: cpu {cpu_rules[op]}, cuda {cuda_rules[op]}")

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
# ## What to remember
#
# - fp16: about 3.3 significant decimal digits, a narrow range (smallest subnormal about 6e-8,
#   values below about 3e-8 round to zero, overflow above 65504). bf16: fp32's range, about 2.4
#   digits.
# - `torch.autocast(device_type, dtype)` lowers the ops on its lower-precision list, runs the ops
#   on its float32 lists in fp32, and never changes your weights' dtype. Ops on no list keep
#   ordinary type promotion.
# - The lists depend on the device (CPU and CUDA differ a lot): probe them, comparing autocast on
#   and off, rather than trusting a table written for another device.
# - Wrap the forward pass and loss only. Next, **lesson 02** shows why fp16 gradients vanish and how
#   `torch.amp.GradScaler` rescues them; **lesson 03** trains a real model both ways.
