"""The seed's network: 1x1 convolutions with BatchNorm and ReLU, a per-pixel MLP in conv form."""

from __future__ import annotations

import torch
from torch import nn


class ConvModel(nn.Module):
    """Conv(2->h)-BN-ReLU, ``n_hidden_layers`` x Conv(h->h)-BN-ReLU, Conv(h->1), all 1x1.

    Activations are large next to the weights, which is where AMP saves the most memory.

    Used in lessons 02, 03, 04, 05, 06, 07, 08, 09, 10, 12, 13.
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
