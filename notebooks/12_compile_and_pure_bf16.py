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
# # 09 · Beyond autocast: torch.compile, pure bf16, FP8, and seeing what ran
#
# Once AMP works, four questions come next, and each gets a measurement here:
#
# 1. Does `torch.compile` add to AMP, and what does it change?
# 2. Why not simply cast the whole model to bf16 (`model.to(torch.bfloat16)`)?
# 3. What is FP8, why does it need a scale, and when does it pay?
# 4. How do I see which ops really ran in low precision?
#
# Both course models take part: the 1x1-conv `ConvModel` of lessons 03-06 and the small
# decoder-only transformer of lesson 08 (sequence reversal). Sizes come from the preset; seeds
# are fixed.

# %%
import importlib.util
import os
import shutil

import pandas as pd
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from amp_tutorial import (
    ConvModel,
    describe_device,
    get_preset,
    make_problem,
    saved_activation_bytes,
    select_device,
    time_steps,
)
from amp_tutorial.device import dtype_name, fp32_baseline, set_strict_fp32
from amp_tutorial.measure import op_dtype_rows, optimizer_step_events
from amp_tutorial.plots import plot_bars, plot_losses, plot_op_times
from amp_tutorial.tasks import ReversalTask, sequence_loss
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig

info = select_device()
preset = get_preset(device_type=info.type)
# this lesson is about bf16; devices without it (old MPS) use their AMP dtype for the comparisons
LOW = torch.bfloat16 if torch.bfloat16 in info.amp_dtypes else info.amp_dtype
assert LOW is not None, "this device/torch has no usable autocast dtype"
print(describe_device(info))
print(f"preset {preset.name!r}; low-precision dtype for this lesson: {dtype_name(LOW)}")

# %% [markdown]
# The two models and their data. The transformer's sizes follow the preset: at `cpu` it is the
# 4-layer, 256-wide model on 16 sequences of 256 tokens.

# %%
MEMORY_FORMAT = torch.channels_last
image_in, image_target = make_problem(preset.grid, info.device, MEMORY_FORMAT)
TRANSFORMER_SIZES = {  # (d_model, n_layers, n_heads, seq_len, batch)
    "smoke": (32, 1, 2, 16, 4), "cpu": (256, 4, 4, 256, 16), "paper": (512, 6, 8, 512, 32)}
d_model, n_layers, n_heads, seq_len, batch_size = TRANSFORMER_SIZES[preset.name]
task = ReversalTask(n_symbols=16, seq_len=seq_len)
(tokens, token_targets), = task.batches(1, batch_size, seed=0, device=info.device)


def make_conv():
    torch.manual_seed(0)
    return ConvModel(preset.hidden, preset.n_hidden_layers).to(info.device,
                                                             memory_format=MEMORY_FORMAT)


def make_transformer():
    torch.manual_seed(0)
    config = TransformerConfig(task.vocab_size, seq_len, d_model, n_layers, n_heads)
    return DecoderTransformer(config).to(info.device)


MODELS = {  # name -> (constructor, inputs, targets, loss function)
    "ConvModel": (make_conv, image_in, image_target, F.mse_loss),
    "transformer": (make_transformer, tokens, token_targets, sequence_loss),
}
print(f"ConvModel: {preset.grid}x{preset.grid} image, hidden {preset.hidden}; transformer: "
      f"d_model {d_model}, {n_layers} layers, batch {batch_size} x {seq_len} tokens")

# %% [markdown]
# ## 1. torch.compile with AMP
#
# ### What compile sees
#
# `torch.compile` captures the Python code as a graph (TorchDynamo), turns the forward and the
# backward into graphs of ATen ops (AOTAutograd), and hands them to a code generator (Inductor,
# the default backend). Autocast is traced too: its casts become ordinary nodes in the graph.
# `make_fx` produces the same kind of ATen graph without compiling anything, so we can look at
# it: one forward + loss of the ConvModel, traced with autocast off and on.

# %%
def aten_graph(autocast_on):
    model = make_conv()

    def forward_and_loss(x, y):
        with torch.autocast(info.type, dtype=LOW, enabled=autocast_on):
            return F.mse_loss(model(x), y)

    return make_fx(forward_and_loss)(image_in, image_target)


def graph_ops(graph_module):
    """ATen op name -> how many times it appears in the traced graph."""
    ops = [str(n.target).split(".")[1] for n in graph_module.graph.nodes
           if n.op == "call_function" and str(n.target).startswith("aten.")]
    return pd.Series(ops).value_counts()


traced = pd.DataFrame({"autocast off": graph_ops(aten_graph(False)),
                       "autocast on": graph_ops(aten_graph(True))}).fillna(0).astype(int)
traced

# %% [markdown]
# With autocast on, the graph gains `_to_copy` nodes: the casts of the input, the weights and the
# biases down to low precision before each convolution (and back for the loss). Eagerly each cast
# is its own pass over memory; Inductor can fold a cast into the elementwise kernel next to it
# (a cast, BatchNorm's scale and shift and the ReLU become one loop), while the convolutions and
# matmuls themselves still go to the vendor libraries (oneDNN on CPUs, cuBLAS/cuDNN or
# hipBLASLt/MIOpen on GPUs) in low precision.

# %%
assert traced.loc["_to_copy", "autocast on"] > traced.loc["_to_copy", "autocast off"]
assert traced.loc["convolution", "autocast on"] == traced.loc["convolution", "autocast off"]

# %% [markdown]
# ### Eager and compiled, fp32 and AMP, side by side
#
# Compiling happens on the first call, so that call is timed on its own and reported as the
# compile time (first call minus a median step); the step times come from the calls after it.
# Inductor needs a C++ compiler on CPUs (and Triton on GPUs). At the `smoke` preset the lesson
# uses the `aot_eager` backend instead: it captures the same graphs but generates no code, which
# keeps the test suite fast and says nothing about speed, and it compiles only the AMP runs. The
# optimizer step stays eager here.

# %%
def choose_backend():
    if preset.name == "smoke":
        return "aot_eager", "smoke preset: graph capture only, no code generation"
    if info.type == "cpu" and not any(shutil.which(c) for c in
                                      (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")):
        return None, "no C++ compiler found (Inductor needs one on CPUs)"
    return "inductor", "Inductor, the default backend"


BACKEND, backend_reason = choose_backend()
print(f"compile backend: {BACKEND} ({backend_reason})")


def train(model_name, amp_dtype, compiled, steps):
    make_model, inputs, targets, loss_fn = MODELS[model_name]
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(
        info.type, enabled=amp_dtype is not None and info.needs_grad_scaler(amp_dtype))
    net = torch.compile(model, backend=BACKEND) if compiled else model

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            loss = loss_fn(net(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    first, _ = time_steps(step, 1, info.device, progress=False)  # compiles when compiled
    label = f"{'compiled' if compiled else 'eager'} {dtype_name(amp_dtype)}"
    timing, losses = time_steps(step, steps, info.device, max(preset.warmup - 1, 0),
                                desc=f"{model_name} {label}")
    return {"model": model_name, "run": label, "timing": timing, "losses": losses,
            "compile_s": first.median - timing.median if compiled else float("nan")}


compile_runs = []
for model_name in MODELS:
    steps = preset.steps if model_name == "ConvModel" else min(preset.steps, 32)
    for compiled in (False, True):
        if compiled and BACKEND is None:
            print(f"{model_name}: compiled runs skipped: {backend_reason}")
            continue
        for amp_dtype in (None, LOW):
            if compiled and amp_dtype is None and preset.name == "smoke":
                continue  # smoke: compile only the AMP run, to keep CI short
            try:
                compile_runs.append(train(model_name, amp_dtype, compiled, steps))
            except Exception as err:  # a broken toolchain must not end the lesson
                print(f"{model_name} compiled {dtype_name(amp_dtype)} failed: "
                      f"{type(err).__name__}: {str(err)[:300]}")

# %%
table = pd.DataFrame([{
    "model": r["model"], "run": r["run"], "ms/step (median)": r["timing"].median * 1e3,
    "IQR (ms)": r["timing"].iqr * 1e3, "compile (s)": r["compile_s"],
    "final loss": r["losses"][-1]} for r in compile_runs]).set_index(["model", "run"])
for model_name in MODELS:
    eager32 = table.loc[(model_name, "eager fp32"), "ms/step (median)"]
    table.loc[model_name, "speedup vs eager fp32"] = (
        eager32 / table.loc[model_name, "ms/step (median)"]).to_numpy()
table.round(3)

# %% [markdown]
# Compiling changes how each step is computed, not what it computes: the compiled losses follow
# the eager ones (same seed, same data), and the first call costs seconds, not milliseconds. How
# much faster a step gets is a measurement on your device, printed below, not a promise: compile
# helps where elementwise work and Python overhead around the big ops are a large share of the
# step (the ConvModel's BatchNorm + ReLU on every pixel), and little where the matmuls already
# dominate (a transformer on a CPU, measured at about the same speed in the course's notes).

# %%
for r in compile_runs:
    assert all(torch.isfinite(torch.tensor(r["losses"]))), f"{r['model']} {r['run']}: non-finite"
    if r["run"].startswith("compiled"):
        eager = next(e for e in compile_runs
                     if e["model"] == r["model"] and e["run"] == r["run"].replace("compiled",
                                                                                  "eager"))
        assert abs(r["losses"][0] - eager["losses"][0]) < 0.05 * eager["losses"][0] + 1e-3
        assert r["compile_s"] > r["timing"].median, "the first call should include compiling"
for model_name in MODELS:
    rows = table.loc[model_name]
    for dtype in ("fp32", dtype_name(LOW)):
        if f"compiled {dtype}" not in rows.index:
            continue
        gain = rows.loc[f"eager {dtype}", "ms/step (median)"] / rows.loc[f"compiled {dtype}",
                                                                          "ms/step (median)"]
        verdict = "faster" if gain > 1.05 else "no faster (within 5%)" if gain > 0.95 else "slower"
        print(f"{model_name} {dtype}: compiled is {gain:.2f}x eager ({verdict}); compile took "
              f"{rows.loc[f'compiled {dtype}', 'compile (s)']:.1f} s")
    best = rows["speedup vs eager fp32"].idxmax()
    print(f"  {model_name}: fastest is {best}, {rows.loc[best, 'speedup vs eager fp32']:.2f}x "
          f"eager fp32 ({BACKEND or 'no compile'}, {preset.name} preset)")

# %%
fig = plot_bars({f"{m} (ms/step)": table.loc[m, "ms/step (median)"].to_dict() for m in MODELS},
                f"Eager vs torch.compile, fp32 vs AMP {dtype_name(LOW)} ({preset.name}, "
                f"{info.type}, backend {BACKEND})")

# %% [markdown]
# The benchmark does the same for the ConvModel: `pdm run bench --compile` adds a compiled row
# per precision, with the compile time in its own column.
#
# ## 2. Pure bf16 is not AMP
#
# `model.to(torch.bfloat16)` with an ordinary optimizer runs every matmul in bf16, like AMP, but
# it also stores the **weights** in bf16. bf16 keeps 8 significant bits: between 1 and 2 its
# numbers are 2^-7 = 0.0078 apart (2^-8 just below 1), so adding anything smaller than half that
# gap to a weight near 1.0 rounds back to the same weight. The update is **lost**.

# %%
one = torch.tensor(1.0)
for update in (1e-2, 1e-3, 1e-4):
    print(f"1.0 - {update:g}: fp32 -> {(one - update).item():.6f}, "
          f"bf16 -> {(one.bfloat16() - update).item():.6f}")
assert (one.bfloat16() - 1e-3) == 1.0 and (one - 1e-3) != 1.0
assert torch.finfo(torch.bfloat16).eps == 2**-7

# %% [markdown]
# Adam's first step moves every weight by about the learning rate (1e-3 here) against its
# gradient. In a pure-bf16 ConvModel, how many of those updates survive? BatchNorm's weights
# start at exactly 1.0, so we expect all of theirs to vanish; the rest depends on each weight's
# size.

# %%
def pure_bf16_model():
    return make_conv().to(torch.bfloat16)


def lost_update_share(model, optimizer, x, y):
    """One plain training step; returns the share of weights with a gradient that did not move."""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad(set_to_none=True)
    F.mse_loss(model(x), y).backward()
    had_grad = [p.grad != 0 for p in model.parameters()]
    optimizer.step()
    lost = sum(((p == b) & g).sum().item()
               for p, b, g in zip(model.parameters(), before, had_grad, strict=True))
    return lost / sum(g.sum().item() for g in had_grad)


bf16_in, bf16_target = image_in.bfloat16(), image_target.bfloat16()
model = pure_bf16_model()
bn_weight_before = model.layers[1].weight.detach().clone()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
share = lost_update_share(model, optimizer, bf16_in, bf16_target)
print(f"pure bf16, Adam lr 1e-3: {share:.1%} of the weight updates in the first step were lost")
print(f"BatchNorm weights unchanged: {torch.equal(model.layers[1].weight, bn_weight_before)}")
assert torch.equal(model.layers[1].weight, bn_weight_before)  # 1.0 - 1e-3 rounds to 1.0
assert share > 0.01

# %% [markdown]
# **Optimizer state** is created like the parameters, so Adam's two moving averages are bf16 too:
# half the bytes of AMP's fp32 state, and the same rounding applies to every update of them.

# %%
state = optimizer.state[model.layers[0].weight]
print({k: v.dtype for k, v in state.items() if torch.is_tensor(v)})
assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16

# %% [markdown]
# Now train both ways for the preset's number of steps, counting the lost updates at every step
# of the pure-bf16 run: AMP (fp32 weights, bf16 matmuls under autocast) against pure bf16.

# %%
def train_amp_bf16():
    model = make_conv()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(preset.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(image_in), image_target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, optimizer, losses


def train_pure_bf16():
    model = pure_bf16_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, lost = [], []
    for _ in range(preset.steps):
        with torch.no_grad():
            losses.append(F.mse_loss(model(bf16_in), bf16_target).float().item())
        lost.append(lost_update_share(model, optimizer, bf16_in, bf16_target))
    return model, optimizer, losses, lost


def training_bytes_per_weight(model, optimizer):
    """Bytes held per weight after a step: the weight, its gradient and Adam's two averages."""
    held = 0
    for p in model.parameters():
        state = [v for v in optimizer.state[p].values()
                 if torch.is_tensor(v) and v.shape == p.shape]
        held += sum(t.numel() * t.element_size() for t in (p, p.grad, *state))
    return held / sum(p.numel() for p in model.parameters())


amp_model, amp_optimizer, amp_losses = train_amp_bf16()
pure_model, pure_optimizer, pure_losses, lost_shares = train_pure_bf16()
print(f"final loss: AMP bf16 {amp_losses[-1]:.4f}, pure bf16 {pure_losses[-1]:.4f}; "
      f"lost updates per step in pure bf16: {min(lost_shares):.1%} to {max(lost_shares):.1%} "
      f"(mean {sum(lost_shares) / len(lost_shares):.1%})")
assert amp_model.layers[0].weight.dtype == torch.float32  # AMP never touched the stored weights
assert min(lost_shares) > 0
per_weight = {"AMP bf16": training_bytes_per_weight(amp_model, amp_optimizer),
              "pure bf16": training_bytes_per_weight(pure_model, pure_optimizer)}
print(f"bytes per weight (weight + gradient + Adam's exp_avg, exp_avg_sq): {per_weight}")
assert per_weight == {"AMP bf16": 16, "pure bf16": 8}
fig = plot_losses({"AMP bf16 (fp32 weights)": amp_losses, "pure bf16 (bf16 weights)": pure_losses},
                  "Training loss: AMP against model.to(bfloat16)")

# %% [markdown]
# This is why AMP keeps **fp32 master weights**: autocast casts a weight to bf16 only as the input
# of one matmul, while the stored weight, its gradient and the optimizer state stay fp32, so
# thousands of small updates add up instead of rounding away. The price is memory: with Adam,
# 16 bytes per weight (fp32 weight, fp32 gradient and two fp32 moving averages) against 8 in
# pure bf16, as measured above. Pure bf16 training can work with care
# (larger learning rates, or optimizers that compensate the rounding), but it is not a switch.
#
# ### When pure bf16 is right: inference
#
# A trained model never updates its weights again, so nothing can be lost. Cast it **once**: the
# weights take half the memory, and no per-call casts are left (autocast casts the fp32 weights
# again on every forward).

# %%
def inference_timing(model, x, amp_dtype):
    model.eval()

    def step(i):
        with torch.inference_mode(), torch.autocast(info.type, dtype=amp_dtype or torch.float32,
                                                     enabled=amp_dtype is not None):
            return model(x)

    return time_steps(step, preset.inference_steps, info.device, preset.warmup,
                      desc="inference", progress=False)[0]


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


fp32_bytes = weight_bytes(amp_model)
with torch.inference_mode():
    reference = amp_model.eval()(image_in).float()
t_fp32 = inference_timing(amp_model, image_in, None)
t_autocast = inference_timing(amp_model, image_in, torch.bfloat16)
cast_once = amp_model.to(torch.bfloat16)  # in place: the fp32 copy is gone
t_cast = inference_timing(cast_once, bf16_in, None)
with torch.inference_mode():
    max_diff = (cast_once(bf16_in).float() - reference).abs().max().item()
inference = pd.DataFrame({
    "ms/forward": {"fp32": t_fp32.median * 1e3, "autocast bf16": t_autocast.median * 1e3,
                   "cast once to bf16": t_cast.median * 1e3},
    "weights (KB)": {"fp32": fp32_bytes / 1024, "autocast bf16": fp32_bytes / 1024,
                     "cast once to bf16": weight_bytes(cast_once) / 1024}})
print(f"largest difference from the fp32 prediction: {max_diff:.4f} (targets lie in [0, 1])")
assert weight_bytes(cast_once) * 2 == fp32_bytes
assert max_diff < 0.1
inference.round(3)

# %% [markdown]
# ## 3. FP8
#
# Two 8-bit float formats are in use: **e4m3** (4 exponent bits, 3 mantissa bits: more
# precision, for weights and activations) and **e5m2** (5 and 2: more range, for gradients).
# `torch.finfo` gives their limits next to fp16 and bf16. (`e4m3fn` is the variant without
# infinities, so its largest value is 448; the `fnuz` variants used by AMD's MI300 differ
# slightly.)

# %%
FORMATS = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
formats = pd.DataFrame({dtype_name(d): {
    "bits": torch.finfo(d).bits, "largest": torch.finfo(d).max,
    "smallest normal": torch.finfo(d).smallest_normal, "eps (precision)": torch.finfo(d).eps}
    for d in FORMATS}).T
assert torch.finfo(torch.float8_e4m3fn).max == 448 and torch.finfo(torch.float8_e5m2).max == 57344
assert torch.finfo(torch.float8_e4m3fn).eps == 2**-3 and torch.finfo(torch.float8_e5m2).eps == 2**-2
formats

# %% [markdown]
# With three mantissa bits and a range of 2^-6 to 448 (normal numbers), e4m3 cannot hold a
# tensor's values as they are: small activations or gradients fall below its normal range and
# lose their bits or become zero, large ones saturate. So every FP8 recipe stores a **scale per
# tensor** (or per row, or per block): multiply so the tensor's largest magnitude lands at the
# format's largest value, cast, and divide the result by the same scale afterwards. Measured with
# torch's float8 dtypes on the CPU, on gradient-sized values (standard deviation 1e-3):

# %%
def fp8_roundtrip(x, dtype, scale=1.0):
    """Cast to FP8 and back, with a per-tensor scale applied before the cast."""
    return (x * scale).to(dtype).float() / scale


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


torch.manual_seed(0)
grads = torch.randn(4096) * 1e-3
rows = {}
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
    scale = torch.finfo(dtype).max / grads.abs().max()
    rows[dtype_name(dtype)] = {
        "error, no scale": relative_error(fp8_roundtrip(grads, dtype), grads),
        "zeros, no scale": (fp8_roundtrip(grads, dtype) == 0).float().mean().item(),
        "per-tensor scale": scale.item(),
        "error, scaled": relative_error(fp8_roundtrip(grads, dtype, scale), grads),
        "zeros, scaled": (fp8_roundtrip(grads, dtype, scale) == 0).float().mean().item()}
    assert rows[dtype_name(dtype)]["error, scaled"] < rows[dtype_name(dtype)]["error, no scale"]
quantization = pd.DataFrame(rows).T
assert quantization.loc["float8_e4m3fn", "error, scaled"] < 0.1
assert quantization.loc["float8_e4m3fn", "zeros, no scale"] > 0.5  # most of the tensor vanished
quantization

# %% [markdown]
# ### FP8 training, where the hardware has it
#
# FP8 matmuls run on NVIDIA GPUs of compute capability 8.9 and newer (Ada, Hopper, Blackwell) and
# on AMD Instinct MI300 and newer. The course uses **torchao**'s float8 training
# (`torchao.float8.convert_to_float8_training`): it is PyTorch's own library, swaps each
# `nn.Linear` for a `Float8Linear` (dynamic per-tensor scales, e4m3 forward, e5m2 for gradients),
# works with `torch.compile` (which fuses the scaling and casting, and is needed for a speedup),
# and its wheel installs from PyPI even on a CPU-only machine (checked with torchao 0.18.0).
# NVIDIA's Transformer Engine does the same through its own layers (`te.Linear` inside
# `fp8_autocast`) and is the choice inside NVIDIA's model stacks, but it is tied to NVIDIA's CUDA
# stack (AMD keeps a separate ROCm port). torchao is not in the course's default environment:
# `pdm install -G fp8` adds it.
#
# Only linear layers are converted, so the transformer is the model for this; the ConvModel's
# 1x1 convolutions stay as they are. The cell compares bf16 AMP with FP8 + bf16 AMP, both compiled;
# everywhere else it says what it would run and why it cannot.

# %%
def fp8_capable():
    if info.type != "cuda":
        return False, f"FP8 matmuls need an NVIDIA (cc >= 8.9) or AMD MI300+ GPU, not {info.type}"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(info.device).gcnArchName
        ok = arch.startswith(("gfx94", "gfx95"))
        return ok, f"AMD {arch}: {'has' if ok else 'has no'} FP8 matrix cores (MI300 is gfx942)"
    cc = torch.cuda.get_device_capability(info.device)
    return cc >= (8, 9), f"NVIDIA compute capability {cc[0]}.{cc[1]} (FP8 needs 8.9 or newer)"


fp8_ok, fp8_reason = fp8_capable()
has_torchao = importlib.util.find_spec("torchao") is not None
print(f"FP8 hardware: {fp8_ok} ({fp8_reason}); torchao installed: {has_torchao}")
fp8_runs = {}
if fp8_ok and has_torchao and BACKEND == "inductor":
    from torchao.float8 import convert_to_float8_training

    def train_transformer(use_fp8):
        model = make_transformer()
        if use_fp8:  # every linear whose sizes are multiples of 16, except the vocabulary head
            convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "head" and (
                m.in_features % 16 == 0 and m.out_features % 16 == 0))
        net = torch.compile(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(info.type, dtype=torch.bfloat16):
                loss = sequence_loss(net(tokens), token_targets)
            loss.backward()
            optimizer.step()
            return loss.item()

        timing, losses = time_steps(step, min(preset.steps, 64), info.device, preset.warmup + 1,
                                    desc="FP8" if use_fp8 else "bf16")
        return {"ms/step": timing.median * 1e3, "IQR (ms)": timing.iqr * 1e3,
                "final loss": losses[-1]}

    fp8_runs = {"bf16 AMP": train_transformer(False), "FP8 + bf16 AMP": train_transformer(True)}
    print(pd.DataFrame(fp8_runs).T.round(3))
    assert all(r["final loss"] < 10 for r in fp8_runs.values())
else:
    print("Would run: the transformer with torchao.float8.convert_to_float8_training (e4m3 "
          "weights and activations, e5m2 gradients, per-tensor dynamic scales), compiled, under "
          "bf16 autocast, against the same model in bf16 AMP.\nNot run here because: "
          + "; ".join(r for ok, r in ((fp8_ok, fp8_reason),
                                      (has_torchao, "torchao is not installed: pdm install -G fp8"),
                                      (BACKEND == "inductor", f"compile backend is {BACKEND}"))
                      if not ok))

# %% [markdown]
# FP8 pays when the matmuls are large enough that the faster FP8 tensor cores win back the time
# spent finding scales and casting; small layers get slower. It also needs the same care as fp16
# had before bf16: a scale per tensor, and e5m2's range for gradients.
#
# ## 4. Seeing what ran
#
# ### The profiler, with input dtypes
#
# `torch.profiler` with `record_shapes=True` records, for every op, the shapes **and the dtypes**
# of its inputs (`event.input_dtypes`). One AMP training step of each model, grouped by op and
# input dtypes (the course's `op_dtype_rows`), shows what autocast did. Autocast steps in where
# your code calls `conv2d` or `linear`: the profiler records that call with the fp32 weights you
# passed, then the casts (`_to_copy`, reading fp32), then the same op again with low-precision
# inputs, and under it the op that computes (`convolution`, `addmm`, `mm`, the attention kernel),
# all in low precision. The optimizer's ops, found under the profiler's `Optimizer.step#Adam.step`
# range, work on the fp32 weights, gradients and moving averages: on the CPU Adam's default
# single-tensor path calls `lerp_`, `addcmul_` and `addcdiv_` per weight, with fp32 inputs. On
# CUDA its default `foreach` path calls `_foreach_lerp_` and friends on whole tensor lists, which
# the profiler records without dtypes, so there the cell reads the state's dtype instead. On GPUs
# the profiler also records the kernels, which the second table lists.

# %%
activities = [torch.profiler.ProfilerActivity.CPU]
if info.type == "cuda":
    activities.append(torch.profiler.ProfilerActivity.CUDA)


def profile_step(model_name):
    make_model, inputs, targets, loss_fn = MODELS[model_name]
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):  # warm up first: kernel selection and allocation are not the step
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=LOW):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=LOW):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return prof, optimizer


profiles, optimizers = {}, {}
for name in MODELS:
    profiles[name], optimizers[name] = profile_step(name)
op_tables = {name: pd.DataFrame(op_dtype_rows(p.events())) for name, p in profiles.items()}
low = dtype_name(LOW)
COMPUTE = ("aten::convolution", "aten::addmm", "aten::mm", "aten::bmm",
           "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_efficient_attention",
           "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention")
ENTRY = ("aten::conv2d", "aten::linear")  # where autocast steps in
for name, ops in op_tables.items():
    compute = ops[ops["op"].isin(COMPUTE)]
    print(f"{name}: the forward's matmul-type ops, as called and as computed:")
    print(ops[ops["op"].isin(COMPUTE + ENTRY)].to_string(index=False))
    assert len(compute) and all(low in d for d in compute["input dtypes"]), compute
    entry = ops[ops["op"].isin(ENTRY)]
    assert entry["input dtypes"].str.contains("fp32").any()  # as called: fp32 weights
    assert entry["input dtypes"].str.fullmatch(rf"{low}(, {low})*").any()  # after the cast
    adam = pd.DataFrame(op_dtype_rows(optimizer_step_events(profiles[name].events()), 0))
    update = adam[adam["op"].str.fullmatch(r"aten::(_foreach_)?(lerp|addcmul|addcdiv)_")]
    print(f"{name}: Adam's update ops\n{update.to_string(index=False)}")
    assert len(update) and not adam["input dtypes"].str.contains(low).any(), adam
    with_dtypes = update[update["input dtypes"] != ""]  # tensor lists are recorded without
    assert with_dtypes["input dtypes"].str.fullmatch(r"fp32(, fp32)*").all(), with_dtypes
    if info.type == "cpu":  # single-tensor path: one call per weight, dtypes recorded
        assert set(with_dtypes["op"]) == {"aten::lerp_", "aten::addcmul_", "aten::addcdiv_"}
    assert all(v.dtype == torch.float32 for st in optimizers[name].state.values()
               for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
op_tables["transformer"].head(20).round(1)

# %%
if info.type == "cuda":
    for name, prof in profiles.items():
        print(f"{name}: GPU kernels of one AMP step")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=15))
else:
    print("No GPU: the profiler recorded CPU ops only (kernels are a GPU notion).")

# %%
fig = plot_op_times(op_dtype_rows(profiles["transformer"].events()),
                    f"Transformer, one AMP {low} step on {info.type}: the ops that took longest")

# %% [markdown]
# ### Where the memory goes
#
# On CUDA and ROCm GPUs, the caching allocator can record every allocation with its Python stack
# (`torch.cuda.memory._record_memory_history`); `torch.cuda.memory._snapshot()` returns the
# record, and `_dump_snapshot` writes a file that https://pytorch.org/memory_viz draws. These are
# underscore APIs: documented on PyTorch's "Understanding CUDA Memory Usage" page, but they may
# change. On every device, including the CPU, the course counts the bytes autograd saves for
# backward (`saved_activation_bytes`), which is the memory autocast halves.

# %%
if info.type == "cuda":
    model = make_transformer()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    with torch.autocast(info.type, dtype=LOW):
        sequence_loss(model(tokens), token_targets).backward()
    snapshot = torch.cuda.memory._snapshot()
    os.makedirs("runs", exist_ok=True)
    # dump while recording is on: disabling it (enabled=None) clears the recorded history
    torch.cuda.memory._dump_snapshot("runs/09_transformer_step.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)
    allocated = sum(b["size"] for s in snapshot["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    print(f"after one AMP step: {allocated / 2**20:.1f} MB allocated; open "
          "runs/09_transformer_step.pickle in https://pytorch.org/memory_viz")
    assert allocated > 0
else:
    print(f"No CUDA allocator on {info.type}: the memory snapshot needs a CUDA or ROCm GPU.")

def saved_mb(model_name, autocast_on):
    make_model, inputs, targets, loss_fn = MODELS[model_name]
    model = make_model()

    def forward_and_loss():
        with torch.autocast(info.type, dtype=LOW, enabled=autocast_on):
            loss_fn(model(inputs), targets)

    return saved_activation_bytes(forward_and_loss) / 2**20


saved = {name: {"fp32": saved_mb(name, False), f"AMP {low}": saved_mb(name, True)}
         for name in MODELS}
saved = pd.DataFrame(saved).T
saved["ratio"] = saved[f"AMP {low}"] / saved["fp32"]
assert saved.loc["ConvModel", "ratio"] <= 0.55
assert saved.loc["transformer", "ratio"] < 1
print("tensors saved for backward (MB) in one forward + loss:")
saved.round(3)

# %% [markdown]
# The transformer's ratio is further from one half than the ConvModel's: its residual stream
# stays fp32 (the embeddings are not autocast, and fp32 + bf16 is fp32 by type promotion), so its
# LayerNorms and the residual additions keep fp32 tensors; what shrinks are the inputs of the
# matmuls and of attention.
#
# ### The fp32 baseline on NVIDIA Ampere and newer
#
# "fp32" on an Ampere or newer NVIDIA GPU may really be **TF32** (10 mantissa bits) for
# convolutions, and for matmuls if you allow it. Every comparison with AMP should name its
# baseline; the course's `fp32_baseline` reads the installed torch's settings and
# `set_strict_fp32` switches TF32 off. CUDA TF32 needs an Ampere or newer GPU. CPUs have a
# similar switch: oneDNN's `torch.backends.mkldnn.matmul.fp32_precision` (and `.conv`) accept
# `"tf32"` or `"bf16"` (PyTorch >= 2.9, "MKLDNN backend" notes), but stay IEEE fp32 unless set.

# %%
print(f"baseline measured above: {fp32_baseline(info)}")
if info.type == "cuda" and not torch.version.hip and torch.cuda.get_device_capability()[0] >= 8:
    set_strict_fp32(True)
    print(f"with set_strict_fp32(True): {fp32_baseline(info)}")
    assert "strict" in fp32_baseline(info)
    set_strict_fp32(False)
else:
    # CUDA TF32 needs an Ampere or newer NVIDIA GPU: older ones report "fp32 (strict, TF32 off)"
    cuda_pre_ampere = info.type == "cuda" and not torch.version.hip
    assert fp32_baseline(info) == ("fp32 (strict, TF32 off)" if cuda_pre_ampere else "fp32")
    print("CUDA TF32 does not apply on this device: the baseline is the one printed above.")
# oneDNN lowers fp32 on CPUs only when asked to ("none" = the default, IEEE fp32)
if info.type == "cpu" and hasattr(torch.backends.mkldnn, "matmul"):
    onednn = {"matmul": torch.backends.mkldnn.matmul.fp32_precision,
              "conv": torch.backends.mkldnn.conv.fp32_precision}
    print(f"oneDNN fp32_precision on this CPU: {onednn}")
    assert set(onednn.values()) <= {"none", "ieee"}

# %% [markdown]
# ## What to remember
#
# - `torch.compile` and AMP combine: autocast's casts become graph nodes that Inductor fuses into
#   the neighbouring elementwise kernels. Report the compile time apart from the step time, and
#   measure: it helps the elementwise-heavy ConvModel more than a matmul-bound transformer.
# - `model.to(torch.bfloat16)` is not AMP: updates smaller than half a bf16 step vanish, and the
#   optimizer state is bf16 too. AMP keeps fp32 master weights. For inference, cast once.
# - FP8 needs a scale per tensor, hardware with FP8 matmuls (NVIDIA cc >= 8.9, AMD MI300+) and a
#   library (torchao float8 here) plus `torch.compile`; it pays for large matmuls.
# - `torch.profiler(record_shapes=True)` shows each op's input dtypes: check that the matmuls ran
#   in low precision instead of assuming it.
