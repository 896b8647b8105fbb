# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 40
#     memory:
#       cpu: 234
#       paper: 3463
#     minutes:
#       cpu: 0.8
#       small: 0.4
#       smoke: 0.3
#     needs: any device, CPU included; CUDA's float32 list on an NVIDIA GPU
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
# # 12 · AMP on a transformer: what it saves, and which op runs in which dtype
#
# Lessons 03-11 trained a per-pixel MLP. The models people train today are transformers, where
# AMP both pays off most and goes wrong most often. This lesson answers the first question about
# them: what AMP buys on a transformer, measured against fp32 with the training loop of lesson 03,
# and which of its ops really run in low precision (the linear layers and attention, the residual
# stream, layer norm and softmax, a cross-entropy over a vocabulary), read with the probe of
# lesson 01. Lesson 13 continues with attention itself: scores and masks in float16, and which
# attention kernel runs.
#
# We train a small decoder-only transformer (`amp_tutorial.transformer`: embeddings, causal
# self-attention through `F.scaled_dot_product_attention`, LayerNorm, a GELU MLP, a vocabulary
# head) on a task generated in code: **reverse a random string of symbols**. Every statement below
# is measured on this device and asserted. Sizes come from the preset; seeds are fixed, so every
# run starts from the same weights and sees the same batches.

# %%
import itertools

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from amp_tutorial.attention import fused_for_training
from amp_tutorial.device import device_line, dtype_name, fp32_baseline, select_device
from amp_tutorial.interleave import interleave
from amp_tutorial.measure import (
    Comparison,
    saved_bytes,
    step_peak,
    timing_columns,
)
from amp_tutorial.plots import plot_bars, plot_block_dtypes, plot_losses
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded
from amp_tutorial.reversal_task import IGNORE_INDEX, make_transformer_problem, sequence_loss
from amp_tutorial.steps import make_sequence_train_step, sequence_accuracy
from amp_tutorial.transformer import DecoderTransformer

# %%
info = select_device()
preset = get_preset(device_type=info.type)
sizes = preset.transformer
torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset, sizes=f"transformer d_model {sizes.d_model}, {sizes.n_layers} "
                                    f"layers, batch {sizes.batch} x {sizes.seq_len} tokens, "
                                    f"{sizes.steps} steps"))

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
# scaler call a pass-through). The runs take turns step by step against an fp32 twin, as in
# lesson 03 (`interleave`). Measured per run: time per step (median and IQR after warm-up,
# device synchronised), the bytes saved for backward, the allocator peak (GPUs), every step's
# loss and the held-out accuracy.

# %%
def saved_and_accuracy(model, amp_dtype):
    """Bytes a trained model saves for backward in one forward + loss, and held-out accuracy."""
    with torch.autocast(device_type=info.type, dtype=amp_dtype or torch.float32,
                        enabled=amp_dtype is not None):
        saved = saved_bytes(lambda: sequence_loss(model(inputs), targets), model)
    return {"saved": saved, "accuracy": sequence_accuracy(model, test_batches, amp_dtype)}


# %%
def new_run(amp_dtype):
    """A fresh, identically seeded model and its training step (each call trains on the next
    batch); amp_dtype=None is the fp32 baseline."""
    use_amp = amp_dtype is not None
    torch.manual_seed(0)
    model = DecoderTransformer(config).to(info.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sizes.lr)
    scaler = torch.amp.GradScaler(info.type, enabled=use_amp and info.needs_grad_scaler(amp_dtype))
    batches, losses = itertools.cycle(train_batches), []

    def step():
        inputs, targets = next(batches)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=info.type, dtype=amp_dtype or torch.float32,
                            enabled=use_amp):  # forward + loss only
            loss = sequence_loss(model(inputs), targets)
        scaler.scale(loss).backward()  # a pass-through unless the scaler is enabled (fp16)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())

    return {"model": model, "step": step, "losses": losses, "amp_dtype": amp_dtype}


# %%
baseline = fp32_baseline(info)
control = f"{baseline} again"  # an identical fp32 run: against the first, 1.00x (lesson 03)
runs = {baseline: new_run(None), control: new_run(None),
        **{f"AMP {dtype_name(d)}": new_run(d) for d in info.amp_dtypes}}
timed = interleave({name: r["step"] for name, r in runs.items()}, baseline, control,
                   info.device, blocks=sizes.steps // 2, warmup=max(1, sizes.warmup // 2),
                   preset=preset.name)
for name, r in runs.items():
    _, peak = step_peak(r["step"], info.device)  # one more step, the peak reset before it
    r.update(timing=timed.timings[name], peak=peak,
             **saved_and_accuracy(r["model"], r["amp_dtype"]))
    print(f"{name:13s} {r['timing']}; held-out accuracy {r['accuracy']:.3f}")
del runs[control]  # the control's job is done: its comparison is printed below

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
comparisons = {c.name: c for c in timed.comparisons()}
results = pd.DataFrame({
    name: {
        **timing_columns(r["timing"], base["timing"], r["peak"], preset.name,
                         comparisons.get(name)),
        "saved activations (MB)": r["saved"].activations / 2**20,
        "cast weights (MB)": r["saved"].cast_weights / 2**20,
        "activations vs fp32": r["saved"].activations / base["saved"].activations,
        "final loss": r["losses"][-1],
        "held-out accuracy": r["accuracy"],
    }
    for name, r in runs.items()
}).T
results.round(3)

# %% [markdown]
# Checked on every device: each run learns the task (at least the preset's accuracy on sequences it
# never saw), AMP keeps at most 0.6 of fp32's saved-activation bytes, and its accuracy is within one
# point of fp32's. The 0.6 holds where attention trains in a fused kernel; where SDPA falls back to
# its math kernel for training (MPS, which has no fused kernel; ROCm GPUs without AOTriton's),
# attention runs and saves in float32 even under autocast (lesson 13, section 2), and the bound is
# 0.85. Time is reported, not asserted: at `smoke` and `small` bf16 is not expected to win; at
# `cpu`, on a 2-core EPYC (Zen 4) with AVX512-BF16, `pdm run bench --model transformer` measured
# bf16 training 1.72x faster than fp32 (docs/benchmark.md). On a CPU, bf16 is fast only with native
# bf16 instructions (AVX512-BF16 or AMX). Without them there are two cases. With AVX512 (bw, vl,
# dq), oneDNN still runs bf16 matmuls, converting to fp32 as it goes. With AVX2 only (many laptops),
# oneDNN's bf16 path is off (`mkldnn_bf16_device_check` in `aten/src/ATen/native/mkldnn/Utils.h`),
# and a bf16 matmul falls back to ATen's reference gemm. On a 2-core AVX2 EPYC that fallback ran
# about 4x slower than fp32 for the forward `x @ W.T`, and 34x slower for the backward's `grad @ W`,
# so a training step took about 10x as long. `get_cpu_capability()` cannot tell these cases apart
# (an AMX CPU reports "AVX512" too), so the next cell prints what the course read from the CPU's
# flags and oneDNN (`info.native_bf16`) and whether oneDNN's bf16 kernels run (`info.notes`).

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
        kept = r["saved"].activations / base["saved"].activations
        assert kept <= limit, f"{name}: {kept:.2f}"
        assert abs(r["accuracy"] - base["accuracy"]) <= 0.01, f"{name} vs {baseline} accuracy"
        if r["peak"] is not None:
            assert r["peak"] < base["peak"], f"{name}: allocator peak not below fp32"
if info.type == "cpu":
    print(f"native bf16 on this CPU: {info.native_bf16}", *info.notes, sep="\n  ")
for c in comparisons.values():
    print(f"On {info.name}, preset {preset.name}: "
          f"{with_recorded(c, f'12 train {c.name.split()[-1]}', info)}\n  it kept "
          f"{results.loc[c.name, 'activations vs fp32']:.2f} of fp32's activation bytes.")

# %%
fig = plot_losses({n: r["losses"] for n, r in runs.items()},
                  f"Training loss, fp32 vs AMP ({preset.name} preset)",
                  ylabel="cross-entropy")

# %%
bars = {"time per step (ms)": results["time/step median (ms)"].to_dict(),
        "saved activations (MB)": results["saved activations (MB)"].to_dict()}
if info.has_allocator_stats:
    bars["peak memory (MB)"] = results["peak memory (MB)"].to_dict()
noise = Comparison.why_no_ratio(comparisons.values())  # why the bars give no ratio, or None
fig = plot_bars(bars, f"Transformer training on {info.type}: fp32 vs AMP ({preset.name} preset); "
                "whiskers: ± half the IQR",
                errors={"time per step (ms)": results["time/step IQR (ms)"].div(2).to_dict()},
                noise={"time per step (ms)": noise})

# %% [markdown]
# ## 2. Inside one block: which op ran in which dtype
#
# `trace_dtypes` runs a function under a `TorchDispatchMode`, which sits *below* autocast: it sees
# every aten op that actually ran, with the dtypes it received and produced, including the
# `_to_copy` casts autocast inserts. Here: one block, then the head and the loss, under autocast.

# %%
from amp_tutorial.autocast_policy import trace_dtypes, trace_module
from amp_tutorial.kernels import has_device_kernel

amp_dtype = info.amp_dtype
low = dtype_name(amp_dtype)
probe = DecoderTransformer(config).to(info.device)
x = probe.tok_emb(inputs) + probe.pos_emb(torch.arange(inputs.shape[1], device=info.device))
with torch.autocast(device_type=info.type, dtype=amp_dtype):
    block_ops = trace_module(probe.blocks[0], x)  # each op tagged with the module that ran it
    loss_ops = trace_dtypes(lambda: sequence_loss(probe.head(probe.ln_f(x)), targets))
trace = pd.DataFrame([{"op": t.op, "inputs": ", ".join(t.inputs), "output": t.output}
                      for t in block_ops + loss_ops])
trace

# %% [markdown]
# The block's part of that trace as a picture: one box per op, top to bottom, in the colour of the
# dtype it gave, named by the module that ran it; the casts autocast inserted (the weights, and the
# input, to the low dtype) are folded into the op they feed and counted on its right. The linear
# layers (and attention, where SDPA runs fused) take the low dtype's colour; the two layer norms
# and the two residual adds stay blue: the residual stream is float32.

# %%
fig = plot_block_dtypes(block_ops, f"Block 0 under autocast ({low}) on {info.type}: the dtype "
                        "each op gave")

# %% [markdown]
# How to read it (asserted below for this device):
#
# - The **linear layers** (`addmm`) and **attention** run in the low dtype, weights cast on the way
#   in (`_to_copy`): linear, matmul and `scaled_dot_product_attention` are on autocast's
#   lower-precision list on CPU and CUDA (`aten/src/ATen/autocast_mode.cpp`, `autocast_mode.h`).
#   On MPS the trace shows `linear` instead of `addmm`: MPS has a kernel for `linear` itself
#   (`MPS: _mps_linear` in `native_functions.yaml`), so it is not decomposed into `addmm` there.
# - The **residual stream stays float32**: `x + attn(...)` adds a float32 tensor and a
#   low-precision one, and ordinary type promotion gives float32, autocast or not.
# - **Layer norm** therefore receives float32 here and runs in float32, on every device, for
#   device-specific reasons. On CUDA, `layer_norm` is on autocast's float32 list: autocast casts
#   its input up, whatever it is. On CPU, layer norm and softmax are on no list (of this model's
#   ops only the loss, `cross_entropy_loss` / `nll_loss`, is): a bf16 input to them runs in bf16.
#   The probe shows both.
# - **Cross-entropy** runs in float32 on every device because the course's `sequence_loss` casts the
#   logits with `.float()` first, and you should too. Autocast alone does not do it on a GPU: on
#   CUDA, XPU and MPS `cross_entropy` is on no list, and it calls `log_softmax(x, dtype=x.dtype)`;
#   autocast keeps an explicit dtype (`fp32_set_opt_dtype` in `autocast_mode.h`), so a 16-bit input
#   gives 16-bit log-probabilities and only `nll_loss` gets float32. Only CPU autocast lists
#   `cross_entropy_loss` itself. Its log-softmax subtracts the row's maximum, so no exp overflows,
#   and it sums the exps in float32 even for 16-bit inputs (CUDA's `host_softmax` in `SoftMax.cu`
#   accumulates in `acc_type<Half>`, float; the CPU kernel too), so no small terms are lost. What 16
#   bits cost is the output and its backward: each log-probability is rounded to 16 bits (near -20,
#   a language model's rare tokens, float16 values are 2^-6 apart and bfloat16's 2^-3), and the
#   backward, run in 16 bits on those rounded values, gives the logits gradients off by about two
#   16-bit steps (relative, median), against a sixth of one with `.float()` first: the second cell
#   below measures it over 50,000 tokens. It matters little for this task's 11 to 33 tokens, a lot
#   for a language model's.

# %%
# a linear layer reaches the kernels as addmm (linear's CompositeImplicitAutograd body), or as
# linear itself where the device has its own kernel (MPS: _mps_linear in native_functions.yaml)
linear_op = "linear" if has_device_kernel("aten::linear", info.type) else "addmm"
assert any(t.op == linear_op and t.output == low for t in block_ops), "linear not lowered"
sdpa = [t for t in block_ops if "scaled_dot_product" in t.op]
if fused[f"AMP {low}"]:
    assert sdpa and all(t.output == low for t in sdpa), sdpa
else:  # the math fallback decomposes into casts, bmm and softmax, in float32 (lesson 13)
    assert [t.output for t in block_ops if t.op == "bmm"] == ["fp32", "fp32"], block_ops
assert any(t.op == "_to_copy" and t.inputs == ("fp32",) and t.output == low
           for t in block_ops), "no cast of the weights to the low dtype"
norms = [t for t in block_ops if "layer_norm" in t.op]
assert norms and all(t.output == "fp32" for t in norms), norms
logs = [t for t in loss_ops if "log_softmax" in t.op]
assert logs and all(t.output == "fp32" for t in logs), "cross-entropy did not run in float32"

# %%
# Why `.float()` first, on the CPU's kernels: 8 rows over a 50,000-token vocabulary
generator = torch.Generator().manual_seed(0)
vocab_logits = (2 * torch.randn(8, 50_000, generator=generator)).to(amp_dtype)
answers = torch.randint(50_000, (8,), generator=generator)
exact_log_probs = torch.log_softmax(vocab_logits.double(), -1)
exact_grad = torch.softmax(vocab_logits.double(), -1) - F.one_hot(answers, 50_000)
grad_error = {}
for path in ("16 bits", ".float() first"):
    x = vocab_logits.clone().requires_grad_()
    log_probs = torch.log_softmax(x if path == "16 bits" else x.float(), -1)
    if path == "16 bits":
        output_error = (log_probs.double() - exact_log_probs).abs().max().item()
    (2.0**12 * 8 * F.nll_loss(log_probs.float(), answers)).backward()  # scaled, as GradScaler
    error = (x.grad.double() / 2.0**12 - exact_grad).abs() / exact_grad.abs()
    grad_error[path] = error.median().item()
unit = torch.finfo(amp_dtype).eps  # relative spacing of 16-bit values
spacing = unit * 2 ** exact_log_probs.abs().max().log2().floor().item()  # near the rarest token
print(f"{low} log_softmax: largest error {output_error:.4f}, value spacing there {spacing:.4f}; "
      f"median gradient error {grad_error['16 bits']:.2%} in 16 bits, "
      f"{grad_error['.float() first']:.3%} with .float() first (16-bit eps {unit:.2%})")
assert output_error <= spacing  # exps summed in float32: only the output's rounding is left
assert grad_error["16 bits"] > 1.5 * unit and grad_error[".float() first"] < unit / 4

# %% [markdown]
# Lesson 01's probe separates what autocast decides from what the op does anyway: each op runs
# with autocast off and on, on float32 and low-precision inputs; only what changes counts as
# autocast's rule. (Cross-entropy was read from the trace: on CPU `cross_entropy_loss` is on the
# float32 list; on CUDA `nll_loss` is, and `log_softmax` keeps the dtype it is handed.)

# %%
from amp_tutorial.autocast_policy import FP32, FP32_OUT, NO_RULE, SOURCE_POLICY, autocast_policy

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
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **A low-precision residual stream.** In section 2, put the right-hand side of `x = ...` in
#    parentheses and add `.to(amp_dtype)`. On a CPU the `native_layer_norm` rows now take and give
#    the low dtype (bf16, or fp16 in fp16 mode), so the `norms` assert fails: layer norm is on no
#    CPU autocast list. On CUDA they would still read fp32: there `layer_norm` is on the fp32 list
#    (the probe after the trace).
# 2. **fp16's range, not its precision.** In the last cell, cast `wide` with `.half()` instead of
#    `.bfloat16()`. fp16 has three more significant bits, yet softmax's largest relative error grows
#    about 8x, to about 3e-2 (the message still says bf16), and the assert fails: probabilities
#    below fp16's smallest normal number, 6.1e-5, are subnormal, 6e-8 apart, so one near 1e-6 keeps
#    only a few bits. bf16 has float32's range and keeps its 8 bits there.

# %% [markdown]
# ## What to remember
#
# - Autocast lowers the matmuls (linear, attention); a pre-norm transformer keeps its residual
#   stream, layer norms and loss in float32. On CUDA autocast itself runs layer norm and
#   `nll_loss` in float32, but cross-entropy's log-softmax keeps a 16-bit input's dtype: cast the
#   logits with `.float()` before the loss. On CPU only the loss is on the float32 list.
# - `pdm run bench --model transformer` measures this lesson's fp32-vs-AMP comparison with the
#   same code.
