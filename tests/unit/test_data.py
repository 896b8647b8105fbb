"""The quantized sinusoid: shapes, levels, and where the pattern is high and low."""

import numpy as np
import pytest
import torch

from amp_tutorial.data import generate_grid, make_problem, quantized_sinusoid


def test_grid_spans_unit_square():
    grid = generate_grid(5)
    assert grid.shape == (2, 5, 5)
    assert grid[0, 0, :].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]  # x varies along columns
    assert grid[1, :, 0].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]  # y varies along rows


def test_target_has_four_levels_in_unit_interval():
    target = quantized_sinusoid(generate_grid(64))
    assert np.allclose(np.unique(target), [0, 1 / 3, 2 / 3, 1])


def test_target_follows_the_cosines():
    grid = generate_grid(65)
    target = quantized_sinusoid(grid, frequency=(4, 2))
    assert target[0, 0] == 1.0  # cos(0) + cos(0) = 2: the top level
    # x = 1/8 (cos(pi) = -1) and y = 1/4 (cos(pi) = -1): the bottom level
    assert target[16, 8] == 0.0


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="at least 2"):
        generate_grid(1)
    with pytest.raises(ValueError, match="n_bins"):
        quantized_sinusoid(generate_grid(4), n_bins=1)


def test_make_problem_shapes_and_dtype():
    inputs, targets = make_problem(16, "cpu")
    assert inputs.shape == (1, 2, 16, 16) and targets.shape == (1, 1, 16, 16)
    assert inputs.dtype == targets.dtype == torch.float32


def test_make_problem_channels_last_keeps_values_and_shape():
    nchw, _ = make_problem(8)
    nhwc, targets = make_problem(8, memory_format=torch.channels_last)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    assert targets.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nchw, nhwc) and nhwc.shape == (1, 2, 8, 8)
