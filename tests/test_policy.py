"""The live autocast policy probe classifies ops the way autocast treats them on this device."""

import torch

from amp_tutorial.policy import LOWERED, PROMOTED, RAISED, autocast_policy, policy_table


def test_cpu_bf16_policy():
    verdicts = {r.op: r.verdict for r in autocast_policy("cpu", torch.bfloat16)}
    assert verdicts["matmul (a @ b)"] == verdicts["conv2d"] == verdicts["linear"] == LOWERED
    assert verdicts["mse_loss"] == RAISED  # losses are computed in fp32
    assert verdicts["cat"] == PROMOTED  # mixed inputs widen
    assert verdicts["softmax"] != RAISED  # CPU leaves softmax in bf16 (CUDA does not)
    assert verdicts["add (a + b)"] not in (LOWERED, RAISED)


def test_table_rows_use_short_dtype_names():
    rows = policy_table(autocast_policy("cpu", torch.bfloat16))
    matmul = next(r for r in rows if r["op"] == "matmul (a @ b)")
    assert matmul["fp32 inputs ->"] == "bf16" and matmul["autocast"] == LOWERED
    relu = next(r for r in rows if r["op"] == "relu")
    assert relu["mixed inputs ->"] == ""  # unary op: no mixed-input probe
