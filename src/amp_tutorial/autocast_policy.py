"""Autocast's op policy, probed per device, told apart from ordinary type promotion.

Each op runs on small tensors twice per input case, with autocast disabled and enabled, under a
``TorchDispatchMode`` that records every dtype conversion (``aten._to_copy``) reaching the kernels.
Autocast's own decision is what changes between the two runs: the casts it inserts, a different
output dtype, or a call that works only with (or only without) autocast. An op whose output dtype
is the same either way (``bf16 + fp32 -> fp32`` is type promotion) is on no autocast list.

A device that is not here (CUDA/ROCm, XPU, MPS on a CPU-only machine) is probed through the same
dispatcher with fake tensors: ``FakeTensorMode`` tensors that carry the device but no data, with
that device's autocast switched on by ``torch.set_autocast_enabled``/``set_autocast_dtype``
(``torch.autocast("cuda")`` turns itself off where CUDA is absent). An op whose fake call cannot
run there is answered from the dispatcher's registry of ``Autocast<device>`` kernels instead.

``SOURCE_POLICY`` holds what PyTorch's ``aten/src/ATen/autocast_mode.cpp`` and ``autocast_mode.h``
register for the probed ops per device. ``header_rules`` reads the CUDA/XPU lists from the
installed torch's ``include/ATen/autocast_mode.h``.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from amp_tutorial.device import available_devices, dtype_name
from amp_tutorial.measure import SavedBytes, saved_bytes, synchronize

# Autocast's cast policies (the names of autocast_mode.h's CastPolicy, in words), plus "no rule".
LOWERED = "lower precision"  # lower_precision_fp: float32 inputs are cast down
FP32 = "float32"  # fp32: low-precision inputs are cast up to float32
FP32_OUT = "float32 output dtype"  # fp32_set_opt_dtype: called with dtype=float32 unless given one
PROMOTE = "widest input"  # promote: mixed inputs are cast to the widest of them
BANNED = "refused"  # banned: raises under autocast (binary_cross_entropy on CUDA)
NO_RULE = "no rule"  # on no list: autocast changes nothing, the op's own dtype rules apply
HAS_RULE = "has a rule (not run)"  # registry only: an Autocast<device> kernel, its policy unseen
RULES = (LOWERED, FP32, FP32_OUT, PROMOTE, BANNED, NO_RULE, HAS_RULE)

# How an op was probed on a device: on the device itself, on fake tensors of that device through
# the real dispatcher, or (where the fake call cannot run) from the registry of autocast kernels.
REAL_DEVICE = "real device"
FAKE_TENSORS = "fake tensors"
REGISTRY = "dispatcher registry"

# Input cases: all float32, all low precision, the first input low and the rest float32, and
# low-precision inputs with an explicit dtype= argument (only for ops that take one).
CASES = ("fp32", "low", "mixed", "low, dtype=low")


@dataclass(frozen=True)
class Outcome:
    """One call: its output dtype (None if it raised), the error, and the dtype casts seen.
    """

    dtype: torch.dtype | None
    error: str | None
    casts: tuple[tuple[torch.dtype, torch.dtype], ...]

    def __str__(self) -> str:
        return "raises" if self.error else dtype_name(self.dtype)


@dataclass(frozen=True)
class Case:
    """The same call with autocast off and on.
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
    """

    op: str
    aten: str  # the operator autocast registers (for the source lists)
    cases: dict[str, Case]
    verdict: str
    how: str = REAL_DEVICE  # REAL_DEVICE, FAKE_TENSORS or REGISTRY


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
    """The probed ops: name -> aten operator, float inputs, function (inputs n x n, in (0.1, 1)).

    Written with methods, not ``[]`` (indexing and ``.to("mps")`` fail on fake MPS/XPU tensors),
    and index tensors are made on the input's device.
    """

    def idx(t: torch.Tensor) -> torch.Tensor:
        return torch.arange(2, device=t.device)

    return {
        # lower_precision_fp on every device
        "matmul (a @ b)": _Op("aten::matmul", 2, lambda a, b: a @ b),
        "linear": _Op("aten::linear", 2, lambda a, b: F.linear(a, b)),
        "conv2d": _Op("aten::conv2d", 2, lambda a, b: F.conv2d(
            a.view(1, 1, n, n), b.narrow(0, 0, 3).narrow(1, 0, 3).reshape(1, 1, 3, 3))),
        "bmm": _Op("aten::bmm", 2, lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0))),
        # on no list anywhere: type promotion decides
        "add (a + b)": _Op("aten::add.Tensor", 2, lambda a, b: a + b),
        "mul (a * b)": _Op("aten::mul.Tensor", 2, lambda a, b: a * b),
        "relu": _Op("aten::relu", 1, F.relu),
        # fp32 on CUDA and MPS, no list on CPU
        "exp": _Op("aten::exp", 1, torch.exp),
        "log": _Op("aten::log", 1, torch.log),
        "pow": _Op("aten::pow.Tensor_Scalar", 1, lambda a: torch.pow(a, 2.5)),
        "layer_norm": _Op("aten::layer_norm", 1, lambda a: F.layer_norm(a, (n,))),
        # fp32 on MPS only (BatchNorm in training, batch statistics); group_norm on CUDA too
        "batch_norm": _Op("aten::batch_norm", 1, lambda a: F.batch_norm(
            a.unsqueeze(0), None, None, training=True)),
        "group_norm": _Op("aten::group_norm", 1, lambda a: F.group_norm(a.unsqueeze(0), 2)),
        # fp32 everywhere
        "mse_loss": _Op("aten::mse_loss", 2, F.mse_loss),
        # fp32 on CPU, banned on CUDA, no list on MPS
        "binary_cross_entropy": _Op("aten::binary_cross_entropy", 2, F.binary_cross_entropy),
        # fp32_set_opt_dtype on CUDA, fp32 on MPS; prod is fp32 on CPU, the others on no CPU list
        "sum": _Op("aten::sum", 1, lambda a, dtype=None: torch.sum(a, dtype=dtype), True),
        "cumsum": _Op("aten::cumsum", 1, lambda a, dtype=None: torch.cumsum(a, 0, dtype=dtype),
                      True),
        "softmax": _Op("aten::softmax.int", 1,
                       lambda a, dtype=None: F.softmax(a, dim=-1, dtype=dtype), True),
        "prod": _Op("aten::prod", 1, lambda a, dtype=None: torch.prod(a, dtype=dtype), True),
        # promote on CPU, no list on CUDA or MPS
        "cat": _Op("aten::cat", 2, lambda a, b: torch.cat([a, b])),
        "stack": _Op("aten::stack", 2, lambda a, b: torch.stack([a, b])),
        "index_copy": _Op("aten::index_copy", 2,
                          lambda a, b: a.index_copy(0, idx(a), b.narrow(0, 0, 2))),
        # promote on CUDA and MPS, no list on CPU
        "addcmul": _Op("aten::addcmul", 2, lambda a, b: torch.addcmul(a, b, b)),
        "dot": _Op("aten::dot", 2, lambda a, b: torch.dot(a.select(0, 0), b.select(0, 0))),
        "index_put": _Op("aten::index_put", 2,
                         lambda a, b: a.index_put((idx(a),), b.narrow(0, 0, 2))),
        "scatter_add": _Op("aten::scatter_add", 2, lambda a, b: a.scatter_add(
            0, torch.zeros(1, n, dtype=torch.long, device=a.device), b.narrow(0, 0, 1))),
    }


# What autocast_mode.cpp (CPU, MPS) and autocast_mode.h (CUDA's AT_FORALL_* lists) register for
# the ops above; read from pytorch/pytorch and the installed torch's include/ATen/autocast_mode.h.
# XPU registers the same AT_FORALL_* lists as CUDA, binary_cross_entropy banned too. MPS has its
# own list in autocast_mode.cpp: it registers sum, cumsum, softmax and prod as plain fp32 (an
# explicit dtype= does not stop the cast up), batch_norm as fp32, and nothing for
# binary_cross_entropy, cat, stack or index_copy.
SOURCE_POLICY: dict[str, dict[str, str]] = {
    "cpu": {
        **dict.fromkeys(["matmul (a @ b)", "linear", "conv2d", "bmm"], LOWERED),
        **dict.fromkeys(["mse_loss", "binary_cross_entropy", "prod"], FP32),
        **dict.fromkeys(["cat", "stack", "index_copy"], PROMOTE),
        **dict.fromkeys(["add (a + b)", "mul (a * b)", "relu", "exp", "log", "pow", "layer_norm",
                         "batch_norm", "group_norm", "sum", "cumsum", "softmax", "addcmul", "dot",
                         "index_put", "scatter_add"], NO_RULE),
    },
    "cuda": {
        **dict.fromkeys(["matmul (a @ b)", "linear", "conv2d", "bmm"], LOWERED),
        **dict.fromkeys(["exp", "log", "pow", "layer_norm", "group_norm", "mse_loss"], FP32),
        **dict.fromkeys(["sum", "cumsum", "softmax", "prod"], FP32_OUT),
        **dict.fromkeys(["addcmul", "dot", "index_put", "scatter_add"], PROMOTE),
        "binary_cross_entropy": BANNED,
        **dict.fromkeys(["add (a + b)", "mul (a * b)", "relu", "batch_norm", "cat", "stack",
                         "index_copy"], NO_RULE),
    },
    "mps": {
        **dict.fromkeys(["matmul (a @ b)", "linear", "conv2d", "bmm"], LOWERED),
        **dict.fromkeys(["exp", "log", "pow", "layer_norm", "batch_norm", "group_norm",
                         "mse_loss", "sum", "cumsum", "softmax", "prod"], FP32),
        **dict.fromkeys(["addcmul", "dot", "index_put", "scatter_add"], PROMOTE),
        **dict.fromkeys(["add (a + b)", "mul (a * b)", "relu", "binary_cross_entropy", "cat",
                         "stack", "index_copy"], NO_RULE),
    },
}
SOURCE_POLICY["xpu"] = dict(SOURCE_POLICY["cuda"])

# The torch releases whose lists SOURCE_POLICY holds, each with where it was read. Typed from
# 2.14.1's autocast_mode.cpp/.h; 2.9.0 and 2.11.0 register the same lists for these ops (their
# installed autocast_mode.h for CUDA/XPU, their dispatcher's Autocast<device> kernels for every
# device, and the probe; checked 2026-11-26), so they share the table.
SOURCE_POLICIES: dict[tuple[int, int], tuple[str, dict[str, dict[str, str]]]] = {
    (2, 14): ("2.14.1", SOURCE_POLICY),
    (2, 11): ("2.11.0", SOURCE_POLICY),
    (2, 9): ("2.9.0", SOURCE_POLICY),
}


def source_policy(version: str) -> tuple[str, dict[str, dict[str, str]]] | None:
    """(the release read, its lists) for torch ``version``'s minor release; None where the course
    has read no source for it (then only the dispatcher and the header can be compared).
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    return SOURCE_POLICIES.get((int(match[1]), int(match[2]))) if match else None


@contextmanager
def autocast_flags(device_type: str, low: torch.dtype, enabled: bool = True) -> Iterator[None]:
    """Set a device's autocast switch and dtype as ``torch.autocast`` does, then restore them.

    For a device that is not here: ``torch.autocast("cuda")`` turns itself off without CUDA.
    """
    before = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, low)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()  # as torch.autocast does on leaving its outermost block
        torch.set_autocast_enabled(device_type, before[0])
        torch.set_autocast_dtype(device_type, before[1])


def _own_gpu_context(original: Callable[[torch.device], None]) -> Callable[[torch.device], None]:
    """``fake_tensor.init_gpu_context`` as torch 2.14 has it: a fake ``cuda`` or ``xpu`` tensor
    starts that device's runtime only where that device is present. torch 2.9 and 2.11 start it
    whenever *a* GPU is (``torch.cuda.is_available() or torch.xpu.is_available()``), so on a CUDA
    machine the first fake XPU tensor asks a runtime the build lacks and raises "Torch not
    compiled with XPU enabled" (seen on an H100 with torch 2.11.0+cu130).
    """
    def init(device: torch.device) -> None:
        if device.type in available_devices():
            original(device)
    return init


def _unbuilt_device_types() -> frozenset[str]:
    """Device types this torch build has no runtime for, whose fake tensors still exist."""
    unbuilt = set()
    if not torch.backends.mps.is_built():
        unbuilt.add("mps")
    if not getattr(torch._C, "_has_xpu", False):
        unbuilt.add("xpu")
    return frozenset(unbuilt)


class _NoAutogradOnUnbuilt(TorchFunctionMode):
    """Every op gets fake tensors of a device type this build lacks (MPS and XPU on a Linux
    CUDA or CPU build) detached: autograd on them asks the device's guard, which this build does
    not have, and C++ then *terminates the process* ("PyTorch is not linked with support for mps
    devices", thrown where no exception may pass) instead of raising. A learner's
    ``q.requires_grad_()``, ``t.requires_grad = True`` or ``torch.zeros(..., requires_grad=True)``
    inside a simulated run would otherwise kill the kernel. Only dtypes are judged on fake
    tensors, and those do not depend on autograd."""

    def __init__(self, device_types: frozenset[str]) -> None:
        super().__init__()
        self.device_types = device_types

    def _strip(self, value: object) -> object:
        if (isinstance(value, torch.Tensor) and value.requires_grad
                and value.device.type in self.device_types):
            return value.detach()
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        if (func is torch.Tensor.requires_grad_ and isinstance(args[0], torch.Tensor)
                and args[0].device.type in self.device_types):
            return args[0]  # left as it was: no autograd on these tensors
        device = kwargs.get("device")
        if (kwargs.get("requires_grad") and device is not None
                and torch.device(device).type in self.device_types):
            kwargs["requires_grad"] = False  # a factory call making one of them
        args, kwargs = tree_map(self._strip, args), tree_map(self._strip, kwargs)
        return func(*args, **kwargs)


@contextmanager
def fake_tensors() -> Iterator[FakeTensorMode]:
    """``FakeTensorMode``, without the error log it writes for every call that raises inside it,
    with fake tensors of a device that is not here kept off the GPU that is
    (``_own_gpu_context``), and with no autograd on fake tensors of a device type the build
    lacks (``_NoAutogradOnUnbuilt``: it would abort the process).
    """
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, original = log.level, fake_tensor.init_gpu_context
    log.setLevel(logging.CRITICAL)  # a failing call is a probe result, reported in its row
    fake_tensor.init_gpu_context = _own_gpu_context(original)
    unbuilt = _unbuilt_device_types()
    try:
        with (FakeTensorMode() as mode,
              _NoAutogradOnUnbuilt(unbuilt) if unbuilt else nullcontext()):
            yield mode
    finally:
        fake_tensor.init_gpu_context = original
        log.setLevel(level)


def _call(fn: Callable[[], torch.Tensor], device_type: str, low: torch.dtype,
          enabled: bool, fake: bool) -> Outcome:
    watch = _CastWatch()  # sees each op before FakeTensorMode, which stays at the stack's bottom
    switch = (autocast_flags(device_type, low, enabled) if fake
              else torch.autocast(device_type, dtype=low, enabled=enabled))
    try:
        with switch, watch:
            out = fn()
    except Exception as err:  # an op that raises is a result, not a crash
        return Outcome(None, f"{type(err).__name__}: {str(err).splitlines()[0]}",
                       tuple(watch.casts))
    return Outcome(out.dtype, None, tuple(watch.casts))


def _verdict(cases: dict[str, Case], low: torch.dtype) -> str:
    # A call that raises only with autocast on is autocast's refusal only where the op itself runs
    # in the low dtype: torch 2.9's fake CUDA conv2d raises in bf16 with autocast off too (its
    # kernel asks the absent driver), and there the casts autocast inserted decide.
    runs_low = cases["low"].off.error is None
    if runs_low and any(c.on.error and not c.off.error for c in cases.values()):
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


def autocast_policy(device_type: str, low: torch.dtype, n: int = 8,
                    how: str = "auto") -> list[OpPolicy]:
    """Probe each op with autocast off and on, for each input case, and name the rule applied.

    ``how``: ``REAL_DEVICE``, ``FAKE_TENSORS``, or "auto" (the device if it is here, else fake
    tensors of it). An op whose fake call cannot run is read from the registry (``REGISTRY``).
    Each row's ``how`` says which.
    """
    if how == "auto":
        how = REAL_DEVICE if device_type in available_devices() else FAKE_TENSORS
    if how not in (REAL_DEVICE, FAKE_TENSORS):
        raise ValueError(f"how must be 'auto', {REAL_DEVICE!r} or {FAKE_TENSORS!r}, got {how!r}")
    fake = how == FAKE_TENSORS
    gen = torch.Generator().manual_seed(0)
    device = torch.device(device_type)
    rows = []
    with fake_tensors() if fake else nullcontext():
        for name, op in _ops(n).items():
            if fake:  # no data, only dtypes and devices (.to("mps") fails on a fake MPS tensor)
                base = [torch.empty(n, n, device=device) for _ in range(op.n_inputs)]
            else:
                base = [(torch.rand(n, n, generator=gen) * 0.9 + 0.1).to(device)
                        for _ in range(op.n_inputs)]
            inputs = {"fp32": base, "low": [t.to(low) for t in base]}
            if op.n_inputs > 1:
                inputs["mixed"] = [base[0].to(low), *base[1:]]
            calls = {case: partial(op.fn, *ts) for case, ts in inputs.items()}
            if op.takes_dtype:
                calls["low, dtype=low"] = partial(op.fn, *inputs["low"], dtype=low)
            cases = {case: Case(_call(fn, device_type, low, False, fake),
                                _call(fn, device_type, low, True, fake))
                     for case, fn in calls.items()}
            rows.append(OpPolicy(name, op.aten, cases, _verdict(cases, low), how))
    return [_from_registry(r, device_type) if r.cases["fp32"].off.error else r for r in rows]


def _from_registry(row: OpPolicy, device_type: str) -> OpPolicy:
    """A row whose op cannot run here at all: its rule is whether the registry lists a kernel."""
    registered = has_autocast_kernel(row.aten, device_type)
    if registered is None:  # this torch cannot say: leave the row as probed (errors and all)
        return row
    return OpPolicy(row.op, row.aten, row.cases, HAS_RULE if registered else NO_RULE, REGISTRY)


def has_autocast_kernel(aten: str, device_type: str) -> bool | None:
    """Whether the dispatcher has an ``Autocast<device>`` kernel for ``aten`` (e.g.
    ``"aten::batch_norm"``), i.e. a rule on that device; None where torch lacks the private API.
    """
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if has_kernel is None:
        return None
    return bool(has_kernel(aten, f"Autocast{device_type.upper()}"))


def registered_ops(rows: list[OpPolicy], device_type: str) -> dict[str, bool] | None:
    """Whether this torch build registers an autocast kernel for each op on ``device_type``.

    Reads the dispatcher (``torch._C._dispatch_has_kernel_for_dispatch_key``, a private API), so
    it works for CUDA's lists on a machine without a GPU; None where this torch lacks that API.
    """
    found = {r.op: has_autocast_kernel(r.aten, device_type) for r in rows}
    return None if None in found.values() else found


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
    """
    path = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    return path if path.is_file() else None


def header_rules(path: Path | None = None) -> dict[str, str] | None:
    """aten op ("sum", "softmax.int") -> rule, read from the ``AT_FORALL_*`` lists of the header.

    An entry ``_(name, overload)`` becomes ``name.overload``. None where there is no header.
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
    """
    groups: dict[str, list[str]] = {rule: [] for rule in RULES}
    for r in rows:
        groups[r.verdict].append(r.op)
    return groups


def visible_promotions(rows: list[OpPolicy]) -> list[str]:
    """Promote-list ops whose mixed-dtype call raises with autocast off and works with it on.
    """
    return [r.op for r in rows if r.verdict == PROMOTE and r.cases["mixed"].off.error
            and not r.cases["mixed"].on.error]


@dataclass(frozen=True)
class OpTrace:
    """One aten op as it actually ran: its name, the float dtypes it got and the dtype it gave;
    with ``trace_dtypes(where=...)`` also where it ran (e.g. a module's name) and its wall time.
    """

    op: str
    inputs: tuple[str, ...]
    output: str
    where: str = ""
    seconds: float = 0.0  # wall time of the kernel call, device synchronised (``timed=True``)


class _DtypeRecorder(TorchDispatchMode):
    """Records every aten op below autocast, so the casts autocast inserts show up as ops."""

    def __init__(self, where: Callable[[], str] | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.ops: list[OpTrace] = []
        self.where = where
        self.device = device  # None: not timed

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if self.device is not None:
            synchronize(self.device)
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if self.device is not None:
            synchronize(self.device)
        seconds = time.perf_counter() - start if self.device is not None else 0.0
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        ins = tuple(dtype_name(t.dtype) for t in flat_in if t.is_floating_point())
        outs = [dtype_name(t.dtype) for t in flat_out if t.is_floating_point()]
        if outs and name not in ("detach", "view", "t", "transpose", "split", "unsafe_view",
                                 "_unsafe_view", "expand", "reshape", "clone", "alias"):
            where = self.where() if self.where is not None else ""
            self.ops.append(OpTrace(name, ins, outs[0], where, seconds))
        return out


def trace_dtypes(fn: Callable[[], object], where: Callable[[], str] | None = None,
                 timed_on: torch.device | str | None = None) -> list[OpTrace]:
    """Run ``fn()`` and return the floating-point aten ops it executed, in order, with dtypes.

    A ``TorchDispatchMode`` sits below autocast, so it sees what autocast decided: the
    ``_to_copy`` casts it inserts and the dtype each kernel ran in. Pure view ops
    (transpose, split, ...) are left out. ``where()``, if given, is asked at each op for a label
    (the check-up passes the running module's name); ``timed_on`` times each kernel call with
    that device synchronised before and after.
    """
    recorder = _DtypeRecorder(where, torch.device(timed_on) if timed_on is not None else None)
    with recorder:
        fn()
    return recorder.ops


def trace_module(module: torch.nn.Module, *inputs: torch.Tensor) -> list[OpTrace]:
    """``trace_dtypes`` of ``module(*inputs)``, each op tagged with the submodule that ran it
    ("attn.qkv"; "" for code in ``module``'s own forward, such as a residual add). Forward hooks
    name the running module; they are removed before this returns.
    """
    names = {m: n for n, m in module.named_modules()}
    stack: list[str] = []

    def enter(mod: torch.nn.Module, _args: object) -> None:
        stack.append(names[mod])

    def leave(_mod: torch.nn.Module, _args: object, _out: object) -> None:
        stack.pop()

    handles = [h for m in names for h in (m.register_forward_pre_hook(enter),
                                          m.register_forward_hook(leave))]
    try:
        return trace_dtypes(lambda: module(*inputs), where=lambda: stack[-1] if stack else "")
    finally:
        for handle in handles:
            handle.remove()


# A child process tries one autograd op on a fake tensor of the device: where this torch build
# has no device guard for it (mps, xpu, or cuda in a CPU-only build), that aborts the process.
_FAKE_AUTOGRAD_CHECK = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    torch.empty(2, device={device_type!r}, requires_grad=True).exp()
    torch.empty(2, device={device_type!r}).uniform_()  # a model's random init
"""


def _fake_random_problem(device_type: str) -> str | None:
    """None if a layer's random init runs on fake ``device_type`` tensors, else the error: on
    torch 2.9 fake ``uniform_`` runs its Python decomposition, which starts the real CUDA
    generator, so a CUDA build without a driver raises (2.11 and 2.14 do not; probed here).
    """
    try:
        with fake_tensors():
            torch.empty(2, device=device_type).uniform_()
    except RuntimeError as err:  # torch.AcceleratorError is one
        return str(err).splitlines()[0]
    return None


@cache
def fake_autograd_problem(device_type: str) -> str | None:
    """None if autograd and a model's random init run on fake ``device_type`` tensors here, else
    why not (a child's error): fake CUDA needs a CUDA build of torch (a GPU is not needed; on
    torch 2.9 a driver is, for the random init); a CPU-only build has none.

    Autograd asks the device's guard for a stream for every tensor it records; without the guard
    that is a C++ terminate, which no ``except`` can catch, so the try runs in a subprocess
    (unless the device is here, or it is CUDA in a CUDA build, which works without a GPU).
    """
    if device_type in available_devices() or (
            device_type == "cuda" and torch.backends.cuda.is_built()):  # a GPU-less CUDA build too
        return _fake_random_problem(device_type)
    done = subprocess.run([sys.executable, "-c", _FAKE_AUTOGRAD_CHECK.format(
        device_type=device_type)], capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return None
    lines = done.stderr.splitlines()
    what = [line.split("what():")[-1] for line in lines if "what():" in line] or lines[-1:]
    return what[0].strip() if what else f"exit status {done.returncode}"


def saved_bytes_on(
    device_type: str,
    build_model: Callable[[], torch.nn.Module],
    make_batch: Callable[[torch.device], tuple[torch.Tensor, torch.Tensor]],
    low: torch.dtype | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.mse_loss,
) -> SavedBytes:
    """Bytes autograd saves for ``loss_fn(build_model()(inputs), targets)`` under
    ``device_type``'s autocast policy with ``low`` (None: autocast off), on fake tensors.

    No such device is needed: the model and batch are built on fake tensors of ``device_type``
    and counted by ``measure.saved_bytes``. Sizes are what the meta kernels say (on
    fake CPU under autocast, batch_norm's saved mean and inverse std come out in the input dtype,
    float32 for real). Raises RuntimeError where autograd cannot run on that fake device in this
    torch build (MPS and XPU in a CUDA or CPU build).
    """
    reason = fake_autograd_problem(device_type)
    if reason is not None:
        raise RuntimeError(f"autograd cannot run on fake {device_type} tensors in this torch "
                           f"build ({reason}); count on a {device_type} machine instead")
    device = torch.device(device_type)
    with fake_tensors(), device:
        model = build_model()
        inputs, targets = make_batch(device)
        with autocast_flags(device_type, low) if low is not None else nullcontext():
            return saved_bytes(lambda: loss_fn(model(inputs), targets), model)
