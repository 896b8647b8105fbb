"""amp_tutorial.kernels: which ops have a kernel of their own per device (issue 33: MPS's
``_mps_linear``, so "linear not lowered" failed there in lessons 12 and 17)."""

from __future__ import annotations

import torch

from amp_tutorial.autocast_policy import trace_dtypes
from amp_tutorial.kernels import has_device_kernel, yaml_dispatch_keys


def test_linear_has_its_own_kernel_on_mps_only() -> None:
    registry = torch._C._dispatch_has_kernel_for_dispatch_key
    assert registry("aten::linear", "CompositeImplicitAutograd")  # the body every device shares
    assert not registry("aten::linear", "CPU") and registry("aten::addmm", "CPU")
    assert "MPS" in yaml_dispatch_keys("aten::linear")
    found = {d: has_device_kernel("aten::linear", d) for d in ("cpu", "cuda", "xpu", "mps")}
    assert found == {"cpu": False, "cuda": False, "xpu": False, "mps": True}
    if not torch.backends.mps.is_built():  # so MPS's answer came from the yaml, not the registry
        assert not registry("aten::linear", "MPS")
    # a structured op: its kernels are its .out delegate's
    assert has_device_kernel("aten::addmm", "cpu") and has_device_kernel("aten::addmm", "mps")
    assert yaml_dispatch_keys("aten::no_such_op") is None


def test_where_linear_has_no_kernel_a_dispatch_mode_sees_addmm() -> None:
    # the CPU branch run for real: what lesson 12's trace looks for there
    ops = [t.op for t in trace_dtypes(lambda: torch.nn.Linear(4, 4)(torch.randn(2, 4)))]
    assert "addmm" in ops and "linear" not in ops
