"""Helpers for the PyTorch AMP course: the plumbing the notebooks share, defined once and tested.

The lessons themselves (autocast blocks, GradScaler calls, training loops) stay in the notebooks;
this package holds device selection, presets, data, the model, measurement and plots.
"""

from amp_tutorial.data import generate_grid, make_problem, quantized_sinusoid
from amp_tutorial.device import DeviceInfo, DeviceNotAvailableError, describe_device, select_device
from amp_tutorial.measure import (
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
