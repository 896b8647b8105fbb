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


def test_trace_dtypes_sees_the_casts_autocast_inserts():
    from amp_tutorial.policy import trace_dtypes

    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        traced = trace_dtypes(lambda: torch.nn.functional.layer_norm(layer(x), (4,)))
    ops = [(t.op, t.output) for t in traced]
    assert ("_to_copy", "bf16") in ops  # the weight and the input cast down
    assert ("addmm", "bf16") in ops  # the linear ran in bf16
    assert ops[-1] == ("native_layer_norm", "bf16")  # on CPU layer_norm keeps its input dtype
    plain = trace_dtypes(lambda: layer(x))  # no autocast: no casts, fp32 throughout
    assert all(t.output == "fp32" for t in plain) and "_to_copy" not in [t.op for t in plain]
