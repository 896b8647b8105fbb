"""The reversal task: layout of an example, determinism, the loss mask and the accuracy."""

import pytest
import torch

from amp_tutorial.reversal_task import IGNORE_INDEX, ReversalTask, sequence_loss

TASK = ReversalTask(n_symbols=7, seq_len=10)


def test_an_example_is_prompt_separator_reversed_prompt():
    inputs, targets = TASK.batch(4, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (4, 10) and inputs.dtype == torch.long
    prompt = inputs[:, :5]
    assert ((prompt >= 0) & (prompt < 7)).all()
    assert (inputs[:, 5] == TASK.sep).all() and TASK.vocab_size == 8
    assert torch.equal(inputs[:, 6:], prompt.flip(1)[:, :4])  # teacher forcing: shifted answer
    assert torch.equal(targets[:, 5:], prompt.flip(1))  # every answer token is a target
    assert (targets[:, :5] == IGNORE_INDEX).all()  # the prompt is not


def test_same_seed_same_batches_other_seed_other_batches():
    a, b, c = TASK.batches(2, 3, seed=5), TASK.batches(2, 3, seed=5), TASK.batches(2, 3, seed=6)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], c[0][0])
    assert not torch.equal(a[0][0], a[1][0])  # consecutive batches differ


@pytest.mark.parametrize("seq_len", [0, 7])
def test_odd_or_empty_sequences_are_refused(seq_len):
    with pytest.raises(ValueError, match="even"):
        ReversalTask(4, seq_len)


def test_loss_looks_only_at_answer_tokens():
    inputs, targets = TASK.batch(2, torch.Generator().manual_seed(1))
    perfect = torch.nn.functional.one_hot(targets.clamp_min(0), TASK.vocab_size).float() * 50
    perfect[:, :5] = 0  # anything on prompt positions must not matter
    assert sequence_loss(perfect, targets).item() < 1e-6
    wrong = perfect.roll(1, dims=-1)
    assert sequence_loss(wrong, targets).item() > 10
