"""The shared train step: fp32 and AMP both learn, and the scaler path is exercised."""

import torch

from amp_tutorial.data import make_problem
from amp_tutorial.models import ConvModel
from amp_tutorial.reversal_task import ReversalTask
from amp_tutorial.steps import (
    make_inference_step,
    make_sequence_train_step,
    make_train_step,
    sequence_accuracy,
)
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig


def _train(amp_dtype=None, scaler=None, steps=15):
    torch.manual_seed(0)
    inputs, targets = make_problem(16)
    model = ConvModel(8, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = make_train_step(model, optimizer, inputs, targets, amp_dtype, scaler)
    return model, [step(i) for i in range(steps)]


def test_fp32_and_bf16_both_reduce_the_loss():
    _, fp32 = _train()
    _, bf16 = _train(torch.bfloat16)
    assert fp32[-1] < 0.7 * fp32[0]
    assert bf16[-1] < 0.7 * bf16[0]
    assert abs(fp32[0] - bf16[0]) < 0.02  # same start, same problem


def test_fp16_with_cpu_grad_scaler_trains_and_updates_scale():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
    _, losses = _train(torch.float16, scaler, steps=12)
    assert losses[-1] < losses[0]
    assert scaler.get_scale() > 2.0**10  # no overflow at this scale: it grew twice


def test_inference_step_is_eval_without_grad():
    model, _ = _train(steps=2)
    inputs, _ = make_problem(16)
    out = make_inference_step(model, inputs, torch.bfloat16)(0)
    assert not model.training
    assert out.dtype == torch.bfloat16 and not out.requires_grad


def test_sequence_step_learns_the_reversal_task_in_bf16():
    task = ReversalTask(n_symbols=5, seq_len=8)
    train, test = task.batches(40, 32, seed=0), task.batches(2, 32, seed=1)
    torch.manual_seed(0)
    model = DecoderTransformer(TransformerConfig(task.vocab_size, 8, 32, 2, 2))
    before = sequence_accuracy(model, test, torch.bfloat16)
    step = make_sequence_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3), train,
                                    torch.bfloat16)
    losses = [step(i) for i in range(40)]
    after = sequence_accuracy(model, test, torch.bfloat16)
    assert before < 0.5 < 0.9 <= after  # chance is 1/5; held-out sequences are reversed
    assert losses[-1] < losses[0] / 4
    assert model.training  # sequence_accuracy puts the model back in train mode
