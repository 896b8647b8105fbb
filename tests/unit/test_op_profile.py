import torch

from amp_tutorial.op_profile import op_counts


def test_counts_each_op_by_name() -> None:
    a, b = torch.randn(8, 4), torch.randn(4, 3)
    counts = op_counts(lambda: (a @ b, a @ b, torch.relu(a)))
    assert counts["aten::mm"] == 2
    assert counts["aten::relu"] == 1
    assert "aten::_scaled_mm" not in counts


def test_sees_the_fp8_matmul_and_not_a_plain_one() -> None:
    # torch >= 2.14 computes _scaled_mm on the CPU (e4m3fn inputs, per-tensor scales)
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).t()  # the second operand column-major
    one = torch.tensor(1.0)
    counts = op_counts(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    assert counts["aten::_scaled_mm"] == 1
    assert "aten::mm" not in counts
