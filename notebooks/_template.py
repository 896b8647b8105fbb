# ---
# jupyter:
#   amp_tutorial:
#     minutes: {}
#     needs: any device, CPU included
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
# # NN · Title: the one question this lesson answers
#
# Two or three sentences, in the second person and the present tense: what you will see
# measured, on which devices, and why it matters for AMP. Copy this file to
# `notebooks/NN_topic.py` (see CONTRIBUTING.md, "Writing guide"); the test suite skips this
# template because its name does not start with two digits.
#
# **Prerequisites:** lessons 01 (autocast) and 02 (gradient scaling): name the earlier lessons
# this one builds on, and what it takes from each.

# %%
import torch

from amp_tutorial.device import device_line, select_device
from amp_tutorial.presets import get_preset

info = select_device()
preset = get_preset(device_type=info.type)
torch.manual_seed(0)  # every run starts from the same numbers
print(device_line(info, preset))  # the device line: one line, details on request

# %% [markdown]
# ## 1. One section per question
#
# Say what the next cell shows before it runs. Keep the AMP lines (autocast, the scaler calls,
# the loop) in the cell; measurement and plumbing come from `amp_tutorial`.

# %%
x = torch.randn(8, 8, device=info.device)
with torch.autocast(device_type=info.type, dtype=info.amp_dtype):
    y = x @ x
print(f"x @ x under autocast -> {y.dtype}")
assert y.dtype == info.amp_dtype  # assert what the text says, on the running device

# %% [markdown]
# ## Try it
#
# Two or three short open exercises. Each changes one thing in a cell above, asks you to predict
# the outcome before you run it, and names what you should see.
#
# 1. **Change the op.** In section 1, replace `x @ x` with `x + x`. Which dtype comes out? You
#    should see `torch.float32`: `add` is on none of autocast's lists, so it runs in the dtype of
#    its inputs.
# 2. **Switch autocast off.** Pass `enabled=False` to `torch.autocast`. You should see
#    `torch.float32` for `x @ x` too: with autocast off, nothing is cast.

# %% [markdown]
# ## What to remember
#
# - Three to five bullets, each one a sentence that a cell above asserted.

# %% [markdown]
# ## Sources
#
# One line per source: the PyTorch source file or documentation page a fact of this lesson rests
# on, pinned to the torch version the lesson was checked with, and what it supports.
#
# - [`aten/src/ATen/autocast_mode.h`](https://github.com/pytorch/pytorch/blob/v2.14.1/aten/src/ATen/autocast_mode.h)
#   and [`autocast_mode.cpp`](https://github.com/pytorch/pytorch/blob/v2.14.1/aten/src/ATen/autocast_mode.cpp):
#   `mm` is on the lower-precision list of every device, `add` on none.
# - [torch.amp, Autocast Op Reference](https://docs.pytorch.org/docs/stable/amp.html#autocast-op-reference):
#   the same lists, per device, as documented.
