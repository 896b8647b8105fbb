# ---
# jupyter:
#   amp_tutorial:
#     minutes:
#       cpu: 3.9
#       smoke: 0.4
#     needs: 'any device, CPU included; FP8 training: NVIDIA compute capability 8.9+
#       or AMD MI300+, with torchao (`pdm install -G fp8`)'
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
# # 13 · FP8, and seeing what ran: the profiler, memory, the fp32 baseline
#
# Lesson 12 combined AMP with `torch.compile` and compared it with pure bf16. Two questions are
# left, and each gets a measurement here:
#
# 1. What is FP8, why does it need a scale, and when does it pay?
# 2. How do I see which ops really ran in low precision, where the memory goes, and what my
#    "fp32" baseline really was?
#
# Both course models take part: the 1x1-conv `ConvModel` of lessons 03-06 and the decoder-only
# transformer of lesson 11 at the preset's sizes. Seeds are fixed.

# %%
import importlib.util
import math
import os

import pandas as pd
import torch
from tqdm.auto import tqdm

from amp_tutorial.bench import course_models
from amp_tutorial.device import (
    describe_device,
    dtype_name,
    fp32_baseline,
    select_device,
    set_strict_fp32,
)
from amp_tutorial.measure import (
    StepTimer,
    op_dtype_rows,
    optimizer_step_events,
    saved_activation_bytes,
)
from amp_tutorial.plots import plot_op_times
from amp_tutorial.presets import get_preset
from amp_tutorial.tasks import sequence_loss

info = select_device()
preset = get_preset(device_type=info.type)
# bf16 where the device has it (old MPS has only fp16)
LOW = torch.bfloat16 if torch.bfloat16 in info.amp_dtypes else info.amp_dtype
assert LOW is not None, "this device/torch has no usable autocast dtype"
print(describe_device(info))
print(f"preset {preset.name!r}; low-precision dtype for this lesson: {dtype_name(LOW)}")

# %% [markdown]
# The two models and one batch of data for each: lesson 03's image problem (channels-last, as in
# the benchmark) and the first training batch of lesson 11's reversal task.

# %%
MODELS = course_models(preset, info.device)  # name -> (make, inputs, targets, loss_fn)
make_conv, image_in, image_target, _ = MODELS["ConvModel"]
make_transformer, tokens, token_targets, _ = MODELS["transformer"]

# %% [markdown]
# ## 1. FP8
#
# Two 8-bit float formats are in use: **e4m3** (4 exponent bits, 3 mantissa bits: more
# precision, for weights and activations) and **e5m2** (5 and 2: more range, for gradients).
# `torch.finfo` gives their limits next to fp16 and bf16. (`e4m3fn` is the variant without
# infinities, so its largest value is 448. AMD's MI300 (gfx942) computes only in the `fnuz`
# variants, with no infinities and no negative zero, and a different range: e4m3fnuz stops at
# 240. torchao's float8 training switches to them by itself on gfx940-942
# (`Float8TypeConfig` in `torchao/float8/config.py`); MI350 and NVIDIA use e4m3fn and e5m2.)

# %%
FORMATS = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
           torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
formats = pd.DataFrame({dtype_name(d): {
    "bits": torch.finfo(d).bits, "largest": torch.finfo(d).max,
    "smallest normal": torch.finfo(d).smallest_normal, "eps (precision)": torch.finfo(d).eps}
    for d in FORMATS}).T
assert torch.finfo(torch.float8_e4m3fn).max == 448 and torch.finfo(torch.float8_e5m2).max == 57344
assert torch.finfo(torch.float8_e4m3fn).eps == 2**-3 and torch.finfo(torch.float8_e5m2).eps == 2**-2
assert torch.finfo(torch.float8_e4m3fnuz).max == 240  # a scale computed for e4m3fn saturates
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
# 1x1 convolutions stay as they are. The cells compare bf16 AMP with FP8 + bf16 AMP, both compiled;
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


# %%
def train_transformer(use_fp8):
    """The transformer compiled, under bf16 autocast; with use_fp8, torchao's float8 linears."""
    model = make_transformer()
    if use_fp8:  # every linear whose sizes are multiples of 16, except the vocabulary head
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "head" and (
            m.in_features % 16 == 0 and m.out_features % 16 == 0))
    fp8_layers = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    net = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = StepTimer(info.device, warmup=preset.warmup + 1)  # the first step compiles
    losses = []

    for _ in tqdm(range(timer.warmup + min(preset.steps, 64)), desc="FP8" if use_fp8 else "bf16"):
        with timer.step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(info.type, dtype=torch.bfloat16):
                loss = sequence_loss(net(tokens), token_targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())

    timing = timer.timing
    return {"ms/step": timing.median * 1e3, "IQR (ms)": timing.iqr * 1e3,
            "first loss": losses[0], "final loss": losses[-1], "float8 layers": fp8_layers}


# %%
FP8_COMPILE = preset.name != "smoke"  # the test suite's preset skips the compiled runs
fp8_ok, fp8_reason = fp8_capable()
has_torchao = importlib.util.find_spec("torchao") is not None
print(f"FP8 hardware: {fp8_ok} ({fp8_reason}); torchao installed: {has_torchao}")
fp8_runs = {}
if fp8_ok and has_torchao and FP8_COMPILE:
    fp8_runs = {"bf16 AMP": train_transformer(False), "FP8 + bf16 AMP": train_transformer(True)}
    print(pd.DataFrame(fp8_runs).T.round(3))
    bf16_run, fp8_run = fp8_runs.values()
    assert fp8_run["float8 layers"] > 0 == bf16_run["float8 layers"]  # the conversion happened
    for r in fp8_runs.values():  # both learn: one fixed batch, so the loss must fall a lot
        assert math.isfinite(r["final loss"]) and r["final loss"] < 0.5 * r["first loss"], r
    assert abs(fp8_run["final loss"] - bf16_run["final loss"]) <= 0.1 * bf16_run["first loss"]
else:
    print("Would run: the transformer with torchao.float8.convert_to_float8_training (e4m3 "
          "weights and activations, e5m2 gradients, per-tensor dynamic scales), compiled, under "
          "bf16 autocast, against the same model in bf16 AMP.\nNot run here because: "
          + "; ".join(r for ok, r in ((fp8_ok, fp8_reason),
                                      (has_torchao, "torchao is not installed: pdm install -G fp8"),
                                      (FP8_COMPILE, "the smoke preset skips compiling"))
                      if not ok))

# %% [markdown]
# FP8 pays when the matmuls are large enough that the faster FP8 tensor cores win back the time
# spent finding scales and casting; small layers get slower. It also needs the same care as fp16
# had before bf16: a scale per tensor, and e5m2's range for gradients.
#
# ## 2. Seeing what ran
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
# single-tensor path calls `lerp_`, `addcmul_` and `addcdiv_` per weight, with fp32 inputs (MPS
# takes the same path). On CUDA and XPU its default `foreach` path calls `_foreach_lerp_` and
# friends on whole tensor lists (`_get_foreach_kernels_supported_devices`), which
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


# %%
profiles, optimizers = {}, {}
for name in MODELS:
    profiles[name], optimizers[name] = profile_step(name)
op_tables = {name: pd.DataFrame(op_dtype_rows(p.events())) for name, p in profiles.items()}
low = dtype_name(LOW)
# no aten::bmm: it runs only in SDPA's math fallback (MPS, GPUs without a fused training kernel),
# which casts q, k, v up to fp32 first (_scaled_dot_product_attention_math in attention.cpp)
COMPUTE = ("aten::convolution", "aten::addmm", "aten::mm",
           "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_efficient_attention",
           "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention")
ENTRY = ("aten::conv2d", "aten::linear")  # where autocast steps in

# %%
for name, ops in op_tables.items():
    compute = ops[ops["op"].isin(COMPUTE)]
    print(f"{name}: the forward's matmul-type ops, as called and as computed:")
    print(ops[ops["op"].isin(COMPUTE + ENTRY)].to_string(index=False))
    assert len(compute) and all(low in d for d in compute["input dtypes"]), compute
    entry = ops[ops["op"].isin(ENTRY)]
    assert entry["input dtypes"].str.contains("fp32").any()  # as called: fp32 weights
    assert entry["input dtypes"].str.fullmatch(rf"{low}(, {low})*").any()  # after the cast

# %%
for name in MODELS:  # the optimizer step of the same profiles
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
    torch.cuda.memory._dump_snapshot("runs/13_transformer_step.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)
    allocated = sum(b["size"] for s in snapshot["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    print(f"after one AMP step: {allocated / 2**20:.1f} MB allocated; open "
          "runs/13_transformer_step.pickle in https://pytorch.org/memory_viz")
    assert allocated > 0
else:
    print(f"No CUDA allocator on {info.type}: the memory snapshot needs a CUDA or ROCm GPU.")


# %%
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
# MPS autocast keeps batch_norm in fp32 (KERNEL_MPS(batch_norm, fp32)): the ConvModel saves more
assert saved.loc["ConvModel", "ratio"] <= (1.3 if info.type == "mps" else 0.55)
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
print(f"this device's fp32 baseline: {fp32_baseline(info)}")
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
# - FP8 needs a scale per tensor, hardware with FP8 matmuls (NVIDIA cc >= 8.9, AMD MI300+) and a
#   library (torchao float8 here) plus `torch.compile`; it pays for large matmuls.
# - `torch.profiler(record_shapes=True)` shows each op's input dtypes: check that the matmuls ran
#   in low precision instead of assuming it.
# - Count saved activations on any device; on CUDA and ROCm, a memory snapshot shows every
#   allocation.
# - Name your fp32 baseline: on NVIDIA Ampere and newer it may be TF32.
