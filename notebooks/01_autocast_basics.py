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
import pandas as pd
import torch

from amp_tutorial import describe_device, select_device
from amp_tutorial.device import dtype_name
from amp_tutorial.plots import plot_dtype_ranges
from amp_tutorial.policy import LOWERED, RAISED, autocast_policy, policy_table

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
# The table is read from `torch.finfo`, not typed in.

# %%
rows = []
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    fi = torch.finfo(dtype)
    mantissa_bits = -int(torch.log2(torch.tensor(fi.eps)).item())
    rows.append({
        "dtype": dtype_name(dtype),
        "bits": fi.bits,
        "exponent bits": fi.bits - 1 - mantissa_bits,
        "mantissa bits": mantissa_bits,
        "largest": f"{fi.max:.4g}",
        "smallest normal": f"{fi.smallest_normal:.4g}",
        "smallest subnormal": f"{fi.smallest_normal * fi.eps:.4g}",
        "eps (1 -> next)": f"{fi.eps:.3g}",
    })
formats = pd.DataFrame(rows).set_index("dtype")
formats

# %%
assert torch.finfo(torch.float16).max == 65504.0  # fp16 overflows just above 65 thousand
assert torch.finfo(torch.bfloat16).max > 3e38  # bf16 reaches as far as fp32
assert formats.loc["bf16", "exponent bits"] == formats.loc["fp32", "exponent bits"] == 8
assert formats.loc["fp16", "mantissa bits"] > formats.loc["bf16", "mantissa bits"]
fig = plot_dtype_ranges()

# %% [markdown]
# The orange part of each bar is the **subnormal** range: numbers below the smallest normal value
# that can still be stored, with fewer and fewer significant bits. Below it, a value becomes zero.
# That is the danger for fp16 training: gradients are often tiny (1e-6 to 1e-9), and fp16's
# smallest subnormal is about 6e-8.

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
# range but only about 3 significant decimal digits. Neither is good for long sums or for values
# that must be accurate to many digits, which is why autocast does not lower every op.
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
# Autocast sorts ops into three groups: ops that are fast and safe in 16-bit (matmul, convolution,
# linear) run **lowered**; ops that need range or accuracy (exp, log, pow, sums, norms, most losses)
# run in **float32**; ops that combine several inputs (cat, stack, addcmul) run in the **widest**
# input type. Everything else runs in whatever dtype it is given.
#
# The lists differ between backends and PyTorch versions, so instead of copying a table we probe
# each op on the running device: fp32 inputs in, what comes out? low-precision inputs in, what
# comes out?

# %%
policy = autocast_policy(info.type, amp_dtype)
table = pd.DataFrame(policy_table(policy)).set_index("op")
print(f"autocast policy on {info.type} with {dtype_name(amp_dtype)}, torch {torch.__version__}")
table

# %%
verdict = table["autocast"]
assert verdict["matmul (a @ b)"] == verdict["conv2d"] == verdict["linear"] == LOWERED
assert verdict["add (a + b)"] not in (LOWERED, RAISED)  # no rule for add
if info.type == "cuda":
    assert verdict["softmax"] == RAISED  # on CUDA softmax is computed in fp32...
elif info.type == "cpu":
    assert verdict["softmax"] != RAISED  # ...while CPU autocast leaves it in bf16
print("softmax on this device:", verdict["softmax"])

# %% [markdown]
# Note the last check: **CPU and CUDA policies differ.** On CUDA `softmax` is in the float32 group;
# CPU autocast has no such rule and leaves it in bf16. If you move code between devices, or read
# a table written for another one, re-run a probe like this rather than trusting the table.
#
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
# - fp16: more precision, narrow range (underflows below ~6e-8, overflows above 65504).
#   bf16: fp32's range, less precision.
# - `torch.autocast(device_type, dtype)` lowers the ops that benefit, keeps sensitive ones in fp32,
#   and never changes your weights' dtype.
# - The policy depends on the device: probe it, don't assume it.
# - Wrap the forward pass and loss only. Next, **lesson 02** shows why fp16 gradients vanish and how
#   `torch.amp.GradScaler` rescues them; **lesson 03** trains a real model both ways.
