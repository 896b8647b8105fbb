"""Autocast's op policy, read off the running device instead of copied from a table.

Each op runs under autocast twice: once on float32 inputs (does autocast lower it?) and once on
low-precision inputs (does autocast raise it to float32?). What comes out is the policy, on this
device and this torch version; CPU and CUDA policies differ (softmax, for one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from amp_tutorial.device import dtype_name

LOWERED = "lowered"  # float32 in -> low precision out: autocast casts it down
RAISED = "float32"  # low precision in -> float32 out: autocast runs it in float32
PROMOTED = "widest"  # mixed inputs -> the widest input type
UNCHANGED = "input dtype"  # no autocast rule: the op runs in whatever dtype it gets


@dataclass(frozen=True)
class OpPolicy:
    op: str
    from_fp32: torch.dtype  # output dtype when fed float32 tensors
    from_low: torch.dtype  # output dtype when fed low-precision tensors
    from_mixed: torch.dtype | None  # output dtype for one low and one float32 input, if binary
    verdict: str


def _ops(n: int) -> dict[str, tuple[int, Callable[..., torch.Tensor]]]:
    """Ops to probe: name -> (number of tensor inputs, function). Inputs are n x n, in (0.1, 1)."""
    return {
        "matmul (a @ b)": (2, lambda a, b: a @ b),
        "linear": (2, lambda a, b: F.linear(a, b)),
        "conv2d": (2, lambda a, b: F.conv2d(a.view(1, 1, n, n), b[:3, :3].reshape(1, 1, 3, 3))),
        "bmm": (2, lambda a, b: torch.bmm(a[None], b[None])),
        "add (a + b)": (2, lambda a, b: a + b),
        "mul (a * b)": (2, lambda a, b: a * b),
        "relu": (1, F.relu),
        "exp": (1, torch.exp),
        "log": (1, torch.log),
        "pow": (1, lambda a: torch.pow(a, 2.5)),
        "sum": (1, torch.sum),
        "softmax": (1, lambda a: F.softmax(a, dim=-1)),
        "layer_norm": (1, lambda a: F.layer_norm(a, (n,))),
        "mse_loss": (2, F.mse_loss),
        "cross_entropy": (1, lambda a: F.cross_entropy(a, torch.zeros(n, dtype=torch.long,
                                                                       device=a.device))),
        "cat": (2, lambda a, b: torch.cat([a, b])),
        "stack": (2, lambda a, b: torch.stack([a, b])),
        "addcmul": (2, lambda a, b: torch.addcmul(a, a, b)),
    }


def autocast_policy(device_type: str, low: torch.dtype, n: int = 8) -> list[OpPolicy]:
    """Probe each op in ``_ops`` under ``torch.autocast(device_type, dtype=low)``."""
    gen = torch.Generator().manual_seed(0)
    device = torch.device(device_type)
    rows = []
    for name, (arity, fn) in _ops(n).items():
        base = [(torch.rand(n, n, generator=gen) * 0.9 + 0.1).to(device) for _ in range(arity)]
        with torch.autocast(device_type, dtype=low):
            out32 = fn(*base).dtype
            out_low = fn(*[t.to(low) for t in base]).dtype
            mixed = fn(base[0].to(low), base[1]).dtype if arity == 2 else None
        if out32 == low:
            verdict = LOWERED
        elif out_low == torch.float32:
            verdict = RAISED
        elif mixed == torch.float32:
            verdict = PROMOTED
        else:
            verdict = UNCHANGED
        rows.append(OpPolicy(name, out32, out_low, mixed, verdict))
    return rows


def policy_table(rows: list[OpPolicy]) -> list[dict[str, str]]:
    """Rows as plain dicts with short dtype names, ready for a DataFrame or a printout."""
    return [
        {
            "op": r.op,
            "fp32 inputs ->": dtype_name(r.from_fp32),
            "low inputs ->": dtype_name(r.from_low),
            "mixed inputs ->": dtype_name(r.from_mixed) if r.from_mixed else "",
            "autocast": r.verdict,
        }
        for r in rows
    ]


@dataclass(frozen=True)
class OpTrace:
    """One aten op as it actually ran: its name, the float dtypes it got and the dtype it gave."""

    op: str
    inputs: tuple[str, ...]
    output: str


class _DtypeRecorder(TorchDispatchMode):
    """Records every aten op below autocast, so the casts autocast inserts show up as ops."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpTrace] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        ins = tuple(dtype_name(t.dtype) for t in flat_in if t.is_floating_point())
        outs = [dtype_name(t.dtype) for t in flat_out if t.is_floating_point()]
        if outs and name not in ("detach", "view", "t", "transpose", "split", "unsafe_view",
                                 "_unsafe_view", "expand", "reshape", "clone", "alias"):
            self.ops.append(OpTrace(name, ins, outs[0]))
        return out


def trace_dtypes(fn: Callable[[], object]) -> list[OpTrace]:
    """Run ``fn()`` and return the floating-point aten ops it executed, in order, with dtypes.

    A ``TorchDispatchMode`` sits below autocast, so it sees what autocast decided: the
    ``_to_copy`` casts it inserts and the dtype each kernel ran in (lesson 08). Pure view ops
    (transpose, split, ...) are left out.
    """
    recorder = _DtypeRecorder()
    with recorder:
        fn()
    return recorder.ops
