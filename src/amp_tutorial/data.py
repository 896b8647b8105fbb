"""The seed's problem: predict a quantized 2D sinusoid from pixel coordinates."""

from __future__ import annotations

import numpy as np
import torch

FREQUENCY = (4, 2)
N_BINS = 4


def generate_grid(size: int) -> np.ndarray:
    """A (2, size, size) array of x and y coordinates, each scaled to [0, 1].
    """
    if size < 2:
        raise ValueError(f"grid size must be at least 2, got {size}")
    axis = np.linspace(0.0, 1.0, size)
    xx, yy = np.meshgrid(axis, axis)
    return np.stack([xx, yy])


def quantized_sinusoid(
    grid: np.ndarray, frequency: tuple[float, float] = FREQUENCY, n_bins: int = N_BINS
) -> np.ndarray:
    """cos(2 pi fx x) + cos(2 pi fy y), cut into ``n_bins`` equal levels and scaled to [0, 1].

    The steps make the target discontinuous, which makes it harder to fit than a smooth wave.
    """
    if n_bins < 2:
        raise ValueError(f"n_bins must be at least 2, got {n_bins}")
    wave = np.cos(2 * np.pi * frequency[0] * grid[0]) + np.cos(2 * np.pi * frequency[1] * grid[1])
    edges = np.linspace(wave.min(), wave.max(), n_bins + 1)[1:-1]
    levels = np.digitize(wave, edges)  # integers 0 .. n_bins-1
    return levels / (n_bins - 1)


def make_problem(grid_size: int, device: torch.device | str = "cpu",
                 memory_format: torch.memory_format = torch.contiguous_format
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (1, 2, H, W) and targets (1, 1, H, W) as float32 tensors on ``device``.

    ``torch.channels_last`` stores them pixel by pixel (NHWC), the layout fast convolutions use.
    """
    grid = generate_grid(grid_size)
    target = quantized_sinusoid(grid)
    inputs = torch.tensor(grid, dtype=torch.float32).unsqueeze(0)
    targets = torch.tensor(target, dtype=torch.float32)[None, None]
    inputs = inputs.to(device).contiguous(memory_format=memory_format)
    targets = targets.to(device).contiguous(memory_format=memory_format)
    return inputs, targets
