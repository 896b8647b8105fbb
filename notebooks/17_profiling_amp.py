# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 35
#     memory:
#       cpu: 323
#       paper: 3517
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.2
#     needs: 'any device, CPU included; memory snapshot: a CUDA or ROCm GPU; TF32 baseline:
#       NVIDIA compute capability 8.0+'
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
# # 17 · Seeing what ran: the profiler, where the memory goes, and the fp32 baseline
#
# Lessons 12 to 16 said which ops run in low precision under AMP. This lesson shows how to check
# that on your own model instead of assuming it: which ops really ran in low precision (the
# profiler, with input dtypes), where the memory goes (saved activations on every device, a memory
# snapshot on CUDA and ROCm GPUs), and what your "fp32" baseline really was (TF32 on NVIDIA Ampere
# and newer).
#
# Both course models take part: the 1x1-conv `ConvModel` of lessons 03-06 and the decoder-only
# transformer of lesson 12 at the preset's sizes. Seeds are fixed.

# %%
import os

import pandas as pd
import torch

from amp_tutorial.device import (
    describe_device,
    dtype_name,
    fp32_baseline,
    select_device,
    set_strict_fp32,
)
from amp_tutorial.kernels import has_device_kernel
from amp_tutorial.measure import op_dtype_rows, optimizer_step_events, saved_activation_bytes
from amp_tutorial.models import course_models
from amp_tutorial.op_profile import events_with_dtypes
from amp_tutorial.plots import plot_op_times
from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import sequence_loss

# %%
info = select_device()
preset = get_preset(device_type=info.type)
# bf16 where the device has it (old MPS has only fp16)
LOW = torch.bfloat16 if torch.bfloat16 in info.amp_dtypes else info.amp_dtype
assert LOW is not None, "this device/torch has no usable autocast dtype"
torch.manual_seed(0)  # every run starts from the same numbers
print(describe_device(info))
print(f"preset {preset.name!r}; low-precision dtype for this lesson: {dtype_name(LOW)}")

# %% [markdown]
# The two models and one batch of data for each: lesson 03's image problem (channels-last, as in
# the benchmark) and the first training batch of lesson 12's reversal task.

# %%
MODELS = course_models(preset, info.device)  # name -> (make, inputs, targets, loss_fn)
make_transformer, tokens, token_targets, _ = MODELS["transformer"]

# %% [markdown]
# ## 1. The profiler, with input dtypes
#
# `torch.profiler` with `record_shapes=True` records, for every op, the shapes **and the dtypes** of
# its inputs. torch 2.14 hands them out as `event.input_dtypes`; 2.9 and 2.11 keep them only in the
# profiler's own record, where the course's `events_with_dtypes(prof)` reads them. One AMP training
# step of each model, grouped by op and input dtypes (the course's `op_dtype_rows`), shows what
# autocast did. Autocast steps in where your code calls `conv2d` or `linear`: the profiler records
# that call with the fp32 weights you passed, then the casts (`_to_copy`, reading fp32), then the
# same op again with low-precision inputs, and under it the op that computes (`convolution`,
# `addmm`, `mm`, the attention kernel), all in low precision. On MPS `linear` is itself the op that
# computes: `native_functions.yaml` gives it an MPS kernel (`_mps_linear`), so no `addmm` or `mm`
# appears under it there, and the cell counts `linear`'s low-precision call as the compute op on any
# device whose dispatcher (or yaml) lists such a kernel (`has_device_kernel`). The optimizer's ops,
# found under the profiler's `Optimizer.step#Adam.step` range, work on the fp32 weights, gradients
# and moving averages: on the CPU Adam's default single-tensor path calls `lerp_`, `addcmul_` and
# `addcdiv_` per weight, with fp32 inputs (MPS takes the same path). On CUDA and XPU its default
# `foreach` path calls `_foreach_lerp_` and friends on whole tensor lists
# (`_get_foreach_kernels_supported_devices`), which the profiler records without dtypes, so there
# the cell reads the state's dtype instead. On GPUs the profiler also records the kernels, which the
# second table lists.

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
events = {name: events_with_dtypes(p) for name, p in profiles.items()}  # with input dtypes
op_tables = {name: pd.DataFrame(op_dtype_rows(e)) for name, e in events.items()}
low = dtype_name(LOW)
# no aten::bmm: it runs only in SDPA's math fallback (MPS, GPUs without a fused training kernel),
# which casts q, k, v up to fp32 first (_scaled_dot_product_attention_math in attention.cpp)
COMPUTE = ("aten::convolution", "aten::addmm", "aten::mm",
           "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_efficient_attention",
           "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention")
ENTRY = ("aten::conv2d", "aten::linear")  # where autocast steps in
# where linear has a kernel of its own (MPS: _mps_linear), its call after the cast computes
OWN_LINEAR = has_device_kernel("aten::linear", info.type)
if OWN_LINEAR:
    COMPUTE += ("aten::linear",)
print(f"aten::linear has its own {info.type} kernel: {OWN_LINEAR}")
if info.type in ("cpu", "cuda", "mps"):  # the yaml: MPS only (XPU's kernels live elsewhere)
    assert OWN_LINEAR == (info.type == "mps")

# %%
for name, ops in op_tables.items():
    as_called = ops["op"].isin(ENTRY) & ops["input dtypes"].str.contains("fp32")
    compute = ops[ops["op"].isin(COMPUTE) & ~as_called]  # an entry op as called is not compute
    print(f"{name}: the forward's matmul-type ops, as called and as computed:")
    print(ops[ops["op"].isin(COMPUTE + ENTRY)].to_string(index=False))
    assert len(compute) and all(low in d for d in compute["input dtypes"]), compute
    entry = ops[ops["op"].isin(ENTRY)]
    assert entry["input dtypes"].str.contains("fp32").any()  # as called: fp32 weights
    assert entry["input dtypes"].str.fullmatch(rf"{low}(, {low})*").any()  # after the cast

# %%
for name in MODELS:  # the optimizer step of the same profiles
    adam = pd.DataFrame(op_dtype_rows(optimizer_step_events(events[name]), 0))
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
fig = plot_op_times(op_dtype_rows(events["transformer"]),
                    f"Transformer, one AMP {low} step on {info.type}: the ops that took longest")

# %% [markdown]
# ## 2. Where the memory goes
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
    torch.cuda.memory._dump_snapshot("runs/17_transformer_step.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)
    allocated = sum(b["size"] for s in snapshot["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    print(f"after one AMP step: {allocated / 2**20:.1f} MB allocated; open "
          "runs/17_transformer_step.pickle in https://pytorch.org/memory_viz")
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
# ## 3. The fp32 baseline on NVIDIA Ampere and newer
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
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **Adam's foreach path on a CPU.** In `profile_step`, pass `foreach=True` to Adam. The update
#    table gains `_foreach_lerp_`, `_foreach_addcmul_` and `_foreach_addcdiv_`, one call each and no
#    dtypes, as on CUDA. The per-weight `lerp_`, `addcmul_` and `addcdiv_` with fp32 inputs stay
#    (10 calls each for the ConvModel at `smoke`): on a CPU the foreach ops loop over those.
# 2. **fp16 instead of bf16.** In section 2's `saved_mb`, replace `dtype=LOW` with
#    `dtype=torch.float16`. On a CPU both models save exactly the same bytes as before (ratios 0.516
#    and 0.573 at `smoke`; the column keeps its bf16 label): both formats take 2 bytes, and CPU
#    autocast applies the same lists to both.

# %% [markdown]
# ## Quiz: the advanced track
#
# The quiz has 11 questions, one on each of lessons 07 to 17 (the core lessons' quiz is at the end
# of lesson 06). Answer each with a letter in the `answers` dict below and run the next cell: it
# marks each answer, explains the ones you got right, and for a wrong one names the lesson and
# section to reread.

# %%
from IPython.display import Markdown, display

from amp_tutorial.quiz import ADVANCED_QUIZ

display(Markdown(ADVANCED_QUIZ.markdown()))

# %% tags=["exercise"] solution="quiz_advanced_answers.py"
# YOUR ANSWERS: one letter per question, e.g. {1: "a", ...}
answers = {1: None, 2: None, 3: None, 4: None, 5: None, 6: None,  # lessons 07-12
           7: None, 8: None, 9: None, 10: None, 11: None}  # lessons 13-17

# %%
quiz = ADVANCED_QUIZ.check(answers)
print(quiz)
assert quiz.all_correct, "not all answers are right yet: change them above and re-run"

# %% [markdown]
# ## What to remember
#
# - `torch.profiler(record_shapes=True)` records each op's input dtypes (`event.input_dtypes` in
#   torch 2.14, `events_with_dtypes` on older ones): check that the matmuls ran in low precision
#   instead of assuming it. On MPS `linear` computes itself; elsewhere `addmm`/`mm` do.
# - Count saved activations on any device; on CUDA and ROCm, a memory snapshot shows every
#   allocation.
# - Name your fp32 baseline: on NVIDIA Ampere and newer it may be TF32.
