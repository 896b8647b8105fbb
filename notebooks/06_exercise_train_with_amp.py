# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 50
#     memory:
#       cpu: 67
#       paper: 522
#     minutes:
#       cpu: 0.2
#       small: 0.3
#       smoke: 0.2
#     needs: any device, CPU included
#     track: core
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
# # 06 · Exercise: write `train_with_amp` yourself
#
# Lessons 02 and 03 showed every piece of an AMP training loop. Now you write one, a checker tells
# you what is wrong with it in plain words, and you compare what it learns with fp32 training.
#
# 1. Fill in `train_with_amp` in the cell marked **YOUR CODE**.
# 2. Run the checker cell. It trains a tiny network with your function on the CPU, in float16
#    (with and without gradient clipping) and in bfloat16, watches what your code does at every
#    step, and lists each mistake it finds. Edit, re-run your cell, re-run the checker.
# 3. Train the course's model with your function on your device and compare with fp32.
# 4. Answer the quiz.
#
# Stuck? The hints below open one at a time. The reference solution is in
# `amp_tutorial/exercises/solutions/train_with_amp.py`; try without it first.

# %%
import torch
from IPython.display import Markdown, display

from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.exercises.train_loop import check_train_with_amp, train_fp32
from amp_tutorial.models import seeded_conv_model
from amp_tutorial.plots import plot_losses
from amp_tutorial.presets import get_preset
from amp_tutorial.quiz import CORE_QUIZ

info = select_device()
preset = get_preset(device_type=info.type)
print(device_line(info, preset))
assert info.amp_dtype is not None, "this torch has no usable autocast dtype here; upgrade torch"

# %% [markdown]
# ## The task
#
# ```python
# def train_with_amp(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
#                    max_grad_norm=None) -> list[float]:
# ```
#
# - `model` is on the device already; `data` is a list of `(inputs, targets)` batches on the same
#   device; `optimizer` holds the model's parameters; `loss_fn(outputs, targets)` returns a scalar.
# - `device_type` is the autocast device type (`"cuda"`, `"cpu"`, `"mps"`, `"xpu"`), and
#   `amp_dtype` is `torch.float16` or `torch.bfloat16`.
# - If `max_grad_norm` is not None, clip the gradients' total norm to it before each update.
# - Train for `epochs` passes over `data`, one optimizer step per batch, and return a list with
#   one float per epoch: the mean of that epoch's batch losses.
#
# Your loop must be right for both dtypes: float16 needs a `torch.amp.GradScaler`, bfloat16 does
# not (lesson 02 shows why). The checker accepts every correct spelling: with or without
# `enabled=` switches, `torch.autocast` or `torch.amp.autocast`, `zero_grad()` with
# `set_to_none` either way, and bfloat16 with or without a (harmless) scaler.

# %% tags=["exercise"] solution="train_with_amp.py"
# YOUR CODE: replace the body of this function, run this cell, then run the checker below.
def train_with_amp(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                   max_grad_norm=None):
    """Train with autocast (and a GradScaler for float16); return the mean loss of each epoch."""
    raise NotImplementedError(
        "Write the AMP training loop: per batch, zero the gradients, run the forward pass and "
        "the loss under torch.autocast, then backward (scaled for float16), optional clipping, "
        "the optimizer step and the scaler update. Open the hints below if you get stuck."
    )


# %% [markdown]
# ### Hints (open one at a time)
#
# <details><summary>Hint 1: the skeleton</summary>
#
# Two loops, `for epoch in range(epochs):` and `for inputs, targets in data:`. Each batch: zero the
# gradients, forward + loss, backward, step. Add up `loss.item()` per epoch and append the mean.
# Use `.item()`: keeping the loss tensors would keep every step's autograd graph alive.
# </details>
#
# <details><summary>Hint 2: where autocast goes</summary>
#
# Only the forward pass and the loss go inside
# `with torch.autocast(device_type=device_type, dtype=amp_dtype):`. `backward()` and the
# optimizer step go after the `with` block (dedented).
# </details>
#
# <details><summary>Hint 3: the scaler</summary>
#
# Create one scaler before the loops:
# `scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)`. With
# `enabled=False` its methods pass straight through, so the same loop serves bfloat16. Then:
# `scaler.scale(loss).backward()`, `scaler.step(optimizer)` (never `optimizer.step()` directly),
# `scaler.update()` once per step.
# </details>
#
# <details><summary>Hint 4: clipping</summary>
#
# The gradients after `scaler.scale(loss).backward()` are multiplied by the scale. Call
# `scaler.unscale_(optimizer)` first, then
# `torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)`, then `scaler.step(optimizer)`
# (it knows the gradients are already unscaled).
# </details>
#
# <details><summary>Hint 5: still failing?</summary>
#
# Read the checker's messages top to bottom: the first is usually the cause of the others.
# A message that starts `[bfloat16]` only applies to the bfloat16 run, and so on. The full answer
# is in `amp_tutorial/exercises/solutions/train_with_amp.py`.
# </details>

# %% [markdown]
# ## Check your function
#
# The checker does not read your source code. It runs your function and watches: whether autocast
# is on during each forward pass and off during backward, which tensor `backward()` is called on,
# whether gradients were zeroed before it (and not between it and the step), whether they changed
# before `unscale_`, who called `optimizer.step()` and how many times per iteration (one
# `backward()` to the next), whether each iteration ran `scaler.update()`, whether one GradScaler
# is kept for the whole run, and whether your loss history matches fp32 training of the same
# network (same seed, same data). Each message names what your code did. The first check after
# the kernel starts takes longest (9 s on an idle 2-core EPYC, up to a minute on a busy machine; a
# line says it is working), later ones about a second.

# %%
result = check_train_with_amp(train_with_amp)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# ## Train the course model with your function
#
# The quantized-sinusoid problem of lesson 03, cut into horizontal stripes so that one epoch is a
# few batches. Both runs start from the same weights (seed 0) and see the same batches; fp32 uses
# the plain loop `train_fp32` from the course package.

# %%
N_STRIPES = 4
inputs, targets = make_problem(preset.grid, info.device)
rows = preset.grid // N_STRIPES
data = [(inputs[..., i:i + rows, :], targets[..., i:i + rows, :])
        for i in range(0, preset.grid, rows)]
epochs = max(preset.steps // len(data), 2)
loss_fn = torch.nn.MSELoss()


def fresh_model_and_optimizer():
    model = seeded_conv_model(preset, info.device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


model, optimizer = fresh_model_and_optimizer()
fp32_history = train_fp32(model, data, optimizer, loss_fn, epochs)
model, optimizer = fresh_model_and_optimizer()
amp_history = train_with_amp(model, data, optimizer, loss_fn, epochs, info.type, info.amp_dtype)
amp_name = f"your AMP loop ({dtype_name(info.amp_dtype)})"
print(f"{len(data)} batches x {epochs} epochs on {info.device}")
print(f"final loss: fp32 {fp32_history[-1]:.4f}, {amp_name} {amp_history[-1]:.4f}")

# %%
fig = plot_losses({"fp32": fp32_history, amp_name: amp_history},
                  f"Your AMP loop vs fp32 on {info.type} ({preset.name} preset)", xlabel="epoch")
assert len(amp_history) == len(fp32_history) == epochs
assert amp_history[-1] < amp_history[0], "the AMP loss did not go down"
assert amp_history[-1] < 1.5 * fp32_history[-1] + 0.01, "AMP trained much worse than fp32"

# %% [markdown]
# The two curves should lie nearly on top of each other: mixed precision changes how each step is
# computed, not what the network learns. If yours drifts apart, re-read the checker's output.
#
# ## Quiz
#
# The quiz has 10 questions, each naming the lesson it covers. Questions 1 to 6 are about the loop
# you just wrote (lessons 01 and 02; the first three come from the exercise this lesson is based
# on), 7 to 10 about measuring, inference and checkpoints (lessons 03 to 05). Answer each with a
# letter in the `answers` dict below and run the next cell: it marks each answer, explains the ones
# you got right, and for a wrong one names the lesson and section to reread. Lessons 07 to 17
# have their own quiz, at the end of lesson 17.

# %%
display(Markdown(CORE_QUIZ.markdown()))

# %% tags=["exercise"] solution="quiz_answers.py"
# YOUR ANSWERS: one letter per question, e.g. {1: "a", ...}
answers = {1: None, 2: None, 3: None, 4: None, 5: None, 6: None,  # lessons 01-02
           7: None, 8: None, 9: None, 10: None}  # lessons 03-05

# %%
quiz = CORE_QUIZ.check(answers)
print(quiz)
assert quiz.all_correct, "not all answers are right yet: change them above and re-run"

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# Start from a loop the checker passes (yours, or the reference answer named above). The
# checker's problem is the same at every preset; the numbers below were measured on a CPU.
#
# 1. **Record the scaled loss.** In your `train_with_amp`, replace `loss.item()` with
#    `scaler.scale(loss).item()`. The checker names one problem, in every float16 run: "The
#    losses are about 6.55e+04 times a right answer's losses: that is the scaled loss." The
#    bfloat16 runs pass: a disabled scaler returns the loss unchanged, so in bf16 mode the course
#    model's curve does not move either (at `smoke`). In fp16 mode it starts at 18323 instead of
#    0.2796 at `smoke` (21919 instead of 0.3345 at `cpu`), 65536 times too large, and the plot
#    cell stops at "AMP trained much worse than fp32".
# 2. **Clip without unscaling.** Delete the `scaler.unscale_(optimizer)` line. Only the two
#    float16 runs that clip fail ("float16 + clipping", and the one whose `max_grad_norm` is above
#    the true gradient norm but far below the scaled one): "The gradients were changed (clipped?)
#    between backward and scaler.unscale_". Without clipping, `scaler.step` unscales by itself, so
#    the other runs pass, and the course model, trained without `max_grad_norm`, gives the same
#    losses to the last bit (at `smoke`, both modes).
#    Quiz question 4 says what this mistake does to SGD and to Adam.
# 3. **A new GradScaler every batch.** Move the `scaler = torch.amp.GradScaler(...)` line into the
#    batch loop. The checker counts one GradScaler object per batch in each float16 run ("12
#    different GradScaler objects" in the first: 3 epochs of 4 batches), yet the course model's
#    fp16 curve is the same as with one scaler, to the last bit at `smoke` and in every printed
#    digit at `cpu` (final loss 0.1524 and 0.0691): no step overflowed, so the right loop's scale
#    stayed at 65536 too. The bug shows only after an overflow, which a fresh scaler never
#    remembers, or after 2000 good steps, when it never grows. (The checker's "steps skipped" run
#    overflows on purpose: there the fresh scalers skip every step.)

# %% [markdown]
# ## What to remember
#
# - The AMP step, in order: zero grads; forward + loss under autocast; `scaler.scale(loss)
#   .backward()` outside it; `scaler.unscale_` before anything that reads gradients (clipping);
#   `scaler.step(optimizer)`; `scaler.update()`.
# - One loop serves fp16 and bf16: `GradScaler(device_type, enabled=amp_dtype == torch.float16)`.
# - Record `loss.item()`, the unscaled loss, so the history compares with fp32 training.
