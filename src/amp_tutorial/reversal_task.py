"""A generated sequence task for the transformer: reverse a random string of symbols.

Nothing to download, deterministic for a given seed, and impossible to solve without attention:
the answer token at step i is the prompt token at position L-1-i. The transformer lessons and
``pdm run bench --model transformer`` train on it.

One example of ``seq_len`` input tokens (``L = seq_len // 2``)::

    inputs:  s0 s1 ... s(L-1) SEP r0 ... r(L-2)        r = reversed(s)
    targets: -- -- ...  --    r0  r1 ... r(L-1)        -- = IGNORE_INDEX (prompt: no loss)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from amp_tutorial.presets import Preset
from amp_tutorial.transformer import TransformerConfig

TRAIN_SEED = 0  # training batches
TEST_SEED = 1  # held-out sequences, never trained on
TEST_BATCHES = 4
IGNORE_INDEX = -100  # cross_entropy's default ignore_index: prompt positions carry no loss


@dataclass(frozen=True)
class ReversalTask:
    """Random strings of ``n_symbols`` symbols, followed by a separator and their reverse.
    """

    n_symbols: int
    seq_len: int  # tokens per model input; the prompt is seq_len // 2 symbols long

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.seq_len % 2:
            raise ValueError(f"seq_len must be even and at least 2, got {self.seq_len}")
        if self.n_symbols < 2:
            raise ValueError(f"n_symbols must be at least 2, got {self.n_symbols}")

    @property
    def sep(self) -> int:
        """The separator token id (one past the symbols)."""
        return self.n_symbols

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 1

    @property
    def prompt_len(self) -> int:
        return self.seq_len // 2

    def batch(self, batch_size: int, generator: torch.Generator,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``, both (batch_size, seq_len) int64 on ``device``.

        The symbols are drawn on the CPU from ``generator``, so a seed gives the same batch on
        every device.
        """
        length = self.prompt_len
        prompt = torch.randint(0, self.n_symbols, (batch_size, length), generator=generator)
        sep = torch.full((batch_size, 1), self.sep, dtype=torch.long)
        full = torch.cat([prompt, sep, prompt.flip(1)], dim=1)  # seq_len + 1 tokens
        inputs, targets = full[:, :-1].clone(), full[:, 1:].clone()
        targets[:, :length] = IGNORE_INDEX  # predicting the prompt itself is not the task
        return inputs.to(device), targets.to(device)

    def batches(self, n_batches: int, batch_size: int, seed: int,
                device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``n_batches`` batches from one seeded generator (a fixed training or test set)."""
        generator = torch.Generator().manual_seed(seed)
        return [self.batch(batch_size, generator, device) for _ in range(n_batches)]


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the answer positions (targets equal to IGNORE_INDEX are skipped).

    The logits are cast to float32 first: on CUDA, XPU and MPS ``cross_entropy`` is on no autocast
    list and calls ``log_softmax(x, dtype=x.dtype)``, whose explicit dtype autocast keeps, so a
    16-bit input would give 16-bit log-probabilities (CPU autocast lists ``cross_entropy_loss``
    itself). The kernels sum the exps in float32 either way; what 16 bits cost is the rounding of
    each log-probability and a backward run in 16 bits on the rounded values (lesson 12).
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                           ignore_index=IGNORE_INDEX)


def make_transformer_problem(
    preset: Preset, device: torch.device | str
) -> tuple[TransformerConfig, list[tuple[torch.Tensor, torch.Tensor]],
           list[tuple[torch.Tensor, torch.Tensor]]]:
    """The transformer's config, training batches (one per step) and held-out test batches.
    """
    sizes = preset.transformer
    task = ReversalTask(sizes.n_symbols, sizes.seq_len)
    config = TransformerConfig(task.vocab_size, sizes.seq_len, sizes.d_model, sizes.n_layers,
                               sizes.n_heads)
    train = task.batches(sizes.steps + sizes.warmup, sizes.batch, TRAIN_SEED, device)
    test = task.batches(TEST_BATCHES, sizes.batch, TEST_SEED, device)
    return config, train, test
