# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 55
#     memory:
#       cpu: 40
#       paper: 1009
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.2
#     needs: any device, CPU included; SDPA kernels per dtype on an NVIDIA GPU
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
# # 13 · Attention under AMP: float16 scores and masks, and which attention kernel runs
#
# Lesson 12 trained a small decoder-only transformer under AMP and traced which of its ops ran in
# low precision; its attention went through `F.scaled_dot_product_attention` (SDPA). This lesson
# looks at attention itself, where AMP goes wrong most often and where the speed comes from:
#
# 1. Attention scores that overflow float16 and masks that turn into NaN, and their fixes.
# 2. Which SDPA kernel runs for each dtype on this device, and what the slow one costs.
#
# Section 1 uses explicit float16 tensors on the CPU; section 2 uses the attention shape of
# lesson 12's transformer at this preset (batch, heads, sequence, head dimension). Every statement
# is measured on this device and asserted; seeds are fixed.

# %%
import contextlib

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from amp_tutorial.attention import attention_ops, backend_runs, fused_for_training
from amp_tutorial.autocast_policy import has_autocast_kernel, trace_dtypes
from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.exercises.masked_attention import check_masked_attention
from amp_tutorial.interleave import MIN_BLOCKS, interleave
from amp_tutorial.measure import saved_bytes, step_peak
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded

info = select_device()
preset = get_preset(device_type=info.type)
sizes, _ = preset.transformer, torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset, sizes=f"transformer d_model {sizes.d_model}, {sizes.n_heads} "
                                    f"heads, batch {sizes.batch} x {sizes.seq_len} tokens"))

# %% [markdown]
# ## 1. Attention in float16: the two classic failures and their fixes
#
# These run with explicit float16 tensors on any device, CPU included. float16's largest finite
# value is 65504.
#
# **Scores that overflow.** A score is a query-key dot product: with head dimension 64 and entries
# of 40 (large activations happen, e.g. without normalisation) it is 64 x 40 x 40 = 102400, `inf`
# in float16, and softmax of a row holding `inf` is NaN. Scaling the query by 1/sqrt(d) *before*
# the product keeps it at 12800 (SDPA's math backend scales q and k before its matmul, as the
# trace in section 2 shows); bfloat16 holds even the unscaled value.

# %%
fp16_max = torch.finfo(torch.float16).max
q = torch.full((4, 64), 40.0)
scores_fp16 = q.half() @ q.half().T
print(f"unscaled fp16 score: {scores_fp16[0, 0].item()}  (float32: {(q @ q.T)[0, 0].item():.0f})")
assert torch.isinf(scores_fp16).all() and torch.isnan(scores_fp16.softmax(-1)).all()
scaled = (q.half() / 64**0.5) @ q.half().T
print(f"scaled by 1/sqrt(64) first: {scaled[0, 0].item()}, softmax finite: "
      f"{torch.isfinite(scaled.softmax(-1)).all().item()}")
assert scaled.abs().max() < fp16_max and torch.isfinite(scaled.softmax(-1)).all()
bf16_scores = q.bfloat16() @ q.bfloat16().T
assert torch.isfinite(bf16_scores).all()  # bf16 reaches ~3.4e38
print(f"unscaled bf16 score: {bf16_scores[0, 0].item():.0f}")

# %% [markdown]
# **A mask made of a large negative constant.** Many codebases hide padding or future tokens by
# adding -1e9 (or -1e4...) to the scores. In float16, -1e9 does not exist: `masked_fill(mask,
# -1e9)` on a float16 tensor raises a RuntimeError, and an additive mask built in float32 and cast
# to float16 becomes `-inf`, so a fully masked row (a padded sequence) is all `-inf` and softmax
# gives 0/0 = NaN, which spreads into the loss. The fix: the limits of the dtype you compute in,
# `torch.finfo(scores.dtype).min` (a fully masked row becomes a harmless uniform row), or a
# boolean mask passed to `F.scaled_dot_product_attention`, which handles masking itself.

# %%
scores = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.float16)
mask = torch.tensor([[False, True, True], [True, True, True]])  # row 2: everything masked
try:
    scores.masked_fill(mask, -1e9)
    raise AssertionError("masked_fill(-1e9) on float16 did not raise")
except RuntimeError as err:
    print("masked_fill(mask, -1e9) on float16:", err)
additive = torch.zeros(2, 3).masked_fill(mask, -1e9).half()  # built in fp32, cast to fp16
print("the -1e9 mask in float16:", additive.tolist())
broken = (scores + additive).softmax(-1)
print("softmax with it:", broken.tolist())
assert torch.isinf(additive[mask]).all() and torch.isnan(broken[1]).all()

fixed = scores.masked_fill(mask, torch.finfo(scores.dtype).min).softmax(-1)
print("with finfo(float16).min:", fixed.tolist())
assert torch.isfinite(fixed).all() and fixed[0, 0] == 1  # row 1: only the open position counts

# %% [markdown]
# `-inf` itself is right for a *partly* masked row (exp(-inf) = 0) but gives NaN for a *fully*
# masked one, in every dtype: models that can see one (padding) use `finfo(dtype).min`. In bfloat16
# -1e9 fits (float32's range), one reason bf16 needs neither a scaler nor mask surgery.

# %%
inf_row = scores.float().masked_fill(mask, float("-inf")).softmax(-1)
assert inf_row[0, 0] == 1 and torch.isnan(inf_row[1]).all()  # -inf: fine partly, NaN fully
assert torch.isfinite(torch.tensor(-1e9, dtype=torch.bfloat16))

# %% [markdown]
# Two more facts for float16 attention, on the CPU tensors of this section. **Under autocast a cast
# to float32 does not keep a matmul in float32**: matmul is on autocast's lower-precision list on
# CPU and CUDA, so `q.float() @ k.float().T` inside the block runs in float16 again; compute the
# float32 part under `torch.autocast(..., enabled=False)`. Softmax is on CUDA's float32 list but
# on no CPU list: CPU autocast leaves it in the dtype it gets. And
# **`F.scaled_dot_product_attention` returns zeros for a fully masked row on the CPU** (its boolean
# `attn_mask` means True = may attend).

# %%
x = torch.randn(4, 64)
with torch.autocast("cpu", dtype=torch.float16):
    recast, soft = x.float() @ x.float().T, x.half().softmax(-1)
print(f"CPU fp16 autocast: x.float() @ x.float().T -> {recast.dtype}, softmax -> {soft.dtype}")
assert recast.dtype == soft.dtype == torch.float16
assert all(has_autocast_kernel("aten::matmul", d) for d in ("cpu", "cuda"))
assert has_autocast_kernel("aten::softmax.int", "cuda") and not has_autocast_kernel(
    "aten::softmax.int", "cpu")
may_attend = torch.tensor([[True, False], [False, False]])  # row 2: no open key
sdpa_out = F.scaled_dot_product_attention(*(torch.randn(2, 8).half(),) * 3, attn_mask=may_attend)
print("SDPA, fully masked row on the CPU:", sdpa_out[1, :4].tolist())
assert sdpa_out[1].eq(0).all() and torch.isfinite(sdpa_out).all()

# %% [markdown]
# ### Exercise: masked attention that stays right in float16
#
# Write `masked_attention(q, k, v, mask)`: q, k, v have shape (batch, heads, seq, head_dim), and
# `mask` is boolean, (batch, heads, seq, seq), True where a query may attend to a key.
#
# - Return softmax(q·kᵀ / sqrt(head_dim)) over the open keys, times v: shaped like v, **in v's
#   dtype** (float16 in, float16 out).
# - A query whose mask row is all False gets **zeros**, as SDPA gives on the CPU: it attends to
#   nothing. A -inf fill makes that row 0/0 = NaN, which spreads into the loss; a
#   `finfo(dtype).min` fill makes it a uniform average of v.
# - Stay right in float16 when q·k exceeds 65504 before the scale.
#
# The checker calls your function on the CPU with float16 tensors, with float16 tensors under
# `torch.autocast("cpu", dtype=torch.float16)`, and with float32 and bfloat16 tensors; on a random
# mask with fully masked rows, a causal mask, scores of 18 after scaling, q·k of 262144 before
# scaling, and drawn inputs: other shapes and mask patterns, and the entries of 40 above with
# opposite signs. It compares each result with a right answer's on the same inputs (as close as
# the inputs' precision allows) and names each mistake it sees. Then
# it runs your function once more on fake CUDA, XPU and MPS tensors (shapes and dtypes, no values)
# under their float16 autocast, where an autocast switched off for the CPU alone does nothing.
# SDPA and hand-written attention both pass.

# %% tags=["exercise"] solution="masked_attention.py"
# YOUR CODE: replace the body of this function, run this cell, then run the checker below.
def masked_attention(q, k, v, mask):
    """Attention where mask (bool, True = may attend) allows; zeros for fully masked rows."""
    raise NotImplementedError(
        "Compute the scores so that float16 cannot overflow (scale q first, or float32 outside "
        "autocast, or F.scaled_dot_product_attention), mask them, softmax over the keys, "
        "multiply by v, then set fully masked rows to zero and return v's dtype."
    )


# %%
result = check_masked_attention(masked_attention)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# ## 2. Which attention kernel runs, and what the slow one costs
#
# `F.scaled_dot_product_attention` chooses one of the `torch.nn.attention.SDPBackend` members at
# run time (math, flash attention, memory-efficient, cuDNN, "overrideable" for extensions). On
# **CPU** it tries a fused flash kernel for float32, float64, bfloat16 and float16, then math
# (`aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`). On **NVIDIA GPUs** it tries flash, then
# memory-efficient, then math; flash needs float16 or bfloat16 and compute capability 8.0 to 12.1
# (`check_flash_attention_hardware_support` in `cuda/sdp_utils.cpp`), memory-efficient also takes
# float32. On H100 and B200 (sm90, sm100) with a cuDNN newer than 9.15, as PyTorch's CUDA 13
# wheels bring, cuDNN attention is tried first (`check_prefer_cudnn_attention`;
# `TORCH_CUDNN_SDPA_DEPRIORITIZED=1` restores the old order). On ROCm the fused kernels come from
# AOTriton, per architecture; MPS has no fused kernel for training. Two
# checks: allow one backend with `sdpa_kernel(...)` and see it run or raise ("No viable
# backend"), and read the kernel's op name in the profiler.

# %%
heads, head_dim = sizes.n_heads, sizes.d_model // sizes.n_heads
qkv_shape = (sizes.batch, heads, sizes.seq_len, head_dim)  # lesson 12's attention at this preset
dtypes = [torch.float32, *info.amp_dtypes]
backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
kernels = {}
for dt in dtypes:
    q, k, v = (torch.randn(qkv_shape, device=info.device, dtype=dt) for _ in range(3))
    row = {b.name: backend_runs(b, q, k, v) for b in backends}
    row["default kernel (profiler)"] = ", ".join(
        op for op in attention_ops(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True)) if op != "aten::scaled_dot_product_attention")
    kernels[dtype_name(dt)] = row
kernels = pd.DataFrame(kernels).T
kernels

# %%
assert kernels["MATH"].all()  # the fallback runs everywhere
if info.type == "cpu":
    assert kernels["FLASH_ATTENTION"].all() and not kernels["EFFICIENT_ATTENTION"].any()
    assert kernels["default kernel (profiler)"].str.contains("flash_attention_for_cpu").all()
elif info.type == "cuda" and torch.version.hip is None:
    assert not kernels.loc["fp32", "FLASH_ATTENTION"]  # flash needs fp16/bf16 on NVIDIA
    if torch.cuda.get_device_capability(info.device) >= (8, 0):  # and sm80 or newer
        assert kernels.loc[dtype_name(info.amp_dtypes[0]), "FLASH_ATTENTION"]

# %% [markdown]
# **The cost of the fallback.** The math backend is attention written out: `q @ k.T`, scale,
# mask, softmax, `@ v`. It materialises the (seq x seq) score matrix per head and saves it for
# backward; the fused kernels do not. Measured at this preset's attention size, forward and
# backward, the default kernel against math forced with `sdpa_kernel(SDPBackend.MATH)`: the two
# take turns step by step with a second default run as the control (`interleave`, lesson 03),
# and the bytes autograd saves are counted with `saved_bytes`
# (`amp_tutorial.attention.attention_cost` measures one backend alone, in one call).

# %%
def attention_step(backend, dtype):
    """A causal SDPA forward + backward on random inputs of ``qkv_shape`` (``step``), and the
    forward alone (``attend``); backend None lets SDPA choose, else only ``backend`` may run."""
    q, k, v = (torch.randn(qkv_shape, device=info.device, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def attend():
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def step():
        attend().sum().backward()
        q.grad = k.grad = v.grad = None

    return step, attend


# %%
timed, cost = {}, {}
for dt in dtypes:
    d = dtype_name(dt)
    runs = {f"{d} {name}": attention_step(backend, dt) for name, backend in
            (("default", None), ("default again", None), ("math", SDPBackend.MATH))}
    timed[d] = interleave({run: step for run, (step, _) in runs.items()}, f"{d} default",
                          f"{d} default again", info.device, warmup=1, preset=preset.name,
                          blocks=max(MIN_BLOCKS, sizes.steps // 8), progress=False)
    for run in (f"{d} default", f"{d} math"):
        step, attend = runs[run]
        _, peak = step_peak(step, info.device)  # one more step, the peak reset before it
        timing = timed[d].timings[run]
        cost[run] = {"time fwd+bwd median (ms)": timing.median * 1e3,
                     "IQR (ms)": timing.iqr * 1e3,
                     "saved for backward (MB)": saved_bytes(attend).new / 2**20,
                     "peak (MB)": peak / 2**20 if peak is not None else float("nan")}
        print(f"{run}: {timing}")
cost = pd.DataFrame(cost).T
cost.round(3)

# %% [markdown]
# Whether math is slower is read as in lesson 03: the median of the per-block ratios with its 90%
# interval, stated only where the control (default against default) holds 1.0 and both intervals
# are narrow, at a preset big enough to time; otherwise the line says why there is none here.

# %%
score_elements = sizes.batch * heads * sizes.seq_len**2  # one (seq x seq) matrix per head
for dt in dtypes:
    d = dtype_name(dt)
    default, math = cost.loc[f"{d} default"], cost.loc[f"{d} math"]
    saved_x = math["saved for backward (MB)"] / default["saved for backward (MB)"]
    c = timed[d].comparison(f"{d} math")
    print(f"{d}: math keeps {saved_x:.2f}x the bytes of the default kernel; "
          f"{with_recorded(c, f'13 {d} math', info)}")
    element = torch.finfo(dt).bits // 8
    assert math["saved for backward (MB)"] * 2**20 >= score_elements * element  # the matrix
    default_fused = fused_for_training(qkv_shape, dt, info.device)  # False: the default is math
    if sizes.seq_len > 2 * head_dim and default_fused:  # the score matrix outweighs the rest
        assert saved_x > 1, f"{d}: math did not keep more than the fused kernel"

# %% [markdown]
# The score matrix grows with seq², what a fused kernel keeps (q, k, v, output, one log-sum-exp
# per row) with seq x head_dim: the gap widens with longer sequences (at `smoke`, sequence 16 and
# head dimension 32, the fused kernel even keeps more; where the default *is* math, the two are the
# same). The trace below shows that the math backend computes low-precision attention in
# **float32**: it casts q, k and v up,
# runs matmuls and softmax in float32 and casts the result back, losing AMP's speed *and* memory
# saving (`_scaled_dot_product_attention_math` in `aten/src/ATen/native/transformers/attention.cpp`)
# unless `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)` allows fp16/bf16 (a beta
# flag that, despite its module, applies on every device). MPS is the exception for inference:
# where no input needs a gradient, its math case calls its own Metal kernel,
# `_scaled_dot_product_attention_math_for_mps`, which stays in the input dtype (`attention.cpp`).

# %%
amp_dtype, low = info.amp_dtype, dtype_name(info.amp_dtype)
q, k, v = (torch.randn(qkv_shape, device=info.device, dtype=amp_dtype) for _ in range(3))
with sdpa_kernel(SDPBackend.MATH):
    math_ops = trace_dtypes(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
print([f"{t.op}->{t.output}" for t in math_ops])
if info.type == "mps":  # no gradient: MPS's own kernel, in the input dtype
    assert any("math_for_mps" in t.op and t.output == low for t in math_ops), math_ops
elif not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():  # the default
    assert [t.output for t in math_ops if t.op == "bmm"] == ["fp32", "fp32"]
    assert math_ops[-1].op == "_to_copy" and math_ops[-1].output == low

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# The outcomes were measured on a CPU, at `smoke` and `cpu`, in bf16 and in fp16 mode (section 1
# uses explicit float16 tensors and no preset, so there all four runs agree).
#
# 1. **Where float16 ends.** In section 1's first cell, change `40.0` to `31.0`. The unscaled score,
#    64 x 31 x 31 = 61504, is below 65504 and stays finite; all four scores are equal, so softmax
#    gives a uniform row (0.25 each), and the first assert fails. At `32.0` the score is 65536:
#    `inf` again. Entries of 31 are the largest whole numbers whose 64-term dot product fits.
# 2. **A -1e4 mask.** In the next cell, change the `-1e9` on the `additive = ...` line to `-1e4`.
#    float16 holds -10000, so the mask is finite, the fully masked row gives 0.33325 three times
#    instead of NaN, and the `isinf` assert fails (the message still says -1e9). The row is uniform
#    only by rounding: float16's numbers near 10000 are 8 apart, so 1, 2 and 3 minus 10000 all
#    round to -10000. In float32 the same row gives 0.090, 0.245 and 0.665: the masked scores show
#    through.
# 3. **Math SDPA in low precision.** At the top of the last cell, add
#    `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`. The trace loses its
#    `_to_copy` ops: `mul`, both `bmm` and `_safe_softmax` now run in the input dtype (`bmm->bf16`,
#    or `bmm->fp16` in fp16 mode), and the asserts, written for the default, are skipped. The flag
#    is global: set it back to `False` before you re-run section 2.

# %% [markdown]
# ## What to remember
#
# - In float16: scale before the product, never build masks from constants float16 cannot hold,
#   use `torch.finfo(dtype).min` where a row can be fully masked, or switch to bfloat16.
# - Under autocast, `.float()` before a matmul is undone (matmul is on the lower-precision list):
#   compute float32 scores with autocast disabled. Give fully masked rows zeros (`torch.where`).
# - Check which attention kernel runs (`sdpa_kernel` + the profiler): the math fallback stores the
#   full score matrix and costs time (and by default it computes in float32); on NVIDIA, flash
#   attention needs float16 or bfloat16 and an Ampere or newer GPU.
#
# **Troubleshooting.** `value cannot be converted to type c10::Half without overflow`: a mask
# constant that float16 cannot hold (use `finfo(dtype).min`). NaN loss from the first fp16 step with
# no scaler skip: look for a fully masked attention row. "Flash attention kernel not used because":
# the warning lists the reasons (dtype, head dimension, mask, dropout).
