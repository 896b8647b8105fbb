"""The course's models: the seed's ConvModel (1x1 convolutions with BatchNorm and ReLU, a per-pixel
MLP in conv form), and both of the course's models with a batch of their data (``course_models``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from amp_tutorial.data import make_problem
from amp_tutorial.presets import Preset
from amp_tutorial.reversal_task import make_transformer_problem, sequence_loss
from amp_tutorial.transformer import DecoderTransformer

SEED = 0  # every model starts from the same weights


class ConvModel(nn.Module):
    """Conv(2->h)-BN-ReLU, ``n_hidden_layers`` x Conv(h->h)-BN-ReLU, Conv(h->1), all 1x1.

    Activations are large next to the weights, which is where AMP saves the most memory.
    """

    def __init__(self, hidden: int = 256, n_hidden_layers: int = 2, in_channels: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width_in = in_channels
        for _ in range(n_hidden_layers + 1):
            layers += [nn.Conv2d(width_in, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU()]
            width_in = hidden
        layers.append(nn.Conv2d(hidden, 1, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def seeded_conv_model(preset: Preset, device: torch.device | str, seed: int = SEED) -> ConvModel:
    """A ConvModel at the preset's sizes on ``device``, initialised from ``seed``: the same
    weights on every call with the same seed."""
    torch.manual_seed(seed)
    return ConvModel(preset.hidden, preset.n_hidden_layers).to(device)


class ModelCase(NamedTuple):
    """One of the course's two models with one batch of its data: a fresh, seeded model from
    ``make`` (same weights every call), ``inputs``, ``targets`` and its loss function.
    """

    make: Callable[[], torch.nn.Module]
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def course_models(preset: Preset, device: torch.device | str) -> dict[str, ModelCase]:
    """The ConvModel on its image (channels-last, as the benchmark runs it) and the decoder-only
    transformer on the first training batch of the reversal task, at the preset's sizes.
    """
    image_in, image_target = make_problem(preset.grid, device, torch.channels_last)
    config, train, _ = make_transformer_problem(preset, device)
    tokens, token_targets = train[0]

    def make_conv() -> torch.nn.Module:
        return seeded_conv_model(preset, device).to(memory_format=torch.channels_last)

    def make_transformer() -> torch.nn.Module:
        torch.manual_seed(SEED)
        return DecoderTransformer(config).to(device)

    return {
        "ConvModel": ModelCase(make_conv, image_in, image_target, torch.nn.functional.mse_loss),
        "transformer": ModelCase(make_transformer, tokens, token_targets, sequence_loss),
    }
