"""Helpers for the PyTorch AMP course: the plumbing the notebooks share, defined once and tested.

The lessons themselves (autocast blocks, GradScaler calls, training loops) stay in the notebooks.
One module per job:

- ``device``, ``gpu_access``: which device and AMP dtypes, and why a GPU is not usable;
- ``presets``: problem sizes for a GPU, a laptop CPU and the test suite;
- ``data``, ``models``, ``tasks``, ``transformer``: the two course problems and their models;
- ``training``: the train and inference steps the benchmark times;
- ``measure``, ``gradients``: time, memory, saved activations, profiler dtypes, gradient norms;
- ``policy``, ``attention``: autocast's op policy probed live, the dtypes ops ran in, SDPA kernels;
- ``plots``: the shared figures;
- ``checkpoint``, ``nonfinite``, ``ddp``: checkpoints with scaler state, inf/NaN hunting, DDP;
- ``exercise``, ``quiz``, ``solutions``: the exercise checker, the quiz, the reference answers
  swapped into exercise cells;
- ``bench``, ``lab``, ``handout``: the ``pdm run bench``, ``pdm run lab`` and ``pdm run handout``
  commands.
"""

from amp_tutorial.data import generate_grid, make_problem, quantized_sinusoid
from amp_tutorial.device import DeviceInfo, DeviceNotAvailableError, describe_device, select_device
from amp_tutorial.measure import (
    StepTimer,
    Timing,
    peak_memory_bytes,
    reset_peak_memory,
    saved_activation_bytes,
    synchronize,
    time_steps,
)
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import PRESETS, Preset, UnknownPresetError, get_preset

__all__ = [
    "PRESETS",
    "ConvModel",
    "DeviceInfo",
    "DeviceNotAvailableError",
    "Preset",
    "StepTimer",
    "Timing",
    "UnknownPresetError",
    "describe_device",
    "generate_grid",
    "get_preset",
    "make_problem",
    "peak_memory_bytes",
    "quantized_sinusoid",
    "reset_peak_memory",
    "saved_activation_bytes",
    "select_device",
    "synchronize",
    "time_steps",
]
