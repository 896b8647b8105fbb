"""Helpers for the PyTorch AMP course: what the lessons import, defined once and tested.

The lessons themselves (autocast blocks, GradScaler calls, training loops) stay in the notebooks.
One module per job:

- ``device``: which device and AMP dtypes, and why a GPU that is there is not usable;
- ``presets``: problem sizes for a GPU, a laptop CPU and the test suite;
- ``data``, ``models``, ``reversal_task``, ``transformer``: the two course problems and models;
- ``steps``: one train or inference step, fp32 or AMP, with the scaler idiom the lessons teach;
- ``measure``, ``gradients``: time, memory, saved activations, profiler dtypes, gradient norms;
- ``autocast_policy``, ``attention``: autocast's op policy per device, SDPA's kernels;
- ``plots``: the shared figures;
- ``checkpoint``, ``nonfinite``: checkpoints with scaler state, inf/NaN hunting;
- ``exercise``, ``quiz``: the exercise checker and the quiz;
- ``profiler_logs``: keeps the profiler's C++ log lines (and cpp_extension's CUDA_HOME notice) out
  of a lesson's output (applied here, on import, before any lesson starts a profiler).

The course's own tools (the lab launcher, the handout, the lesson catalogue, swapping in answers)
are the ``course_tools`` package; the programs people run (the benchmark, the DDP training
script) are files in ``scripts/``. Neither is imported here or by a lesson.
"""

from amp_tutorial.data import generate_grid, make_problem, quantized_sinusoid
from amp_tutorial.device import DeviceInfo, DeviceNotAvailableError, describe_device, select_device
from amp_tutorial.measure import (
    StepTimer,
    Timing,
    peak_memory_bytes,
    reset_peak_memory,
    saved_bytes,
    synchronize,
    time_steps,
)
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import PRESETS, Preset, UnknownPresetError, get_preset
from amp_tutorial.profiler_logs import quiet_cuda_home_notice, quiet_kineto_logs

quiet_kineto_logs()  # kineto reads its log level once, when the process's first profiler starts
quiet_cuda_home_notice()  # torch.compile's C++ backend would log it to stderr without a GPU

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
    "saved_bytes",
    "select_device",
    "synchronize",
    "time_steps",
]
