# ---
# jupyter:
#   amp_tutorial:
#     minutes:
#       cpu: 7.9
#       smoke: 1.0
#     needs: any device, CPU included; SDPA kernels per dtype and CUDA's float32 list
#       on an NVIDIA GPU
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
# # 11 · AMP on a transformer: the float32 list, attention masks and the attention kernels
#
# Lessons 03-10 trained a per-pixel MLP. The models people train today are transformers, where
# AMP both pays off most and goes wrong most often: attention scores that overflow float16, masks
# that turn into NaN, layer norm and softmax, a cross-entropy over a vocabulary, and an attention
# kernel that is only fast in some dtypes.
#
# We train a small decoder-only transformer (`amp_tutorial.transformer`: embeddings, causal
# self-attention through `F.scaled_dot_product_attention`, LayerNorm, a GELU MLP, a vocabulary
# head) on a task generated in code: **reverse a random string of symbols**. Every statement below
# is measured on this device and asserted. Sizes come from the preset; seeds are fixed, so every
# run starts from the same weights and sees the same batches.

# %%
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from amp_tutorial.attention import attention_cost, attention_ops, backend_runs, fused_for_training
from amp_tutorial.bench import make_transformer_problem
from amp_tutorial.device import describe_device, dtype_name, fp32_baseline, select_device
from amp_tutorial.measure import (
    StepTimer,
    peak_memory_bytes,
    reset_peak_memory,
    saved_activation_bytes,
    timing_columns,
)
from amp_tutorial.plots import plot_bars, plot_losses
from amp_tutorial.policy import (
    FP32,
    FP32_OUT,
    NO_RULE,
    SOURCE_POLICY,
    autocast_policy,
    trace_dtypes,
)
from amp_tutorial.presets import get_preset
from amp_tutorial.tasks import IGNORE_INDEX, sequence_loss
from amp_tutorial.training import make_sequence_train_step, sequence_accuracy
from amp_tutorial.transformer import DecoderTransformer

info = select_device()
preset = get_preset(device_type=info.type)
sizes = preset.transformer
print(describe_device(info))
print(f"preset {preset.name!r}: {sizes}")

# %% [markdown]
# ## The task and the model
#
# One example is a prompt of `seq_len / 2` random symbols, a separator, and the prompt reversed.
# The model predicts every next token; only the answer tokens carry a loss (the prompt is marked
# `IGNORE_INDEX`). Answer token *i* is prompt token *L-1-i*, so only attention can solve it.
# `make_transformer_problem`, shared with the benchmark, gives one training batch per step and
# four held-out batches (another seed) for accuracy.

# %%
config, train_batches, test_batches = make_transformer_problem(preset, info.device)
inputs, targets = train_batches[0]
half = sizes.seq_len // 2
print(f"inputs {tuple(inputs.shape)} (batch, seq); vocabulary {config.vocab_size} "
      f"({sizes.n_symbols} symbols + separator)")
print("first example, first 12 prompt tokens:", inputs[0, :12].tolist())
print("its answer, last 12 tokens:           ", targets[0, -12:].tolist())
assert (targets[:, :half] == IGNORE_INDEX).all()  # no loss on the prompt
assert torch.equal(targets[:, half:], inputs[:, :half].flip(1))  # the answer is the reversed prompt

model = DecoderTransformer(config).to(info.device)
logits = model(inputs)
assert logits.shape == (*inputs.shape, config.vocab_size)
n_params = sum(p.numel() for p in model.parameters())
print(model.blocks[0])
print(f"{n_params / 1e6:.2f} M parameters; untrained loss {sequence_loss(logits, targets):.3f} "
      f"(ln {config.vocab_size} = {torch.log(torch.tensor(config.vocab_size)):.3f} for a guess)")
del model, logits

# %% [markdown]
# ## 1. fp32 against AMP, measured
#
# The loop of lesson 03, with cross-entropy and AdamW: only the forward pass and the loss run under
# `torch.autocast`; float16 needs the GradScaler, bfloat16 does not (`enabled=False` makes every
# scaler call a pass-through). Measured per run: time per step (median and IQR after warm-up,
# device synchronised), the bytes saved for backward, the allocator peak (GPUs), every step's
# loss and the held-out accuracy.

# %%
def train(amp_dtype):
    """Train a fresh, identically seeded model; amp_dtype=None is the fp32 baseline."""
    use_amp = amp_dtype is not None
    torch.manual_seed(0)
    reset_peak_memory(info.device)
    model = DecoderTransformer(config).to(info.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sizes.lr)
    scaler = torch.amp.GradScaler(info.type, enabled=use_amp and info.needs_grad_scaler(amp_dtype))
    timer = StepTimer(info.device, warmup=sizes.warmup)  # the first steps are not timed
    losses = []

    label = dtype_name(amp_dtype) if use_amp else fp32_baseline(info)
    for inputs, targets in tqdm(train_batches, desc=label):  # warmup + steps batches
        with timer.step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=info.type, dtype=amp_dtype or torch.float32,
                                enabled=use_amp):  # forward + loss only
                loss = sequence_loss(model(inputs), targets)
            scaler.scale(loss).backward()  # a pass-through unless the scaler is enabled (fp16)
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())

    peak = peak_memory_bytes(info.device)
    with torch.autocast(device_type=info.type, dtype=amp_dtype or torch.float32, enabled=use_amp):
        saved = saved_activation_bytes(lambda: sequence_loss(model(inputs), targets))
    return {"timing": timer.timing, "losses": losses, "peak": peak, "saved": saved,
            "accuracy": sequence_accuracy(model, test_batches, amp_dtype)}


# %%
baseline = fp32_baseline(info)
runs = {baseline: train(None)}
for amp_dtype in info.amp_dtypes:
    runs[f"AMP {dtype_name(amp_dtype)}"] = train(amp_dtype)
for name, r in runs.items():
    print(f"{name:9s} {r['timing']}; held-out accuracy {r['accuracy']:.3f}")

# %% [markdown]
# The benchmark (`pdm run bench --model transformer`) runs `make_sequence_train_step` from the
# package. It is this loop: started from the same seed on the same batches, its first steps give
# the same losses as the fp32 run above (`step(i)` trains on batch `i`).

# %%
torch.manual_seed(0)
check_model = DecoderTransformer(config).to(info.device)
check_step = make_sequence_train_step(
    check_model, torch.optim.AdamW(check_model.parameters(), lr=sizes.lr), train_batches)
check_losses = [check_step(i) for i in range(2)]
assert check_losses[0] == runs[baseline]["losses"][0]  # the forward is deterministic
# the second loss follows one backward: on CUDA, SDPA's backward may be nondeterministic (its docs)
assert np.isclose(check_losses[1], runs[baseline]["losses"][1], rtol=0 if info.type == "cpu"
                  else 1e-5, atol=0), (check_losses, runs[baseline]["losses"][:2])
del check_model, check_step

# %%
base = runs[baseline]
results = pd.DataFrame({
    name: {
        **timing_columns(r["timing"], base["timing"], r["peak"]),
        "saved activations (MB)": r["saved"] / 2**20,
        "activations vs fp32": r["saved"] / base["saved"],
        "final loss": r["losses"][-1],
        "held-out accuracy": r["accuracy"],
    }
    for name, r in runs.items()
}).T
results.round(3)

# %% [markdown]
# Checked on every device: each run learns the task (at least the preset's accuracy on sequences
# it never saw), AMP keeps at most 0.6 of fp32's saved-activation bytes, and its accuracy is within
# one point of fp32's. The 0.6 holds where attention trains in a fused kernel; where SDPA falls
# back to its math kernel for training (MPS, which has no fused kernel; ROCm GPUs without
# AOTriton's), attention runs and saves in float32 even under autocast (section 3), and the bound
# is 0.85. Time is reported, not asserted: `smoke` and `cpu` are too small for bf16 to
# win, and the benchmark measures speed. On a CPU, bf16 is fast only with native bf16 instructions
# (AVX512-BF16 or AMX). Without them there are two cases. With AVX512 (bw, vl, dq), oneDNN still
# runs bf16 matmuls, converting to fp32 as it goes. With AVX2 only (many laptops), oneDNN's bf16
# path is off (`mkldnn_bf16_device_check` in `aten/src/ATen/native/mkldnn/Utils.h`), and a bf16
# matmul falls back to ATen's reference gemm. On a 2-core AVX2 EPYC that fallback ran about 4x
# slower than fp32 for the forward `x @ W.T`, and 34x slower for the backward's `grad @ W`, so a
# training step took about 10x as long. `get_cpu_capability()` cannot tell these cases apart (an
# AMX CPU reports "AVX512" too), so the next cell prints what the course read from the CPU's
# flags (`info.native_bf16`) and whether oneDNN's bf16 kernels run (`info.notes`).

# %%
qkv_shape = (sizes.batch, config.n_heads, sizes.seq_len, config.d_model // config.n_heads)
fused = {f"AMP {dtype_name(d)}": fused_for_training(qkv_shape, d, info.device)
         for d in info.amp_dtypes}  # False where SDPA trains in its math fallback
print(f"attention trains in a fused kernel: {fused}")

# %%
for name, r in runs.items():
    assert r["accuracy"] >= sizes.accuracy_target, f"{name}: accuracy {r['accuracy']:.3f}"
    assert all(torch.isfinite(torch.tensor(r["losses"]))), f"{name}: non-finite loss"
    if name != baseline:
        limit = 0.6 if fused[name] else 0.85
        assert r["saved"] / base["saved"] <= limit, f"{name}: {r['saved'] / base['saved']:.2f}"
        assert abs(r["accuracy"] - base["accuracy"]) <= 0.01, f"{name} vs {baseline} accuracy"
        if r["peak"] is not None:
            assert r["peak"] < base["peak"], f"{name}: allocator peak not below fp32"
speedups = results["speedup (t_fp32 / t)"].drop(baseline)
if info.type == "cpu":
    print(f"native bf16 on this CPU: {info.native_bf16}", *info.notes, sep="\n  ")
print(f"On {info.name}, preset {preset.name}: {speedups.idxmax()} ran at {speedups.max():.2f}x "
      f"the speed of {baseline} (t_fp32 / t_amp, medians), saved "
      f"{results.loc[speedups.idxmax(), 'activations vs fp32']:.2f} of its activation bytes.")

# %%
fig = plot_losses({n: r["losses"] for n, r in runs.items()},
                  f"Training loss, fp32 vs AMP ({preset.name} preset)",
                  ylabel="cross-entropy (log scale)")

# %%
bars = {"time per step (ms)": results["time/step median (ms)"].to_dict(),
        "saved activations (MB)": results["saved activations (MB)"].to_dict()}
if info.has_allocator_stats:
    bars["peak memory (MB)"] = results["peak memory (MB)"].to_dict()
fig = plot_bars(bars, f"Transformer training on {info.type}: fp32 vs AMP")

# %% [markdown]
# ## 2. Inside one block: which op ran in which dtype
#
# `trace_dtypes` runs a function under a `TorchDispatchMode`, which sits *below* autocast: it sees
# every aten op that actually ran, with the dtypes it received and produced, including the
# `_to_copy` casts autocast inserts. Here: one block, then the head and the loss, under autocast.

# %%
amp_dtype = info.amp_dtype
low = dtype_name(amp_dtype)
probe = DecoderTransformer(config).to(info.device)
x = probe.tok_emb(inputs) + probe.pos_emb(torch.arange(inputs.shape[1], device=info.device))
with torch.autocast(device_type=info.type, dtype=amp_dtype):
    block_ops = trace_dtypes(lambda: probe.blocks[0](x))
    loss_ops = trace_dtypes(lambda: sequence_loss(probe.head(probe.ln_f(x)), targets))
trace = pd.DataFrame([{"op": t.op, "inputs": ", ".join(t.inputs), "output": t.output}
                      for t in block_ops + loss_ops])
trace

# %% [markdown]
# How to read it (asserted below for this device):
#
# - The **linear layers** (`addmm`) and **attention** run in the low dtype, weights cast on the way
#   in (`_to_copy`): linear, matmul and `scaled_dot_product_attention` are on autocast's
#   lower-precision list on CPU and CUDA (`aten/src/ATen/autocast_mode.cpp`, `autocast_mode.h`).
# - The **residual stream stays float32**: `x + attn(...)` adds a float32 tensor and a
#   low-precision one, and ordinary type promotion gives float32, autocast or not.
# - **Layer norm** therefore receives float32 here and runs in float32, on every device, for
#   device-specific reasons. On CUDA, `layer_norm` is on autocast's float32 list: autocast casts
#   its input up, whatever it is. On CPU, layer norm and softmax are on no list (of this model's
#   ops only the loss, `cross_entropy_loss` / `nll_loss`, is): a bf16 input to them runs in bf16.
#   The probe shows both.
# - **Cross-entropy** runs in float32 on every device because the course's `sequence_loss` casts
#   the logits with `.float()` first, and you should too. Autocast alone does not do it on a GPU:
#   on CUDA, XPU and MPS `cross_entropy` is on no list, and it calls `log_softmax(x,
#   dtype=x.dtype)`; autocast keeps an explicit dtype (`fp32_set_opt_dtype` in `autocast_mode.h`),
#   so a 16-bit input is normalised in 16 bits and only `nll_loss` gets float32. Only CPU autocast
#   lists `cross_entropy_loss` itself. Its log-softmax subtracts the row's maximum, so no exp
#   overflows; the reason is the sum of exps over the vocabulary, which in 16 bits loses the
#   small terms. It matters little for this task's 11 to 33 tokens, a lot for a language model's
#   tens of thousands.

# %%
assert any(t.op == "addmm" and t.output == low for t in block_ops), "linear not lowered"
sdpa = [t for t in block_ops if "scaled_dot_product" in t.op]
if fused[f"AMP {low}"]:
    assert sdpa and all(t.output == low for t in sdpa), sdpa
else:  # the math fallback decomposes into casts, bmm and softmax, in float32 (section 3)
    assert [t.output for t in block_ops if t.op == "bmm"] == ["fp32", "fp32"], block_ops
assert any(t.op == "_to_copy" and t.inputs == ("fp32",) and t.output == low
           for t in block_ops), "no cast of the weights to the low dtype"
norms = [t for t in block_ops if "layer_norm" in t.op]
assert norms and all(t.output == "fp32" for t in norms), norms
logs = [t for t in loss_ops if "log_softmax" in t.op]
assert logs and all(t.output == "fp32" for t in logs), "cross-entropy did not run in float32"

# %% [markdown]
# Lesson 01's probe separates what autocast decides from what the op does anyway: each op runs
# with autocast off and on, on float32 and low-precision inputs; only what changes counts as
# autocast's rule. (Cross-entropy was read from the trace: on CPU `cross_entropy_loss` is on the
# float32 list; on CUDA `nll_loss` is, and `log_softmax` keeps the dtype it is handed.)

# %%
policy = {p.op: p for p in autocast_policy(info.type, amp_dtype)}
for op in ("layer_norm", "softmax"):
    print(f"{info.type}: {op:10s} {low} input, autocast off -> on: {policy[op].cases['low']}"
          f"  ({policy[op].verdict})")
if info.type in SOURCE_POLICY:  # what PyTorch's autocast_mode.cpp/.h list for this device
    for op in ("layer_norm", "softmax"):
        assert policy[op].verdict == SOURCE_POLICY[info.type][op], op
if info.type == "cpu":  # on no CPU list: a bf16 input stays bf16
    assert policy["layer_norm"].verdict == policy["softmax"].verdict == NO_RULE
cuda = {p.op: p for p in autocast_policy("cuda", amp_dtype)}  # fake CUDA tensors off a GPU
print(f"cuda ({cuda['layer_norm'].how}): layer_norm {cuda['layer_norm'].verdict}, "
      f"softmax {cuda['softmax'].verdict}")
# CUDA (and ROCm): layer_norm is a float32 op, softmax float32 unless a dtype= is given
assert cuda["layer_norm"].verdict == FP32 and cuda["softmax"].verdict == FP32_OUT

# %% [markdown]
# On CPU a bf16 layer norm or softmax is no float16 accident waiting to happen: bf16 has float32's
# range, and with large inputs the bf16 kernels match float32 (on the same bf16-rounded input) to
# about one bf16 rounding (2^-8): they accumulate in float32 internally.

# %%
wide = (torch.randn(64, 256) * 30).bfloat16()  # on the CPU: its kernels are the ones described
for name, fn in {"softmax": lambda t: t.softmax(-1),
                 "layer_norm": lambda t: F.layer_norm(t, (256,))}.items():
    exact = fn(wide.float())
    err = ((fn(wide).float() - exact).abs() / exact.abs().clamp_min(1e-6)).max().item()
    print(f"bf16 {name}: largest relative error {err:.2e} against float32 (bf16 unit roundoff "
          f"{2**-8:.2e})")
    assert err <= 2 * 2**-8, f"bf16 {name} is worse than bf16 rounding"

# %% [markdown]
# ## 3. Attention in float16: the two classic failures and their fixes
#
# These run with explicit float16 tensors on any device, CPU included. float16's largest finite
# value is 65504.
#
# **Scores that overflow.** A score is a query-key dot product: with head dimension 64 and entries
# of 40 (large activations happen, e.g. without normalisation) it is 64 x 40 x 40 = 102400, `inf`
# in float16, and softmax of a row holding `inf` is NaN. Scaling the query by 1/sqrt(d) *before*
# the product keeps it at 12800 (SDPA's math backend scales q and k before its matmul, as the
# trace in section 4 shows); bfloat16 holds even the unscaled value.

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
# ## 4. Which attention kernel runs, and what the slow one costs
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
heads, head_dim = config.n_heads, config.d_model // config.n_heads
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
# backward, the default kernel against math forced with `sdpa_kernel(SDPBackend.MATH)`
# (`attention_cost` from `amp_tutorial.attention` times it and counts the saved bytes):

# %%
cost = pd.DataFrame({
    f"{dtype_name(dt)} {name}": attention_cost(backend, qkv_shape, dt, info.device,
                                               steps=max(3, sizes.steps // 4))
    for dt in dtypes for name, backend in (("default", None), ("math", SDPBackend.MATH))}).T
cost.round(3)

# %%
score_elements = sizes.batch * heads * sizes.seq_len**2  # one (seq x seq) matrix per head
for dt in dtypes:
    d = dtype_name(dt)
    fused, math = cost.loc[f"{d} default"], cost.loc[f"{d} math"]
    saved_x = math["saved for backward (MB)"] / fused["saved for backward (MB)"]
    time_x = math["time fwd+bwd median (ms)"] / fused["time fwd+bwd median (ms)"]
    print(f"{d}: math keeps {saved_x:.2f}x the bytes of the default kernel and takes {time_x:.2f}x "
          f"its time")
    element = torch.finfo(dt).bits // 8
    assert math["saved for backward (MB)"] * 2**20 >= score_elements * element  # the matrix
    default_fused = fused.get(f"AMP {d}") if dt != torch.float32 else fused_for_training(
        qkv_shape, dt, info.device)
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
# ## What to remember
#
# - Autocast lowers the matmuls (linear, attention); a pre-norm transformer keeps its residual
#   stream, layer norms and loss in float32. On CUDA autocast itself runs layer norm and
#   `nll_loss` in float32, but cross-entropy's log-softmax keeps a 16-bit input's dtype: cast the
#   logits with `.float()` before the loss. On CPU only the loss is on the float32 list.
# - In float16: scale before the product, never build masks from constants float16 cannot hold,
#   use `torch.finfo(dtype).min` where a row can be fully masked, or switch to bfloat16.
# - Check which attention kernel runs (`sdpa_kernel` + the profiler): the math fallback stores the
#   full score matrix and costs time (and by default it computes in float32); on NVIDIA, flash
#   attention needs float16 or bfloat16 and an Ampere or newer GPU.
# - `pdm run bench --model transformer` measures this lesson's fp32-vs-AMP comparison with the
#   same code.
#
# **Troubleshooting.** `value cannot be converted to type c10::Half without overflow`: a mask
# constant that float16 cannot hold (use `finfo(dtype).min`). NaN loss from the first fp16 step with
# no scaler skip: look for a fully masked attention row. "Flash attention kernel not used because":
# the warning lists the reasons (dtype, head dimension, mask, dropout).
