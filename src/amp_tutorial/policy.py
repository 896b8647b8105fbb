"""Autocast's op policy, probed on the running device, told apart from ordinary type promotion.

Each op runs on small tensors twice per input case, with autocast disabled and enabled, under a
``TorchDispatchMode`` that records every dtype conversion (``aten._to_copy``) reaching the kernels.
Autocast's own decision is what changes between the two runs: the casts it inserts, a different
output dtype, or a call that works only with (or only without) autocast. An op whose output dtype
is the same either way (``bf16 + fp32 -> fp32`` is type promotion) is on no autocast list.

``SOURCE_POLICY`` holds what PyTorch's ``aten/src/ATen/autocast_mode.cpp`` and ``autocast_mode.h``
register for the probed ops on CPU and CUDA, so a lesson can compare the measurement on its device
with the source, and show the other device's lists as source, not measurement. ``header_rules``
reads the CUDA/XPU lists from the installed torch's ``include/ATen/autocast_mode.h``, so that the
CUDA column is checked without a GPU. Used by lesson 01 (and ``header_rules`` by lesson 07).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from amp_tutorial.device import dtype_name

# Autocast's cast policies (the names of autocast_mode.h's CastPolicy, in words), plus "no rule".
LOWERED = "lower precision"  # lower_precision_fp: float32 inputs are cast down
FP32 = "float32"  # fp32: low-precision inputs are cast up to float32
FP32_OUT = "float32 output dtype"  # fp32_set_opt_dtype: called with dtype=float32 unless given one
PROMOTE = "widest input"  # promote: mixed inputs are cast to the widest of them
BANNED = "refused"  # banned: raises under autocast (binary_cross_entropy on CUDA)
NO_RULE = "no rule"  # on no list: autocast changes nothing, the op's own dtype rules apply
RULES = (LOWERED, FP32, FP32_OUT, PROMOTE, BANNED, NO_RULE)

# Input cases: all float32, all low precision, the first input low and the rest float32, and
# low-precision inputs with an explicit dtype= argument (only for ops that take one).
CASES = ("fp32", "low", "mixed", "low, dtype=low")


@dataclass(frozen=True)
class Outcome:
    """One call: its output dtype (None if it raised), the error, and the dtype casts seen.

    Used in lessons 01, 11.
    """

    dtype: torch.dtype | None
    error: str | None
    casts: tuple[tuple[torch.dtype, torch.dtype], ...]

    def __str__(self) -> str:
        return "raises" if self.error else dtype_name(self.dtype)


@dataclass(frozen=True)
class Case:
    """The same call with autocast off and on.

    Used in lessons 01, 11.
    """

    off: Outcome
    on: Outcome

    @property
    def added_casts(self) -> Counter:
        """Casts seen with autocast on but not off: the ones autocast inserted."""
        return Counter(self.on.casts) - Counter(self.off.casts)

    @property
    def autocast_changed(self) -> bool:
        """True if enabling autocast changed anything: a cast, the output dtype, or an error."""
        return bool(self.added_casts) or self.on.dtype != self.off.dtype or (
            (self.on.error is None) != (self.off.error is None))

    def __str__(self) -> str:
        return f"{self.off} -> {self.on}"


@dataclass(frozen=True)
class OpPolicy:
    """What autocast did to one op, case by case, and the policy that explains it.

    Used in lessons 01, 11.
    """

    op: str
    aten: str  # the operator autocast registers (for the source lists)
    cases: dict[str, Case]
    verdict: str


@dataclass(frozen=True)
class _Op:
    aten: str
    n_inputs: int  # floating-point tensor inputs
    fn: Callable[..., torch.Tensor]
    takes_dtype: bool = False  # fn accepts dtype= (sum, cumsum, softmax, prod)


class _CastWatch(TorchDispatchMode):
    """Records the (from, to) dtype of every floating-point conversion dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") is not None:
            src = args[0].dtype
            if src.is_floating_point and src != kwargs["dtype"]:
                self.casts.append((src, kwargs["dtype"]))
        return func(*args, **kwargs)


def _ops(n: int) -> dict[str, _Op]:
    """The probed ops: name -> aten operator, float inputs, function (inputs n x n, in (0.1, 1))."""
    idx = torch.arange(2)

    def near(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return i.to(t.device)

    return {
        # lower_precision_fp on CPU and CUDA
        "matmul (a @ b)": _Op("aten::matmul", 2, lambda a, b: a @ b),
        "linear": _Op("aten::linear", 2, lambda a, b: F.linear(a, b)),
        "conv2d": _Op("aten::conv2d", 2, lambda a, b: F.conv2d(
            a.view(1, 1, n, n), b[:3, :3].reshape(1, 1, 3, 3))),
        "bmm": _Op("aten::bmm", 2, lambda a, b: torch.bmm(a[None], b[None])),
        # on no list anywhere: type promotion decides
        "add (a + b)": _Op("aten::add.Tensor", 2, lambda a, b: a + b),
        "mul (a * b)": _Op("aten::mul.Tensor", 2, lambda a, b: a * b),
        "relu": _Op("aten::relu", 1, F.relu),
        # fp32 on CUDA, no list on CPU
        "exp": _Op("aten::exp", 1, torch.exp),
        "log": _Op("aten::log", 1, torch.log),
        "pow": _Op("aten::pow.Tensor_Scalar", 1, lambda a: torch.pow(a, 2.5)),
        "layer_norm": _Op("aten::layer_norm", 1, lambda a: F.layer_norm(a, (n,))),
        # fp32 on both
        "mse_loss": _Op("aten::mse_loss", 2, F.mse_loss),
        # fp32 on CPU, banned on CUDA
        "binary_cross_entropy": _Op("aten::binary_cross_entropy", 2, F.binary_cross_entropy),
        # fp32_set_opt_dtype on CUDA; prod is fp32 on CPU, the others on no CPU list
        "sum": _Op("aten::sum", 1, lambda a, dtype=None: torch.sum(a, dtype=dtype), True),
        "cumsum": _Op("aten::cumsum", 1, lambda a, dtype=None: torch.cumsum(a, 0, dtype=dtype),
                      True),
        "softmax": _Op("aten::softmax.int", 1,
                       lambda a, dtype=None: F.softmax(a, dim=-1, dtype=dtype), True),
        "prod": _Op("aten::prod", 1, lambda a, dtype=None: torch.prod(a, dtype=dtype), True),
        # promote on CPU, no list on CUDA
        "cat": _Op("aten::cat", 2, lambda a, b: torch.cat([a, b])),
        "stack": _Op("aten::stack", 2, lambda a, b: torch.stack([a, b])),
        "index_copy": _Op("aten::index_copy", 2,
                          lambda a, b: a.index_copy(0, near(a, idx), b[:2])),
        # promote on CUDA, no list on CPU
        "addcmul": _Op("aten::addcmul", 2, lambda a, b: torch.addcmul(a, b, b)),
        "dot": _Op("aten::dot", 2, lambda a, b: torch.dot(a[0], b[0])),
        "index_put": _Op("aten::index_put", 2,
                         lambda a, b: a.index_put((near(a, idx),), b[:2])),
        "scatter_add": _Op("aten::scatter_add", 2, lambda a, b: a.scatter_add(
            0, near(a, torch.zeros(1, n, dtype=torch.long)), b[:1])),
    }


# What autocast_mode.cpp (CPU) and autocast_mode.h (CUDA's AT_FORALL_* lists) register for the ops
# above; read from pytorch/pytorch and the installed torch's include/ATen/autocast_mode.h (2.14).
# XPU registers the same AT_FORALL_* lists as CUDA, binary_cross_entropy banned too.
SOURCE_POLICY: dict[str, dict[str, str]] = {
    "cpu": {
        **dict.fromkeys(["matmul (a @ b)", "linear", "conv2d", "bmm"], LOWERED),
        **dict.fromkeys(["mse_loss", "binary_cross_entropy", "prod"], FP32),
        **dict.fromkeys(["cat", "stack", "index_copy"], PROMOTE),
        **dict.fromkeys(["add (a + b)", "mul (a * b)", "relu", "exp", "log", "pow", "layer_norm",
                         "sum", "cumsum", "softmax", "addcmul", "dot", "index_put",
                         "scatter_add"], NO_RULE),
    },
    "cuda": {
        **dict.fromkeys(["matmul (a @ b)", "linear", "conv2d", "bmm"], LOWERED),
        **dict.fromkeys(["exp", "log", "pow", "layer_norm", "mse_loss"], FP32),
        **dict.fromkeys(["sum", "cumsum", "softmax", "prod"], FP32_OUT),
        **dict.fromkeys(["addcmul", "dot", "index_put", "scatter_add"], PROMOTE),
        "binary_cross_entropy": BANNED,
        **dict.fromkeys(["add (a + b)", "mul (a * b)", "relu", "cat", "stack", "index_copy"],
                        NO_RULE),
    },
}
SOURCE_POLICY["xpu"] = dict(SOURCE_POLICY["cuda"])


def _call(fn: Callable[[], torch.Tensor], device_type: str, low: torch.dtype,
          enabled: bool) -> Outcome:
    watch = _CastWatch()
    try:
        with torch.autocast(device_type, dtype=low, enabled=enabled), watch:
            out = fn()
    except Exception as err:  # an op that raises is a result, not a crash
        return Outcome(None, f"{type(err).__name__}: {str(err).splitlines()[0]}",
                       tuple(watch.casts))
    return Outcome(out.dtype, None, tuple(watch.casts))


def _verdict(cases: dict[str, Case], low: torch.dtype) -> str:
    if any(c.on.error and not c.off.error for c in cases.values()):
        return BANNED
    full = cases["fp32"]
    if any(to == low for _, to in full.added_casts) or (full.on.dtype == low != full.off.dtype):
        return LOWERED
    if cases["low"].autocast_changed:
        given = cases.get("low, dtype=low")
        return FP32_OUT if given is not None and not given.autocast_changed else FP32
    mixed = cases.get("mixed")
    if mixed is not None and mixed.autocast_changed:
        return PROMOTE
    return NO_RULE


def autocast_policy(device_type: str, low: torch.dtype, n: int = 8) -> list[OpPolicy]:
    """Probe each op with autocast off and on, for each input case, and name the rule applied.

    Used in lessons 01, 11.
    """
    gen = torch.Generator().manual_seed(0)
    device = torch.device(device_type)
    rows = []
    for name, op in _ops(n).items():
        base = [(torch.rand(n, n, generator=gen) * 0.9 + 0.1).to(device)
                for _ in range(op.n_inputs)]
        inputs = {"fp32": base, "low": [t.to(low) for t in base]}
        if op.n_inputs > 1:
            inputs["mixed"] = [base[0].to(low), *base[1:]]
        calls = {case: partial(op.fn, *ts) for case, ts in inputs.items()}
        if op.takes_dtype:
            calls["low, dtype=low"] = partial(op.fn, *inputs["low"], dtype=low)
        cases = {case: Case(_call(fn, device_type, low, False), _call(fn, device_type, low, True))
                 for case, fn in calls.items()}
        rows.append(OpPolicy(name, op.aten, cases, _verdict(cases, low)))
    return rows


def registered_ops(rows: list[OpPolicy], device_type: str) -> dict[str, bool] | None:
    """Whether this torch build registers an autocast kernel for each op on ``device_type``.

    Reads the dispatcher (``torch._C._dispatch_has_kernel_for_dispatch_key``, a private API), so
    it works for CUDA's lists on a machine without a GPU; None where this torch lacks that API.

    Used in lesson 01.
    """
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if has_kernel is None:
        return None
    key = f"Autocast{device_type.upper()}"
    return {r.op: bool(has_kernel(r.aten, key)) for r in rows}


# The lists of autocast_mode.h that CUDA (and ROCm) and XPU register, with the rule of each.
# binary_cross_entropy's ban is registered in autocast_mode.cpp, so it is in none of them.
HEADER_LISTS = {
    "AT_FORALL_LOWER_PRECISION_FP": LOWERED,
    "AT_FORALL_FP32": FP32,
    "AT_FORALL_FP32_SET_OPT_DTYPE": FP32_OUT,
    "AT_FORALL_PROMOTE": PROMOTE,
}


def autocast_header() -> Path | None:
    """The installed torch's ``include/ATen/autocast_mode.h``; None where the build has none.

    Used in lessons 01, 07 through `header_rules`.
    """
    path = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    return path if path.is_file() else None


def header_rules(path: Path | None = None) -> dict[str, str] | None:
    """aten op ("sum", "softmax.int") -> rule, read from the ``AT_FORALL_*`` lists of the header.

    An entry ``_(name, overload)`` becomes ``name.overload``. None where there is no header.
    Used by lesson 01 to check ``SOURCE_POLICY``'s CUDA/XPU columns against the installed torch.

    Used in lessons 01 (through `header_policy`), 07.
    """
    path = path or autocast_header()
    if path is None:
        return None
    text = path.read_text()
    rules: dict[str, str] = {}
    for macro, rule in HEADER_LISTS.items():
        body = re.search(rf"#define {macro}\(_\)\s*\\\n((?:[^\n]*\\\n)*[^\n]*)", text)
        if body is None:
            raise ValueError(f"{macro} not found in {path}")
        for name, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body.group(1)):
            rules[f"{name}.{overload}" if overload else name] = rule
    return rules


def header_policy(rows: list[OpPolicy], path: Path | None = None) -> dict[str, str] | None:
    """The rule the header's CUDA/XPU lists give each probed op (its overload, else its name).

    Used in lesson 01.
    """
    rules = header_rules(path)
    if rules is None:
        return None
    found = {}
    for r in rows:
        full = r.aten.removeprefix("aten::")
        found[r.op] = rules.get(full, rules.get(full.split(".")[0], NO_RULE))
    return found


def policy_table(rows: list[OpPolicy], low: torch.dtype | None = None) -> list[dict[str, str]]:
    """Rows as plain dicts: each case as 'autocast off -> on', the casts autocast added, the rule.

    ``low`` names the low-precision dtype in the column headers (``low`` if not given).

    Used in lesson 01.
    """
    short = dtype_name(low) if low is not None else "low"
    headers = {"fp32": "fp32 in", "low": f"{short} in", "mixed": f"{short} + fp32 in",
               "low, dtype=low": f"{short} in, dtype={short}"}
    table = []
    for r in rows:
        added: Counter = Counter()
        for case in r.cases.values():
            added.update(case.added_casts)
        row = {"op": r.op}
        row.update({f"{headers[c]} (off -> on)": str(r.cases[c]) if c in r.cases else ""
                    for c in CASES})
        row["casts autocast added"] = ", ".join(
            f"{dtype_name(a)}->{dtype_name(b)} x{k}" for (a, b), k in sorted(
                added.items(), key=str)) or "none"
        row["autocast rule"] = r.verdict
        table.append(row)
    return table


def ops_by_rule(rows: list[OpPolicy]) -> dict[str, list[str]]:
    """Rule -> the probed ops that got it (every rule present, empty where none did).

    Used in lesson 01.
    """
    groups: dict[str, list[str]] = {rule: [] for rule in RULES}
    for r in rows:
        groups[r.verdict].append(r.op)
    return groups


def visible_promotions(rows: list[OpPolicy]) -> list[str]:
    """Promote-list ops whose mixed-dtype call raises with autocast off and works with it on.

    Used in lesson 01.
    """
    return [r.op for r in rows if r.verdict == PROMOTE and r.cases["mixed"].off.error
            and not r.cases["mixed"].on.error]


@dataclass(frozen=True)
class OpTrace:
    """One aten op as it actually ran: its name, the float dtypes it got and the dtype it gave.

    Used in lesson 11.
    """

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
    ``_to_copy`` casts it inserts and the dtype each kernel ran in (lesson 11). Pure view ops
    (transpose, split, ...) are left out.

    Used in lesson 11.
    """
    recorder = _DtypeRecorder()
    with recorder:
        fn()
    return recorder.ops
