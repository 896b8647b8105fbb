# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 40
#     memory:
#       cpu: 258
#       paper: 3464
#     minutes:
#       cpu: 2.1
#       small: 1.2
#       smoke: 0.3
#     needs: any device, CPU included; torch.compile on a CPU needs a C++ compiler
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
# # 14 · torch.compile with AMP: what it sees, and what it changes
#
# Once AMP works, the next question is whether `torch.compile` adds to it, and what it changes.
# This lesson looks at the graph compile captures from an autocast region, then measures eager
# and compiled training, fp32 and AMP, side by side.
#
# Both course models take part: the 1x1-conv `ConvModel` of lessons 03-06 and the small
# decoder-only transformer of lesson 12 (sequence reversal). Sizes come from the preset; seeds
# are fixed. Lesson 15 asks why one would not simply cast the whole model to bf16.

# %%
import os
import shutil

import pandas as pd
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.interleave import interleave
from amp_tutorial.measure import Comparison, StepTimer, fresh_compile_cache
from amp_tutorial.models import course_models
from amp_tutorial.plots import plot_bars
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import with_recorded

info = select_device()
preset = get_preset(device_type=info.type)
# bf16 where the device offers it, else the device's AMP dtype (a pre-Ampere GPU: fp16)
LOW = torch.bfloat16 if torch.bfloat16 in info.amp_dtypes else info.amp_dtype
assert LOW is not None, "this device/torch has no usable autocast dtype"
torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset, dtype=LOW))

# %% [markdown]
# The two models and their data. The transformer is lesson 12's, at the preset's sizes
# (`make_transformer_problem`), trained here on one fixed batch: compile and precision are what
# change between runs, not the data.

# %%
MODELS = course_models(preset, info.device)  # name -> (make, inputs, targets, loss_fn)
make_conv, image_in, image_target, _ = MODELS["ConvModel"]
make_transformer, tokens, token_targets, _ = MODELS["transformer"]
print(f"ConvModel: {preset.grid}x{preset.grid} image, hidden {preset.hidden}; transformer: "
      f"d_model {preset.transformer.d_model}, {preset.transformer.n_layers} layers, batch "
      f"{tokens.shape[0]} x {tokens.shape[1]} tokens")

# %% [markdown]
# ## 1. What compile sees
#
# `torch.compile` captures the Python code as a graph (TorchDynamo), turns the forward and the
# backward into graphs of ATen ops (AOTAutograd), and hands them to a code generator (Inductor,
# the default backend). Autocast is traced too: its casts become ordinary nodes in the graph.
# `make_fx` produces the same kind of ATen graph without compiling anything, so we can look at
# it: one forward + loss of the ConvModel, traced with autocast off and on. It traces under
# `torch.no_grad()`: traced while autograd recorded, the activations saved for a backward that
# never runs stayed alive after the traced graph was gone, even after `gc.collect()` (torch 2.14:
# 2.3 GiB at the `paper` size).

# %%
def aten_graph(autocast_on):
    model = make_conv()

    def forward_and_loss(x, y):
        with torch.autocast(info.type, dtype=LOW, enabled=autocast_on):
            return F.mse_loss(model(x), y)

    with torch.no_grad():
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
# ## 2. Eager and compiled, fp32 and AMP, side by side
#
# Compiling happens on the first call, so that call is timed on its own and reported as the
# compile time (first call minus a median step); the step times come from the calls after it,
# every run of a model taking turns step by step beside a second eager fp32 run, the control
# (`interleave`, lesson 03).
# Inductor needs a C++ compiler on CPUs (and Triton on GPUs). At the `smoke` preset the lesson
# uses the `aot_eager` backend instead: it captures the same graphs but generates no code, which
# keeps the test suite fast and says nothing about speed, and it compiles only the AMP runs. The
# optimizer step stays eager here. Each run times at most 32 steps: enough for a median, and four
# runs per model stay within minutes on a CPU that emulates bf16 (lesson 03 trains to the end).
#
# Inductor keeps what it compiled in an on-disk cache (`/tmp/torchinductor_<user>` unless
# `TORCHINDUCTOR_CACHE_DIR` says otherwise), and the FX-graph and AOTAutograd caches in it are on
# by default: a second run of the same model would time a cache hit, a fraction of the real
# compile. `fresh_compile_cache` points it at a new empty folder for the runs below (and removes
# it after), so the compile time is the one a new model costs the first time.

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


# %%
def new_run(model_name, amp_dtype, compiled):
    """A fresh seeded model and its training step (lesson 03's loop), eager or compiled."""
    make_model, inputs, targets, loss_fn = MODELS[model_name]
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(
        info.type, enabled=amp_dtype is not None and info.needs_grad_scaler(amp_dtype))
    net = torch.compile(model, backend=BACKEND) if compiled else model
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            loss = loss_fn(net(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())

    label = f"{'compiled' if compiled else 'eager'} {dtype_name(amp_dtype)}"
    return {"model": model_name, "run": label, "step": step, "losses": losses}


# %%
def first_call_s(step):
    """The first call's seconds, device synchronised: a compiled step compiles in it."""
    timer = StepTimer(info.device, warmup=1)
    with timer.step():
        step()
    return timer.warmup_samples[0]


# %%
built = {model_name: {} for model_name in MODELS}  # each model's runs, their first call done
with fresh_compile_cache():  # Inductor's on-disk cache starts empty: cold compiles
    for model_name, runs in built.items():
        for compiled, amp_dtype in ((False, None), (False, LOW), (True, None), (True, LOW)):
            if compiled and BACKEND is None:
                print(f"{model_name}: compiled {dtype_name(amp_dtype)} skipped: {backend_reason}")
                continue
            if compiled and amp_dtype is None and preset.name == "smoke":
                continue  # smoke: compile only the AMP run, to keep CI short
            r = new_run(model_name, amp_dtype, compiled)
            try:
                r["first_s"] = first_call_s(r["step"])
            except Exception as err:  # a broken toolchain must not end the lesson
                print(f"{model_name} {r['run']} failed: {type(err).__name__}: {str(err)[:300]}")
                continue
            runs[r["run"]] = r

# %%
compile_runs, timed = [], {}
for model_name, runs in built.items():
    control = new_run(model_name, None, False)  # eager fp32 built twice: the A/A control
    control["first_s"] = first_call_s(control["step"])
    timed[model_name] = interleave(
        {**{n: r["step"] for n, r in runs.items()}, "eager fp32 again": control["step"]},
        "eager fp32", "eager fp32 again", info.device, blocks=min(preset.steps, 32) // 2,
        preset=preset.name)
    for r in runs.values():
        r["timing"] = timed[model_name].timings[r["run"]]
        r["compile_s"] = (r["first_s"] - r["timing"].median if r["run"].startswith("compiled")
                          else float("nan"))
        compile_runs.append(r)
    print(f"{model_name}: timed in {timed[model_name].basis}; eager fp32 against itself: "
          f"{timed[model_name].ratio('eager fp32 again')}")

# %%
table = pd.DataFrame([{
    "model": r["model"], "run": r["run"], "ms/step (median)": r["timing"].median * 1e3,
    "IQR (ms)": r["timing"].iqr * 1e3, "compile (s)": r["compile_s"],
    "final loss": r["losses"][-1]} for r in compile_runs]).set_index(["model", "run"])

def against(r, baseline_run):
    """r's time against another run of its model, from the same interleaved blocks."""
    return timed[r["model"]].comparison(r["run"], against=baseline_run)


# a speedup only where the control holds 1.0 and the intervals are narrow (else NaN)
table["speedup vs eager fp32"] = [against(r, "eager fp32").stated or float("nan")
                                  for r in compile_runs]
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
        # Inductor's code generation takes seconds; aot_eager (smoke) generates no code, and its
        # capture alone took less than one step on a loaded 2-core machine (CI, torch 2.9, fp16)
        if BACKEND == "inductor":
            assert r["compile_s"] > r["timing"].median, "the first call should include compiling"
for r in compile_runs:
    if r["run"].startswith("compiled"):
        c = against(r, r["run"].replace("compiled", "eager"))
        question = f"14 {r['model']} {r['run']}"  # e.g. "14 ConvModel compiled bf16"
        print(f"{r['model']}: {with_recorded(c, question, info)}\n  compile took "
              f"{r['compile_s']:.1f} s")

# %%
# per panel, by the one timing rule: why its bars give no ratio, or None
noise = {f"{m} (ms/step)": Comparison.why_no_ratio(
    against(r, "eager fp32") for r in compile_runs if r["model"] == m and r["run"] != "eager fp32")
    for m in MODELS}
fig = plot_bars({f"{m} (ms/step)": table.loc[m, "ms/step (median)"].to_dict() for m in MODELS},
                f"Eager vs torch.compile, fp32 vs AMP {dtype_name(LOW)} ({preset.name}, "
                f"{info.type}, backend {BACKEND}); whiskers: ± half the IQR",
                errors={f"{m} (ms/step)": table.loc[m, "IQR (ms)"].div(2).to_dict()
                        for m in MODELS}, noise=noise)

# %% [markdown]
# ## 3. Why: the profile of both steps
#
# A verdict of "slower" or "faster" says nothing about the cause. The profiler does: three
# ConvModel training steps, eager and compiled, both in low precision, after two untimed steps
# (the first compiles). `cpp.enable_kernel_profile` makes Inductor record each C++ kernel it
# generates under its own name (`graph_0_cpp_fused_<the ops it fused>_N`; on Linux and Windows
# only, `codegen/cpp.py`); without it they hide in the self time of
# `## Call CompiledFxGraph ... ##`. The setting is read when the code is generated, so the
# compiled model is compiled afresh here (`torch.compiler.reset()`): a new `ConvModel` of the
# same shapes would otherwise reuse the code compiled in section 2, which Dynamo guards on the
# class and the shapes, not on the object, and the names would be missing. No GradScaler: these
# steps are looked at, not trained. Sorted by self time, the top rows show where each step's time
# goes.
#
# **Which clock.** On a CPU the ops' own (self) CPU time is where the step's time goes. On a GPU
# it is not: the CPU only queues kernels, so its ops' times rank launch overhead. There the
# profiler also records the GPU's kernels (`ProfilerActivity.CUDA`, which ROCm shares, or `XPU`)
# with their times taken on the device, and the tables below rank those kernels instead (lesson 17
# reads such a profile in full). On MPS the profiler sees no kernels, so the tables stay on the
# CPU's side and say so.

# %%
import sys

import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

from amp_tutorial.op_profile import self_times_per_step

KERNEL_ACTIVITY = {"cuda": ProfilerActivity.CUDA, "xpu": ProfilerActivity.XPU}.get(info.type)
ACTIVITIES = [ProfilerActivity.CPU, *([KERNEL_ACTIVITY] if KERNEL_ACTIVITY else [])]
CLOCK = "device kernels" if KERNEL_ACTIVITY else "CPU ops"
host_only = info.type != "cpu" and not KERNEL_ACTIVITY  # MPS: launch time, not the GPU's
print(f"the tables below rank {CLOCK} by their own time on {info.type}"
      + (" (the CPU's launch time: the profiler sees no kernels here)" if host_only else ""))


# %%
def profile_conv_step(compiled, steps=3):
    """Per op (CPU) and per kernel (GPU): calls and self ms per step, of ``steps`` steps."""
    make_model, inputs, targets, loss_fn = MODELS["ConvModel"]
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if compiled:
        torch.compiler.reset()  # compile anew, with the kernel names (section 2's code lacks them)
    net = torch.compile(model, backend=BACKEND) if compiled else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(info.type, dtype=LOW):
            loss = loss_fn(net(inputs), targets)
        loss.backward()
        optimizer.step()

    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        for _ in range(2):
            step()
        with profile(activities=ACTIVITIES) as prof:
            for _ in range(steps):
                step()
    return self_times_per_step(prof, steps)  # per CPU op, per device kernel


# %%
def kind(op):
    """Where an op's (or a GPU kernel's) time goes: code Inductor generated, a library kernel,
    or eager ATen. Generated first: a fused kernel's name can list `convolution_backward`."""
    if "cpp_fused" in op or op.startswith(("triton_", "## Call CompiledFxGraph")):
        return "code Inductor generated"
    library = ("gemm", "cudnn", "cutlass", "xmma", "miopen", "rocblas", "hipblas", "onednn")
    if ("convolution" in op or op.endswith(("::mm", "::addmm", "::bmm"))
            or any(name in op.lower() for name in library)):
        return "conv/matmul: library (oneDNN, cuDNN, ...)"
    if op.startswith("aten::") or "at::native" in op:  # a GPU kernel of an eager ATen op
        return "eager ATen op"
    return "other (Python, optimizer, autograd, copies)"


# %%
if BACKEND is None:
    print(f"no compiled profile: {backend_reason}")
profiled = {f"{'compiled' if c else 'eager'} {dtype_name(LOW)}": profile_conv_step(c)
            for c in (False, True) if BACKEND or not c}
profiles = {run: ops for run, (ops, _) in profiled.items()}  # CPU ops: the names asserted below
ranked = {run: kernels if KERNEL_ACTIVITY else ops for run, (ops, kernels) in profiled.items()}
top_ops = {run: pd.DataFrame([{"op": op[:70], "calls/step": calls, "self ms/step": ms}
                              for op, (calls, ms) in ops.items()])
           .sort_values("self ms/step", ascending=False).head(8).round(2)
           for run, ops in ranked.items()}
by_kind = pd.DataFrame({run: pd.Series({op: ms for op, (_, ms) in ops.items()}, dtype=float)
                        .groupby(kind).sum() for run, ops in ranked.items()}).fillna(0)
by_kind.round(1)

# %%
for run, ops in top_ops.items():
    print(f"{run}: top {CLOCK} by self time per step\n{ops.to_string(index=False)}\n")

# %% [markdown]
# What the two tables show, on any CPU (the kernel names on Linux and Windows): the convolutions
# (forward and backward) are library calls in both steps: Inductor does not generate a 1x1
# convolution, it calls the ATen convolution eager calls (an *extern* kernel: oneDNN's, or on a CPU
# without native bf16 ATen's own `_slow_conv2d`). Everything around them changes. Eager runs
# BatchNorm, ReLU, their backward ops and autocast's casts as separate ATen ops, each a full pass
# over the activations; Inductor decomposes BatchNorm and fuses it with the casts and the ReLU into
# a few generated C++ loops, whose names list what they fused (at `smoke`, `aot_eager` generates
# nothing: both tables list ATen ops). So whether compile wins is a contest between ATen's
# hand-written kernels and Inductor's generated loops on your CPU, with the convolutions the same on
# both sides. Measured with the benchmark on a 2-core Zen 4 (AVX512-BF16, no AMX), compiled bf16
# trained at 1.87x eager fp32 and eager bf16 at 2.05x: there the generated code lost. On a 2-core
# Xeon with AMX, this profile at `cpu` gave 88 ms of self time per eager step (BatchNorm, ReLU and
# their backward 59 ms of it) against 56 ms compiled: there it won. `by_kind` above says which
# happened here.

# %%
eager_ops, *compiled = profiles.values()
assert any("convolution" in op for op in eager_ops)  # the library conv, eagerly
# eager BatchNorm: ATen's own kernel, or cuDNN's / MIOpen's for float16 on a GPU
# (_select_batch_norm_backend in Normalization.cpp)
batch_norms = {"aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm"}
assert batch_norms & set(eager_ops)
if compiled and BACKEND == "inductor" and info.type == "cpu":
    assert any(op.startswith("aten::convolution") for op in compiled[0])  # extern, as eager
    assert "aten::native_batch_norm" not in compiled[0]  # decomposed, into generated code
    generated = [op for op in compiled[0] if "cpp_fused" in op]
    if sys.platform in ("linux", "win32"):  # where Inductor names its C++ kernels
        assert any("batch_norm" in op for op in generated), generated
        print(f"Inductor generated {len(generated)} kernels, e.g. {min(generated, key=len)}")
    else:
        print(f"no kernel names on {sys.platform}: Inductor names its C++ kernels on Linux and "
              "Windows only; their time is in `## Call CompiledFxGraph ... ##`")

# %% [markdown]
# The benchmark does the same for the ConvModel: `pdm run bench --compile` adds a compiled row
# per precision, with the compile time in its own column.

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
#
# 1. **The loss outside autocast.** In section 1, compute `model(x)` inside the autocast block and
#    the loss after it. On a CPU the `_to_copy` count with autocast on drops by one (8 to 7 at
#    `smoke`, 10 to 9 at `cpu`): the up-cast autocast added for `mse_loss`, on its fp32 list, is
#    gone. The loss is still computed in fp32, by type promotion inside the op, unseen in the graph.
# 2. **Compile the fp32 run at `smoke`.** In section 2, delete the two lines that skip it. A
#    "compiled fp32" row appears with the same losses as "eager fp32", every digit: `aot_eager`
#    captures graphs but runs the same ATen kernels, as the compiled bf16 row already shows.
# 3. **Inductor at `smoke`.** In `choose_backend`, delete the `smoke` branch (Inductor needs a C++
#    compiler). The compile column grows from a second or two to tens of seconds (on a 2-core
#    AMD EPYC here, 0.8 s to 34 s for the ConvModel), and the compiled losses no longer equal
#    eager's to every digit (the ConvModel's final loss here: 0.11967 against 0.11978; `r["losses"]`
#    in `compile_runs` has them all): Inductor generates fused code, which rounds differently.

# %% [markdown]
# ## What to remember
#
# - `torch.compile` and AMP combine: autocast's casts become graph nodes that Inductor fuses into
#   the neighbouring elementwise kernels. Report the compile time apart from the step time, and
#   measure: it helps the elementwise-heavy ConvModel more than a matmul-bound transformer.
# - When compile makes a step slower (or faster), profile both: the convolutions and matmuls stay
#   library calls; what changed is the code around them, which Inductor generated.
