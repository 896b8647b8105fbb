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
# Two or three sentences: what the learner will see measured, on which devices, and why it
# matters for AMP. Copy this file to `notebooks/NN_topic.py` (see CONTRIBUTING.md); the test suite
# skips this template because its name does not start with two digits.

# %%
import torch

from amp_tutorial.device import describe_device, select_device
from amp_tutorial.presets import get_preset

info = select_device()
preset = get_preset(device_type=info.type)
print(describe_device(info))
print(f"preset {preset.name!r}: {preset.description}")
torch.manual_seed(0)  # every run starts from the same numbers

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
# ## What to remember
#
# - Three to five bullets, each one a sentence that a cell above asserted.
