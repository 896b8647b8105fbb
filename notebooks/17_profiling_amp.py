# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 50
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
# # 17 · Seeing what ran: the profiler, the memory, the fp32 baseline and MFU
#
# Lessons 12 to 16 said which ops run in low precision under AMP. This lesson shows how to check
# that on your own model instead of assuming it: which ops really ran in low precision (the
# profiler, with input dtypes), where the memory goes (saved activations on every device, a memory
# snapshot on CUDA and ROCm GPUs), what your "fp32" baseline really was (TF32 on NVIDIA Ampere
# and newer), and how far a step is from the hardware's limit (MFU), with a short live ladder of
# what closes the gap.
#
# Both course models take part: the 1x1-conv `ConvModel` of lessons 03-06 and the decoder-only
# transformer of lesson 12 at the preset's sizes. Seeds are fixed.

# %%
import os

import pandas as pd
import torch

from amp_tutorial.device import (
    device_line,
    dtype_name,
    fp32_baseline,
    select_device,
    set_strict_fp32,
)
from amp_tutorial.kernels import has_device_kernel
from amp_tutorial.measure import op_dtype_rows, optimizer_step_events, saved_bytes
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
print(device_line(info, preset, dtype=LOW))

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
# change. On every device the course counts the bytes autograd saves for backward
# (`saved_bytes`): the activations autocast halves, apart from the 16-bit weight copies it adds.

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
def saved_for_backward(model_name, autocast_on):
    make_model, inputs, targets, loss_fn = MODELS[model_name]
    model = make_model()

    def forward_and_loss():
        with torch.autocast(info.type, dtype=LOW, enabled=autocast_on):
            loss_fn(model(inputs), targets)

    return saved_bytes(forward_and_loss, model)


saved = {}
for name in MODELS:
    fp32, amp = saved_for_backward(name, False), saved_for_backward(name, True)
    saved[name] = {"fp32": fp32.activations / 2**20, f"AMP {low}": amp.activations / 2**20,
                   "AMP cast weights": amp.cast_weights / 2**20}
saved = pd.DataFrame(saved).T
saved["ratio"] = saved[f"AMP {low}"] / saved["fp32"]
# MPS autocast keeps batch_norm in fp32 (KERNEL_MPS(batch_norm, fp32)): the ConvModel saves more
assert saved.loc["ConvModel", "ratio"] <= (1.3 if info.type == "mps" else 0.55)
assert saved.loc["transformer", "ratio"] < 1
print("activations saved for backward (MB) in one forward + loss, and AMP's weight copies:")
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
# ## 4. How far from the hardware's limit: MFU
#
# AMP made the step faster; how much faster *could* it be? **Model FLOPs utilization** (MFU, as
# PaLM defines it) answers in three steps:
#
# 1. **FLOPs per step**: the multiply-adds of the forward and backward pass, 2 FLOPs each.
#    PyTorch's `torch.utils.flop_counter.FlopCounterMode` counts them; the course's `step_flops`
#    counts on `meta` tensors (shapes only: nothing computed or allocated). The optimizer is not
#    counted; attention counts as two full matmuls, even where a causal kernel skips half.
# 2. **Achieved TFLOP/s** = FLOPs per step / median step time.
# 3. **MFU** = achieved / the hardware's dense peak *of the dtype the step computes in*: an H100
#    SXM's datasheet gives 67 TFLOP/s for fp32 and 989.5 for fp16 and bf16 (tensor cores), so
#    AMP's bar is about fifteen times higher than fp32's.
#
# By hand: each matmul weight costs 6 FLOPs per token (2 forward, 4 backward), a block has 12·d²
# of them and the head d·vocab; attention's two matmuls add 12·batch·seq²·d per block.

# %%
from amp_tutorial.mfu import peak_for, step_flops
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig

sizes = preset.transformer
config = TransformerConfig(sizes.n_symbols + 1, sizes.seq_len, sizes.d_model, sizes.n_layers,
                           sizes.n_heads)


def flops_per_step(batch):  # the model and a batch built on "meta": counted, not computed
    return step_flops(lambda: (DecoderTransformer(config),
                               (torch.zeros(batch, sizes.seq_len, dtype=torch.long),) * 2),
                      lambda model, x, y: sequence_loss(model(x), y))


flops = flops_per_step(sizes.batch)
d, layers, batch, seq = sizes.d_model, sizes.n_layers, sizes.batch, sizes.seq_len
by_hand = (6 * batch * seq * (12 * d * d * layers + d * config.vocab_size)
           + 12 * batch * seq * seq * d * layers)
print(f"one training step: {flops / 1e9:.3f} GFLOP counted, {by_hand / 1e9:.3f} by hand")
assert flops == by_hand
assert flops_per_step(4 * batch) == 4 * flops  # four times the tokens, four times the FLOPs

# %% [markdown]
# A CPU has no single datasheet peak (it follows its cores, clocks and vector units): there MFU
# is n/a and the measure is the share **of the measured matmul rate** of the step's dtype, a
# square matmul timed now (`matmul_ceiling`; `Utilization.of_matmul`). Where bf16 is emulated (a
# CPU without avx512_bf16 or AMX), that rate bounds nothing, and it is n/a too. The column *its
# matmuls, of the rate* reads the step's own matmuls against it (their FLOPs over their profiled
# time): near 100%, the step loses its time around its matmuls; well below, in them as well.
#
# `amp_tutorial.ladder` trains the transformer in *rungs*, each changing one thing: fp32, AMP, +
# fused AdamW, + `torch.compile`, + CUDA graphs (CUDA only), 4x the batch, the other 16-bit
# dtype, pure bf16. Each rung is a fresh seeded model, timed for a short budget and profiled for
# 3 steps. The compiled rungs are left out here (compiling takes minutes; `pdm run ladder` runs
# them all); the larger batch, the other dtype and pure bf16 run eager instead. Each rung's
# ms/step and MFU are its own run's; the ratios against fp32 come from a second pass, timed as in
# lesson 03: the eager rungs at fp32's tokens, built again, take turns with fp32 and a second
# fp32 model (`compare_rungs`), with the answers recorded on machines like yours where none is.

# %%
from amp_tutorial.ceiling import SIZES, matmul_ceiling
from amp_tutorial.ladder import run_ladder

peak = peak_for(info.name, info.type)  # the datasheet's dense peaks; None on a CPU
RUN_S, RUN_STEPS = {"smoke": (0.5, 5), "small": (1.0, 10)}.get(preset.name, (3.0, 30))
ceiling = matmul_ceiling(info, SIZES[preset.name], "matmuls", budget_s=RUN_S)
print(f"peak: {peak.name} {peak.tflops} TFLOP/s" if peak else "no datasheet peak: MFU is n/a")
print("\n".join(ceiling.lines()))
rows = run_ladder(info, sizes, ceiling, compiled=False, budget_s=RUN_S, max_steps=RUN_STEPS,
                  preset=preset.name)
ran = [r for r in rows if r.timing is not None]
pd.DataFrame([r.table_row() for r in rows]).fillna("").style.hide(axis="index")

# %%
from amp_tutorial.recorded import with_recorded

fp32 = rows[0]
for r in ran:
    u = r.utilization
    # the dtype changes the cost of a FLOP, not their number; the tokens change their number
    assert u.flops * fp32.tokens == fp32.utilization.flops * r.tokens, (r.rung.name, u.flops)
    assert abs(sum(r.shares.shares.values()) - 1) < 0.02, (r.rung.name, r.shares.shares)
    assert (u.mfu is None) == (peak is None) and (info.type != "cpu" or u.mfu is None)
    assert r.rung.compute not in ceiling.emulated or u.of_matmul is None
    if r is not fp32 and r.tokens == fp32.tokens:  # a step of 4x the tokens: compare TFLOP/s
        print(with_recorded(r.comparison, f"17 {r.rung.name.removeprefix('AMP ')}", info))
for dtype in ceiling.emulated:
    print(f"{dtype} is emulated on this CPU: no {dtype} matmul rate to compare against")
beyond = [r.rung.name for r in ran if (r.utilization.of_matmul or 0) > 1]
if beyond:  # a busy machine, or a dtype emulated here
    print(f"{', '.join(beyond)}: above 100% of the timed matmul rate, no limit for them here")

# %% [markdown]
# The figures: each rung's MFU (with the 40% goal, where there is a datasheet peak) or share of
# the matmul rate, whiskers the IQR; a rung without a bar (left out, not offered here, or with no
# measure to read it by, such as a bf16 rung where bf16 is emulated) is named under the bars with
# the reason its row gives; a rung whose row says NOISY is drawn pale, with why: no result. Then
# each step split into matmuls, attention, memory-bound ops (norms, adds, casts), the optimizer
# and *idle* (no kernel ran on a GPU; no op on a CPU).

# %%
from amp_tutorial.ladder import ladder_figures, ladder_report

figures = ladder_figures(ladder_report(info, ceiling, rows))  # drawn from the numbers above

# %% [markdown]
# **What a GPU run said.** `pdm run ladder` on an NVIDIA H200 (torch 2.11.0+cu130, 2026-11-27;
# the record: [docs/benchmark.md](../docs/benchmark.md)) at `paper` (6 layers, width 512, seq
# 512, batch 32: 2.17 TFLOP per step), compiled rungs included:
#
# | rung | ms/step | MFU | idle |
# | --- | --- | --- | --- |
# | fp32 | 51.9 | 62% of fp32's 67 TFLOP/s (41.7 TFLOP/s) | |
# | AMP fp16 (eager) | 20.9 (IQR 3.4) | 10.5% of 989.5 TFLOP/s | 65% |
# | + fused AdamW | 18.5 | 11.9% | |
# | + torch.compile | 12.4 | 17.7% | 63% |
# | + CUDA graphs (`mode="reduce-overhead"`) | 7.9 | 27.6% | 22% |
# | + batch x4 (65,536 tokens) | 25.2 | 34.8% | 8% |
# | bf16 instead of fp16, then pure bf16 | 24.0, 23.0 | 36.5%, 38.0% | |
#
# Plain AMP left the tensor cores idle: for 65% of its step no kernel ran, as the GPU waited for
# Python to launch its many small kernels (**launch-bound**); matmuls took 11%, attention 3%,
# memory-bound ops 19%, the optimizer 2%. Each rung removed one cause: fusing cut kernels, CUDA
# graphs cut launches, a 4x batch gave each kernel more work. The best rung, pure bf16, stayed
# below the 40% goal at this width. A width sweep (eager, AMP fp16 against fp32) showed the
# rest: AMP was *slower* than fp32 at width 256 with 16,384 tokens (21.1 against 19.0 ms) and
# faster from width 512; eager AMP reached 40.5% MFU at width 1024 with 65,536 tokens, 46.6%
# (16,384 tokens) and 50.8% (65,536) at width 2048, while fp32 stayed at 49-75% of its own, much
# lower peak. **Larger matmuls are what keep tensor cores busy.** Eager rungs of a launch-bound
# step vary too: an earlier run that day gave AMP fp16 14.5 ms and compile 17.6 ms; eager
# numbers varied by ~40% between the two runs. That is why the ladder prints IQRs.
#
# **And on CPUs** (`pdm run ladder --device cpu --preset cpu`, docs/benchmark.md): on an AMD Zen 4
# with avx512_bf16 (bf16 matmuls 2.2x as fast as fp32's) the best rung reached 80% of the bf16
# matmul rate; on an Intel Xeon with AMX (6x) 26-33%. The faster the matmul unit, the more the
# rest of the step (attention, norms, casts, the optimizer) decides its time: Amdahl's law.

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
# 3. **Bigger matmuls, without compiling.** In section 4, run one more rung: `import dataclasses`,
#    `from amp_tutorial.ladder import run_step`, then `run_step(info, sizes, dataclasses.replace(
#    rows[1].rung, batch_scale=4), ceiling)`. Its `utilization.flops` is exactly 4x fp32's.

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
# - MFU = model FLOPs per second (`FlopCounterMode` counts them) over the peak of the dtype the
#   step computes in. Plain AMP on a small model is launch- and memory-bound (10.5% on an H200);
#   fusing, compiling, CUDA graphs and above all larger matmuls are what close the gap.
