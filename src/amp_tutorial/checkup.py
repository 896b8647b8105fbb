"""An AMP check-up of your own model: which dtype, whether it needs a scaler, where fp16 would
overflow or bf16 round a signal away, whether AMP agrees with fp32, and what AMP gains here.

``amp_checkup(model, batch, loss_fn)`` runs your own training step a bounded number of times in
fp32 and under autocast, each from the same weights (restored afterwards: your model is left as
it was), and puts the course's instruments behind one call: the dtype trace of
``autocast_policy.trace_dtypes`` (grouped by module), ``nonfinite.first_nonfinite_module``
and, below autocast, each op that makes inf/NaN out of finite inputs (``OpOverflow``: an
overflow inside a module, seen even where the module's output is finite),
``measure.saved_bytes`` and ``StepTimer``, and ``ceiling.matmul_ceiling``. Nothing of
the model leaves the process: this module sends nothing to the class service.

Any model and batch go in; ``batch_loss`` is the one rule for turning them into the loss:

- ``batch`` a dict: ``model(**batch)`` (Hugging Face's ``input_ids``, ``attention_mask``,
  ``labels``); a tuple or list: ``(inputs..., targets)`` with a ``loss_fn``, ``model(*inputs)``
  and ``loss_fn(output, targets)``, else ``model(*batch)``; anything else: ``model(batch)``.
- the loss: ``loss_fn(output, targets)`` (a dict or a single tensor batch is the targets)
  where one is given, with the output as the model returned it (a tensor, a named tuple, a
  dict); else the output's own: ``output.loss`` (a ``ModelOutput``), ``output["loss"]``, the
  first item of a tuple when it is a 0-dim tensor, or the output itself when it is 0-dim.
- or ``step(model, batch) -> loss``, your own forward and loss, for anything else.

Integer tensors (token ids) are never cast; ``batch_to(batch, device)`` moves a nested batch.
What cannot be checked (a forward that raises under autocast, a batch past the memory there is,
an output with no loss and no ``loss_fn``) is one plain line: ``amp_checkup`` raises
``CheckupError`` with it, and ``checkup(...)`` returns it as a ``NotChecked`` report instead.

Command line: ``python -m amp_tutorial.checkup my_module:make`` where ``make()`` returns
``(model, batch, loss_fn)``, ``(model, batch)`` or a dict of ``amp_checkup``'s arguments;
``--json`` prints the report as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from amp_tutorial.autocast_policy import OpTrace, trace_dtypes
from amp_tutorial.ceiling import Ceiling, matmul_ceiling
from amp_tutorial.device import (
    DTYPE_ENV,
    DeviceInfo,
    dtype_name,
    fp32_baseline,
    select_device,
    tf32_state,
)
from amp_tutorial.interleave import (
    BLOCKS,
    MIN_BLOCKS,
    Interleaved,
    PairedComparison,
    interleave,
)
from amp_tutorial.measure import (
    SavedBytes,
    StepTimer,
    busy,
    free_memory,
    peak_memory_bytes,
    reset_peak_memory,
    saved_bytes,
    why_noisy,
)
from amp_tutorial.nonfinite import first_nonfinite_module
from amp_tutorial.steps import _amp_train_step

FP16_MAX = torch.finfo(torch.float16).max  # 65504: larger values become inf
FP16_TINY = torch.finfo(torch.float16).tiny  # 2**-14, the smallest normal fp16
FP16_SMALLEST = 2.0**-24  # the smallest subnormal fp16: anything below rounds to zero
MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}  # stored fraction bits
ROUNDING_LIMIT = 0.5  # a rounding step above half the sample-to-sample spread loses the signal
AGREEMENT = {torch.float16: 0.02, torch.bfloat16: 0.05}  # relative difference called agreement
MIN_UPDATES = 2  # applied AMP updates compared with fp32's before agreement is judged
# fp32's own spread: its loss curve rerun from weights nudged by one rounding step of the AMP
# dtype (its unit roundoff, a random sign per weight), NUDGES times. Where fp32 itself moves by
# more than AGREEMENT from so small a change (a tiny batch, Adam's sign-like first steps, a
# model near a cliff), the curves are judged against SPREAD_FACTOR times that spread instead.
NUDGES = 2
# Loss curves are compared relative to fp32's loss, but never to less than this share of fp32's
# first loss: a loss trained to near 0 would make any rounding look like a 100% gap
LOSS_FLOOR = 0.01
SPREAD_FACTOR = 2
# A limit wider than this share of the loss says nothing: where fp32's own spread asks for it,
# fp32 cannot tell AMP's rounding from its own, and the curves are not judged ("cannot judge")
MAX_LOSS_TOLERANCE = 0.5
INIT_SCALE = 2.0**16  # GradScaler's default init_scale
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
# The ops cuBLAS computes as GEMMs, whose fp32 ``torch.backends.cuda.matmul``'s TF32 setting
# governs; under CUDA autocast a Linear shows up as addmm/mm (``linear`` is a composite there:
# ``amp_tutorial.kernels``), convolutions are cuDNN's and follow ``cudnn.conv`` instead.
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "matmul",
                      "linear"})
MODEL = "(model)"  # the model's own forward, outside its submodules
OUTSIDE = ("(loss)", "(step)", "(backward)")  # op labels outside the model's forward
Batch = object  # a tensor, or tuples, lists and dicts of them (and of other values)
LossFn = Callable[[object, object], torch.Tensor]  # loss_fn(output, targets)
StepFn = Callable[[nn.Module, object], torch.Tensor]  # step(model, batch) -> loss


class CheckupError(ValueError):
    """The check-up cannot run on this input; the message says why in one plain line."""


@dataclass(frozen=True)
class NotChecked:
    """What ``checkup`` returns where the check-up cannot run: one plain line saying what
    happened and what to try (``line``), and the error's type (``error``), never a traceback."""

    line: str
    error: str  # e.g. "RuntimeError", or "CheckupError" for input the check-up refused

    agrees = False  # nothing was compared

    def text(self) -> str:
        return f"not checked: {self.line}"

    def as_dict(self) -> dict[str, object]:
        return {"not_checked": self.line, "error": self.error}

    def __str__(self) -> str:
        return self.text()


def batch_to(batch: Batch, device: torch.device | str, dtype: torch.dtype | None = None
             ) -> Batch:
    """``batch`` with every tensor in it moved to ``device`` and, if ``dtype`` is given, every
    floating tensor cast to it; integer tensors (token ids, class labels) keep their dtype.
    Tuples (named ones too), lists and dicts are rebuilt; other values are kept as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, dtype if dtype is not None and batch.is_floating_point()
                        else batch.dtype)
    if isinstance(batch, Mapping):
        items = {k: batch_to(v, device, dtype) for k, v in batch.items()}
        try:
            return type(batch)(items)
        except TypeError:  # a Mapping that cannot be built from a dict
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(batch_to(v, device, dtype) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(batch_to(v, device, dtype) for v in batch)
    return batch


def _split(batch: Batch, loss_fn: LossFn | None
           ) -> tuple[tuple[object, ...], dict[str, object], object]:
    """How the model is called on ``batch`` and what ``loss_fn`` gets as targets: the rule of
    the module docstring, as ``(args, kwargs, targets)``."""
    if isinstance(batch, Mapping):
        return (), dict(batch), batch
    if isinstance(batch, (tuple, list)):
        if loss_fn is None:
            return tuple(batch), {}, None
        if len(batch) < 2:
            raise CheckupError(f"a {type(batch).__name__} batch with a loss_fn is (inputs..., "
                               f"targets), and this one has {len(batch)} item(s): pass "
                               "(inputs, targets), or a dict for keyword arguments")
        return tuple(batch[:-1]), {}, batch[-1]
    return (batch,), {}, batch


def _tensors_in(value: object) -> list[torch.Tensor]:
    """Every tensor in a nested value: tensors, tuples (named ones too), lists, dicts (a
    ``ModelOutput`` is one) and dataclasses."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    elif is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in fields(value)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _paths(value: object, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of a batch: ``input_ids``, ``[0]``, ``[1][label]``."""
    if isinstance(value, torch.Tensor):
        return [(prefix or "batch", value)]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _paths(v, f"{prefix}[{k!r}]" if prefix
                                                             else str(k))]
    if isinstance(value, (tuple, list)):
        return [p for i, v in enumerate(value) for p in _paths(v, f"{prefix}[{i}]")]
    return []


def output_loss(output: object) -> torch.Tensor | None:
    """The loss a model's output carries, or None: ``output.loss`` (a Hugging Face
    ``ModelOutput``, a dataclass), ``output["loss"]``, the first item of a tuple when it is a
    0-dim tensor (``return_dict=False``), or the output itself when it is a 0-dim tensor."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    if (isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor)
            and output[0].dim() == 0):
        return output[0]
    return None


def _describe(output: object) -> str:
    """``a dict (keys: logits)``, ``a GoogLeNetOutputs (fields: logits, aux1)``, ``a Tensor``."""
    names = (list(output.keys()) if isinstance(output, Mapping) else
             list(output._fields) if hasattr(output, "_fields") else
             [f.name for f in fields(output)] if is_dataclass(output) else [])
    kind, name = "keys" if isinstance(output, Mapping) else "fields", type(output).__name__
    listed = f" ({kind}: {', '.join(map(str, names))})" if names else ""
    return ("an " if name[0] in "AEIOUaeiou" else "a ") + name + listed


def _no_loss(output: object) -> CheckupError:
    return CheckupError(
        f"the model returned {_describe(output)} with no loss in it, and no loss_fn was given: "
        "pass loss_fn=(output, targets) -> loss with the batch as (inputs, targets), or "
        "step=(model, batch) -> loss; a model that computes its own loss (Hugging Face's) needs "
        "its labels in the batch (e.g. labels=input_ids)")


def batch_loss(model: nn.Module, batch: Batch, loss_fn: LossFn | None = None, *,
               step: StepFn | None = None) -> torch.Tensor:
    """The loss of ``model`` on ``batch``, by the rule of the module docstring: ``step(model,
    batch)`` if given, else the model called on the batch and ``loss_fn(output, targets)``, or
    the loss the output carries (``output_loss``). Raises CheckupError where there is none."""
    if step is not None:
        return step(model, batch)
    args, kwargs, targets = _split(batch, loss_fn)
    output = model(*args, **kwargs)
    if loss_fn is not None:
        return loss_fn(output, targets)
    loss = output_loss(output)
    if loss is None:
        raise _no_loss(output)
    return loss


def _flat(output: object) -> torch.Tensor:
    """Every floating tensor of a model's output (a ``ModelOutput``'s logits, a named tuple's
    main and auxiliary outputs) as one fp32 vector, to compare fp32's with AMP's. A loss the
    output carries is left out where there is more (the loss curves compare it): one number of
    size ~1 beside small logits would otherwise dilute their difference (BERT's, 30x)."""
    loss = None if isinstance(output, torch.Tensor) else output_loss(output)
    tensors = [t for t in _tensors_in(output) if t.is_floating_point()]
    tensors = [t for t in tensors if t is not loss] or tensors
    flat = [t.detach().float().flatten() for t in tensors]
    return torch.cat(flat) if flat else torch.zeros(0)


def _output_of(model: nn.Module, run: Callable[[], object]) -> torch.Tensor:
    """``_flat`` of what the model's forward returned (its last call) while ``run()`` ran: the
    output of a ``step(model, batch)``. A step whose loss wants train-mode outputs may raise in
    eval mode after the model returned (GoogLeNet's auxiliary outputs): the output is kept."""
    seen: list[object] = []
    handle = model.register_forward_hook(lambda _m, _a, out: seen.append(out))
    try:
        run()
    except Exception:
        if not seen:
            raise
    finally:
        handle.remove()
    if not seen:
        raise CheckupError("step(model, batch) never called the model: call model(...) in it")
    return _flat(seen[-1])


def checkup(model: nn.Module, batch: Batch, loss_fn: LossFn | None = None, *,
            step: StepFn | None = None, **options: object) -> Checkup | NotChecked:
    """``amp_checkup`` for a notebook or a script: the report, or, where the check-up cannot
    run, a ``NotChecked`` whose one line says what happened and what to try (no traceback).
    ``options`` are ``amp_checkup``'s (``dtype``, ``steps``, ``ceiling``, ...)."""
    device = _device_of(model) if isinstance(model, nn.Module) else torch.device("cpu")
    try:
        return amp_checkup(model, batch, loss_fn, step=step, **options)
    except CheckupError as err:
        # the line only: the error's traceback (and the tensors its frames hold) is let go here
        result = NotChecked(str(err), type(err.__cause__ or err).__name__)
    free_memory(device)
    return result


@dataclass(frozen=True)
class ModuleRange:
    """One module's output and output-gradient magnitudes in the fp32 step, against the AMP
    dtype's limits."""

    module: str
    type: str
    act_max: float  # largest |output| in fp32
    grad_max: float  # largest |d loss / d output| in fp32
    grad_below_tiny: float  # share of nonzero output gradients below fp16's smallest normal
    grad_below_smallest: float  # share below fp16's smallest subnormal: zero in fp16 unscaled
    rounding: float  # the AMP dtype's rounding step at the typical value / spread over samples
    overflows_fp16: bool
    rounds_signal_away: bool
    returns_tuple: bool = False  # the module returns a tuple (an LSTM's (output, (h, c)))


@dataclass(frozen=True)
class OpOverflow:
    """An op inside the model's forward that made inf or NaN out of finite inputs under
    autocast, where the same op in the fp32 forward made none: an overflow inside a module
    (attention scores ``q @ k.T``, a hand-written norm's ``h * h``), seen even where the
    module's own output comes out finite."""

    module: str  # the innermost running module, or MODEL for the model's own forward
    op: str  # the aten op, e.g. "bmm", "mul", "_to_copy" (autocast's cast of a large input)
    dtype: str  # the dtype it gave
    n_inf: int
    n_nan: int

    def __str__(self) -> str:
        where = "the model's own forward" if self.module == MODEL else self.module
        return (f"{self.op} in {where} made {self.n_inf} inf and {self.n_nan} NaN in "
                f"{self.dtype} out of finite inputs")


class _NonfiniteOps(TorchDispatchMode):
    """Below autocast, every op whose floating inputs were all finite and whose output is not,
    labelled by ``where()`` (the running module); each (module, op) once, in order. Ops that
    return uninitialised memory (``empty``) are left out."""

    def __init__(self, where: Callable[[], str]) -> None:
        super().__init__()
        self.where = where
        self.found: dict[tuple[str, str], OpOverflow] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
               and t.is_floating_point() and t.device.type != "meta"]
        finite = all(bool(t.isfinite().all()) for t in ins)  # before: an in-place op writes them
        out = func(*args, **(kwargs or {}))
        if finite and "empty" not in name:
            bad = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
                   and t.is_floating_point() and t.device.type != "meta"
                   and not bool(t.isfinite().all())]
            key = (self.where(), name)
            if bad and key not in self.found:
                self.found[key] = OpOverflow(key[0], name, dtype_name(bad[0].dtype),
                                             sum(int(t.isinf().sum()) for t in bad),
                                             sum(int(t.isnan().sum()) for t in bad))
        return out


@dataclass(frozen=True)
class Advice:
    """One line to write, and the finding it answers."""

    line: str
    why: str


@dataclass
class Checkup:
    """What ``amp_checkup`` found; ``as_dict()`` for JSON, the ``*_rows`` for tables."""

    device: str
    amp_dtype: str  # the dtype checked
    dtype_why: str
    recommended: str  # the device's preferred AMP dtype, and why
    grad_scaler: bool
    tf32: str
    ops: list[OpTrace]
    ranges: list[ModuleRange]
    scale_needed: float | None  # smallest power of two lifting 99% of gradients to fp16 normals
    scale_max: float | None  # the largest scale before the largest gradient overflows fp16
    skipped_steps: list[bool]  # per AMP step: the GradScaler skipped it (gradients overflowed)
    final_scale: float | None  # the GradScaler's scale after the AMP steps
    losses: dict[str, list[float]]
    output_max_abs_diff: float
    output_rel_diff: float
    loss_rel_gap: float
    agrees: bool
    first_nonfinite: str | None
    timing_ms: dict[str, float]
    timing_iqr_ms: dict[str, float]
    peak_bytes: dict[str, int | None]
    # per mode: what one forward + loss saved for backward (activations, autocast's weight copies)
    saved: dict[str, SavedBytes]
    ceiling: dict[str, object]
    ceiling_ratio: float | None  # None where the matmul ratio bounds nothing (ceiling_why)
    # ops inside the forward that overflowed under autocast (not in fp32), first first
    op_overflows: list[OpOverflow] = field(default_factory=list)
    init_scale: float | None = INIT_SCALE  # the GradScaler's first scale (fp16)
    advice: list[Advice] = field(default_factory=list)
    # the largest relative gap of fp32's loss curve rerun from nudged weights (NUDGES runs)
    fp32_spread: float = 0.0
    # the fp32 output from the initial weights is all zeros (a zero-initialised head, as
    # torchvision's ViT has): the outputs then say nothing, the loss curves judge alone
    outputs_all_zero: bool = False
    # why the AMP dtype's matmul ratio is no ceiling here (emulated, or noise), or None
    ceiling_why: str | None = None
    # per mode: the share of its timed steps' wall time its threads waited for a CPU
    # (``measure.Timing.wait_share``; None where it was not measured)
    timing_wait_share: dict[str, float | None] = field(default_factory=dict)
    # where every low dtype is only emulated (a CPU without avx512_bf16 or AMX): why fp32 is
    # the fast choice there, and AMP a check for the device it will run on; else None
    fp32_faster: str | None = None
    # fp32 against AMP from steps that took turns, fp32 run twice as the A/A control
    # (``interleave``); None in a report built without it (the medians' rule then judges)
    speed: PairedComparison | None = None

    @property
    def loss_tolerance(self) -> float:
        """The loss curves' agreement limit: AGREEMENT for the dtype, or SPREAD_FACTOR times
        fp32's own spread where that is larger."""
        base = AGREEMENT[torch.float16 if self.amp_dtype == "fp16" else torch.bfloat16]
        return max(base, SPREAD_FACTOR * self.fp32_spread)

    @property
    def flagged(self) -> list[str]:
        """Modules whose range or precision the AMP dtype cannot hold (fp16 overflow of an
        output, or of an op inside it under autocast, or a rounding step larger than the
        signal); a module inside one already flagged is not named again."""
        found = self.range_flagged
        for module in self.overflow_modules:
            if module not in found and not any(module.startswith(f + ".") for f in found):
                found.append(module)
        return found

    @property
    def range_flagged(self) -> list[str]:
        """The modules ``flagged`` for their fp32 output's range or rounding (``ranges``). The
        model itself (MODEL) only where none of its modules is: its output is the output of
        one of them (a head past 65504), so keeping that module in fp32 is the one line."""
        low = self.amp_dtype
        found = [r.module for r in self.ranges if self.ran_low(r.module)
                 and ((r.overflows_fp16 and low == "fp16") or r.rounds_signal_away)]
        return [m for m in found if m != MODEL] or found

    @property
    def overflow_modules(self) -> list[str]:
        """The modules in which an op overflowed under autocast (``op_overflows``), in order:
        the model's own forward (MODEL) included, the loss and the step's own code not."""
        return list(dict.fromkeys(o.module for o in self.op_overflows
                                  if o.module not in OUTSIDE))

    @property
    def updates_compared(self) -> int:
        """Applied AMP updates behind the last AMP loss compared with fp32's (a step the
        GradScaler skipped changed no weight)."""
        return sum(not s for s in self.skipped_steps[:-1])

    @property
    def judged(self) -> bool:
        """Whether the loss curves compared enough applied AMP updates to judge agreement:
        ``MIN_UPDATES``, or every step after the first where fewer steps ran."""
        return self.updates_compared >= min(MIN_UPDATES, len(self.skipped_steps) - 1)

    @property
    def discerning(self) -> bool:
        """Whether fp32's own spread leaves a loss limit that says something (at most
        ``MAX_LOSS_TOLERANCE``); where it does not, its curves cannot tell AMP from rounding."""
        return self.loss_tolerance <= MAX_LOSS_TOLERANCE

    @property
    def verdict(self) -> str:
        """``agree``, ``DISAGREE`` (outputs from the same weights differ, whatever the steps;
        or the loss curves after enough updates), or ``cannot judge: ...`` with what to do."""
        tolerance = AGREEMENT[torch.float16 if self.amp_dtype == "fp16" else torch.bfloat16]
        if self.output_rel_diff > tolerance:
            return "DISAGREE"
        if not self.discerning:
            return (f"cannot judge: fp32's own loss curve moved {self.fp32_spread:.0%} when its "
                    "weights moved by one rounding step, so no gap AMP leaves can be told from "
                    "rounding; check on more data per step (a larger batch) or over more steps")
        if self.agrees:
            return "agree"
        if self.judged:
            return "DISAGREE"
        n = len(self.skipped_steps)
        return (f"cannot judge: {sum(self.skipped_steps)} of {n} AMP steps skipped by the "
                f"GradScaler, so {self.updates_compared} applied update(s) were compared "
                f"({min(MIN_UPDATES, n - 1)} needed); run more steps (steps={2 * n})")

    def ran_low(self, module: str) -> bool:
        """Whether any op of ``module`` (or of a module inside it) ran in the AMP dtype; a
        module kept in fp32 (``autocast(enabled=False)``, ``custom_fwd``) ran none."""
        inside = (lambda w: w not in OUTSIDE) if module == MODEL else (
            lambda w: w == module or w.startswith(module + "."))
        return any(inside(op.where) and _op_kind(op, self.amp_dtype) == "low"
                   for op in self.ops)

    @property
    def fp16_overflows(self) -> list[str]:
        """Modules whose fp32 outputs exceed 65504, whatever the AMP dtype: fp16 would give inf."""
        return [r.module for r in self.ranges if r.overflows_fp16]

    @property
    def fp32_matmuls(self) -> list[OpTrace]:
        """The matmuls of the traced AMP step that still ran in fp32 (in a region with autocast
        off, or on autocast's fp32 list): where TF32 can speed fp32 up on an NVIDIA GPU."""
        return [op for op in self.ops if op.op in GEMM_OPS and op.output == "fp32"]

    @property
    def fp32_time_share(self) -> float:
        """Share of the traced AMP step's op time (forward, loss, backward) spent in ops that ran
        in fp32: their time over the time of every op traced, the casts autocast inserts
        included in that total (so fp32, low-dtype and cast time share the whole)."""
        times = Counter()
        for op in self.ops:
            times[_op_kind(op, self.amp_dtype)] += op.seconds
        total = times["fp32"] + times["low"] + times["cast"]
        return times["fp32"] / total if total else 0.0

    @property
    def speedup(self) -> float:
        """t_fp32 / t_amp: the median of the interleaved blocks' ratios (``speed``), else the
        ratio of the timed steps' medians."""
        if self.speed is not None:
            return self.speed.ratio
        return self.timing_ms["fp32"] / self.timing_ms["amp"]

    @property
    def speed_noise(self) -> str | None:
        """Why the speedup is no result here, or None: the interleaved comparison's rule (its
        A/A control off 1, or an interval too wide; ``interleave.PairedComparison``), else the
        medians' (a spread over ``NOISY_SPREAD`` of the median, or threads that waited for a CPU
        over ``CROWDED_SHARE`` of the time)."""
        if self.speed is not None:
            return self.speed.noise
        noisy = {mode: why for mode in ("fp32", "amp")
                 if (why := why_noisy(self.timing_iqr_ms[mode] / self.timing_ms[mode],
                                      self.timing_wait_share.get(mode)))}
        return busy(noisy) if noisy else None

    def summary_rows(self) -> list[dict[str, object]]:
        return [
            {"finding": "device", "value": self.device},
            {"finding": "recommended dtype", "value": self.recommended.split(":")[0],
             "why": self.recommended.split(": ", 1)[-1]},
            *([{"finding": "fastest on this device", "value": "fp32, no autocast",
                "why": self.fp32_faster}] if self.fp32_faster else []),
            {"finding": "dtype checked", "value": self.amp_dtype, "why": self.dtype_why},
            {"finding": "GradScaler", "value": "needed" if self.grad_scaler else "not needed",
             "why": "fp16's exponent range is narrow: small gradients flush to zero" if
             self.grad_scaler else f"{self.amp_dtype} has fp32's exponent range"},
            {"finding": "TF32", "value": self.tf32},
            {"finding": "share of op time in fp32 under autocast",
             "value": f"{self.fp32_time_share:.0%}"},
            {"finding": "modules the AMP dtype cannot hold", "value": ", ".join(self.flagged)
             or "none"},
            {"finding": "fp16 would overflow in", "value": ", ".join(self.fp16_overflows)
             or "none", "why": "outputs past fp16's largest value, 65504 (in the fp32 step)"},
            {"finding": f"ops that overflowed in {self.amp_dtype}", "value": "; ".join(
                map(str, self.op_overflows)) or "none", "why": "inf/NaN out of finite inputs "
             "inside the forward under autocast, where fp32 made none"},
            {"finding": "matmul ceiling", "value": f"{self.ceiling_ratio:.2f}x" if
             self.ceiling_ratio else "none", "why": self.ceiling_why or
             f"the most a matmul-bound step gains from {self.amp_dtype} here"},
            {"finding": "agreement with fp32", "value": self.verdict.split(":")[0],
             "why": self.verdict.split(": ", 1)[-1] if ":" in self.verdict else
             ("outputs all zero from the initial weights (a zero-initialised head), not "
              "compared" if self.outputs_all_zero else f"outputs {self.output_rel_diff:.2e}")
             + f", loss curves {self.loss_rel_gap:.2e} "
             f"(relative; fp32 from weights nudged by one rounding step: "
             f"{self.fp32_spread:.2e})"},
        ]

    def op_rows(self) -> list[dict[str, object]]:
        """Per module (and the loss and backward): which ops ran in which dtype, and their time."""
        rows: dict[str, dict[str, object]] = {}
        for op in self.ops:
            row = rows.setdefault(op.where, {"module": op.where, "low": Counter(),
                                             "fp32": Counter(), "cast": 0, "time (ms)": 0.0})
            kind = _op_kind(op, self.amp_dtype)
            if kind == "cast":
                row["cast"] += 1
            else:
                row[kind][op.op] += 1
            row["time (ms)"] += op.seconds * 1e3
        return [{"module": r["module"], f"ran in {self.amp_dtype}": _counts(r["low"]),
                 "ran in fp32": _counts(r["fp32"]), "casts": r["cast"],
                 "time (ms)": round(r["time (ms)"], 3)} for r in rows.values()]

    def range_rows(self) -> list[dict[str, object]]:
        return [{"module": r.module, "type": r.type, "max |activation|": r.act_max,
                 "max |gradient|": r.grad_max,
                 "gradients < 2^-14": f"{r.grad_below_tiny:.1%}",
                 "gradients < 2^-24": f"{r.grad_below_smallest:.1%}",
                 f"{self.amp_dtype} step / spread": round(r.rounding, 4),
                 "fp16 overflows": r.overflows_fp16, "signal rounded away": r.rounds_signal_away}
                for r in self.ranges]

    def payoff_rows(self) -> list[dict[str, object]]:
        """fp32 and AMP side by side: time, speed-up, memory and the ceiling. A cell with no
        figure says why in a word or two (never None or NaN); ``speed_noise`` and
        ``ceiling_why`` say it in full."""
        rows = []
        for mode in ("fp32", "amp"):
            peak = self.peak_bytes[mode]
            if mode == "fp32":
                ceiling: object = "baseline"
            elif self.ceiling_ratio:
                ceiling = round(self.ceiling_ratio, 2)
            else:
                why = self.ceiling_why or ""
                ceiling = ("none: emulated" if "emulated" in why else "none: noisy" if "noise"
                           in why else "none: not measured")
            rows.append({"run": self.tf32_label(mode), "time/step median (ms)":
                         round(self.timing_ms[mode], 3),
                         "time/step IQR (ms)": round(self.timing_iqr_ms[mode], 3),
                         "speedup (t_fp32 / t)": (1.0 if mode == "fp32" else "none: noisy"
                                                  if self.speed_noise else
                                                  round(self.speedup, 2)),
                         "90% interval": ("baseline" if mode == "fp32" else self._interval()),
                         "peak memory (MB)": round(peak / 2**20, 2) if peak is not None
                         else "n/a: no allocator",
                         "saved activations (MB)": round(self.saved[mode].activations
                                                         / 2**20, 3),
                         "cast weights (MB)": round(self.saved[mode].cast_weights / 2**20, 3),
                         "matmul ceiling (t_fp32 / t)": ceiling})
        return rows

    def _interval(self) -> str:
        """The payoff's speed-up interval and how it was timed, or why there is none."""
        if self.speed is None:
            return "none: not interleaved"
        basis = "per core" if self.speed.basis.startswith("CPU") else "wall time"
        return (f"{self.speed.estimate.low:.2f}-{self.speed.estimate.high:.2f}, {basis}; "
                f"fp32 against itself {self.speed.control.median:.2f}")

    def tf32_label(self, mode: str) -> str:
        return self.amp_dtype + " autocast" if mode == "amp" else "fp32"

    def advice_rows(self) -> list[dict[str, str]]:
        return [asdict(a) for a in self.advice]

    def as_dict(self) -> dict[str, object]:
        """Everything as plain numbers and strings, for ``json.dumps``."""
        out = {k: v for k, v in asdict(self).items() if k not in ("ops", "ranges", "advice")}
        out.update(ops=self.op_rows(), ranges=[asdict(r) for r in self.ranges],
                   advice=self.advice_rows(), flagged=self.flagged,
                   fp32_time_share=self.fp32_time_share, speedup=self.speedup)
        return json.loads(json.dumps(out, default=str, allow_nan=True))

    def text(self) -> str:
        """The report as plain text: one section per table."""
        sections = [("summary", self.summary_rows()), ("ops by module", self.op_rows()),
                    ("ranges", self.range_rows()), ("payoff", self.payoff_rows()),
                    ("what to do", self.advice_rows())]
        lines = [f"agreement: output differs by {self.output_rel_diff:.2e} (relative), loss "
                 f"curves by {self.loss_rel_gap:.2e} (fp32's own spread "
                 f"{self.fp32_spread:.2e}): {self.verdict}"]
        for title, rows in sections:
            lines.append(f"\n== {title} ==")
            lines += ["  " + "; ".join(f"{k}: {v}" for k, v in row.items()) for row in rows]
        return "\n".join(lines)


def _op_kind(op: OpTrace, low: str) -> str:
    if op.op in ("_to_copy", "to", "copy_") and op.inputs and op.inputs[0] != op.output:
        return "cast"
    return "low" if op.output == low else "fp32"


def _scale(value: float) -> str:
    """A scale as Python reads it back: ``16777216``, not ``1.67772e+07``."""
    return f"{value:.0f}" if value >= 1 and float(value).is_integer() else repr(float(value))


def _keep_in_fp32(module: str, kind: str, why: str, op: str | None = None,
                  returns_tuple: bool = False) -> Advice:
    """The line that keeps ``module`` in fp32 (for MODEL: the ``op`` in its own forward); a
    module that returns a tuple (an LSTM's ``(output, (h, c))``) unpacks it, so the line
    pastes where its call was."""
    if module == MODEL:
        return Advice(f'with torch.autocast("{kind}", enabled=False):  # around the {op} in the '
                      "model's own forward, its inputs .float(): that op in fp32", why)
    target = "h, *rest" if returns_tuple else "h"
    return Advice(f'with torch.autocast("{kind}", enabled=False): {target} = '
                  f"{_attribute(module)}(h.float())  # keep {module} in fp32 (or decorate its "
                  f'forward with @torch.amp.custom_fwd(device_type="{kind}", '
                  "cast_inputs=torch.float32))", why)


def _attribute(module: str) -> str:
    """``stem.0`` -> ``self.stem[0]``: how the parent's forward calls that module."""
    if module == MODEL:
        return "model"
    return "self" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in module.split("."))


def _counts(counter: Counter) -> str:
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counter.most_common())


def _device_of(model: nn.Module) -> torch.device:
    tensor = next(model.parameters(), None)
    if tensor is None:
        tensor = next(model.buffers(), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def free_bytes_on(device: torch.device) -> int | None:
    """Bytes free on ``device`` now: on CUDA/ROCm the driver's free memory plus what PyTorch's
    caching allocator holds but no tensor uses; the host's available memory on a CPU; None where
    the device does not say.

    ``torch.cuda.mem_get_info`` is ``cudaMemGetInfo`` (``torch/cuda/memory.py``), which counts
    the allocator's cached blocks as used; the check-up's own tensors are served from those
    first, so ``memory_reserved() - memory_allocated()`` (same file) is free to it as well. (A
    cached block can be too small for one large tensor: an OOM later is still one plain line.)"""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    if device.type == "cpu":
        try:  # MemAvailable counts the page cache the kernel can drop; sysconf's free pages don't
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        if hasattr(os, "sysconf"):
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def bytes_needed(model: nn.Module) -> int:
    """What the check-up holds beyond the batch: weights, gradients, two optimizer states (Adam)
    and its copy of the weights to restore them: five times the parameters and buffers."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return 5 * params + 2 * buffers


def _check_inputs(model: nn.Module, batch: Batch, loss_fn: LossFn | None,
                  step: StepFn | None, device: torch.device, free_bytes: int | None) -> None:
    if not isinstance(model, nn.Module):
        raise CheckupError(f"the model is a {type(model).__name__}, not a torch.nn.Module")
    if loss_fn is not None and step is not None:
        raise CheckupError("pass a loss_fn(output, targets) or a step(model, batch), not both: "
                           "the step computes the loss itself")
    for name, fn in (("loss_fn", loss_fn), ("step", step)):
        if fn is not None and not callable(fn):
            raise CheckupError(f"{name} must be a function, got a {type(fn).__name__}")
    if step is None and loss_fn is not None and isinstance(batch, (tuple, list)):
        *inputs, targets = batch  # (inputs..., targets): named as loss_fn(model(inputs), targets)
        named = [p for i, v in enumerate(inputs)
                 for p in _paths(v, "inputs" if len(inputs) == 1 else f"inputs[{i}]")]
        named += _paths(targets, "targets")
    else:
        named = _paths(batch)
    for name, tensor in named:
        if tensor.device != device:
            raise CheckupError(f"the batch's {name} are on {tensor.device} but the model is on "
                               f"{device}: move them with .to({str(device)!r}) (batch_to(batch, "
                               f"{str(device)!r}) from amp_tutorial.checkup moves a whole batch)")
    need = bytes_needed(model)
    free = free_bytes_on(device) if free_bytes is None else free_bytes
    if free is not None and need > free:
        raise CheckupError(f"the model is too big for {device}: the check-up needs about "
                           f"{need / 2**30:.2f} GiB (weights, gradients, two optimizer states "
                           f"and a copy of the weights) and {free / 2**30:.2f} GiB is free; run "
                           "it on a bigger device or on a smaller configuration of the model")


def _too_big(err: BaseException) -> bool:
    """An allocation failed: ``torch.OutOfMemoryError`` on a GPU, the CPU allocator's
    RuntimeError ("DefaultCPUAllocator: can't allocate memory") on the host."""
    oom = getattr(torch, "OutOfMemoryError", None)
    text = str(err).lower()
    return ((oom is not None and isinstance(err, oom)) or "out of memory" in text
            or "can't allocate memory" in text)


def _first_line(err: BaseException) -> str:
    """The error's first line, its full stop dropped (the line goes on after it)."""
    return str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else ""


def _out_of_memory(device: torch.device, where: str, err: BaseException) -> CheckupError:
    return CheckupError(f"out of memory on {device} {where} ({type(err).__name__}: "
                        f"{_first_line(err)}): check a smaller batch (a few samples show the "
                        "ranges and dtypes), or run it on a device with more memory")


def _forward_only(step: StepFn | None) -> contextlib.AbstractContextManager:
    """No autograd for a forward the check-up only reads, except around your ``step``: a step may
    take gradients itself (``torch.autograd.grad`` for a gradient penalty or a physics-informed
    loss), which needs autograd on, as it is in training."""
    return torch.no_grad() if step is None else contextlib.nullcontext()


def _first_forward(model: nn.Module, batch: Batch, loss_fn: LossFn | None, step: StepFn | None,
                   device: torch.device) -> None:
    """The fp32 forward and loss once, in training mode, turning each way it can fail into one
    plain line."""
    who = "your step(model, batch)" if step is not None else "the model"
    args, kwargs, targets = _split(batch, loss_fn) if step is None else ((batch,), {}, None)
    model.train()  # as the check-up trains (GoogLeNet's auxiliary outputs are train-mode only)
    try:
        with _forward_only(step):
            output = step(model, batch) if step is not None else model(*args, **kwargs)
    except CheckupError:
        raise
    except Exception as err:  # noqa: BLE001 - any error of the learner's model is the finding
        if _too_big(err):
            raise _out_of_memory(device, "in one fp32 forward pass, before any AMP",
                                 err) from err
        hint = ("; called as model(*batch) as no loss_fn was given: pass loss_fn=(output, "
                "targets) -> loss for a batch of (inputs, targets)"
                if isinstance(err, TypeError) and step is None and loss_fn is None
                and isinstance(batch, (tuple, list)) else "")
        raise CheckupError(f"{who} raised {type(err).__name__} in an fp32 forward pass on this "
                           f"batch, before any AMP: {_first_line(err)}{hint}") from err
    if step is not None:
        loss, made_by = output, "step"
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()  # its graph is not needed: free it now
    elif loss_fn is not None:
        made_by = "loss_fn"
        try:
            with torch.no_grad():
                loss = loss_fn(output, targets)
        except Exception as err:  # noqa: BLE001 - the learner's loss function on this output
            if isinstance(output, torch.Tensor):
                raise CheckupError(f"loss_fn raised {type(err).__name__} on the model's output "
                                   f"in fp32, before any AMP: {_first_line(err)}") from err
            part = (f"out[{next(iter(output))!r}]" if isinstance(output, Mapping) and output
                    else f"out.{output._fields[0]}" if getattr(output, "_fields", None)
                    else "out[0]")
            raise CheckupError(
                f"the model returned a {type(output).__name__}, not a tensor, and loss_fn "
                f"raised {type(err).__name__} on it: {_first_line(err)}: pass a loss_fn that "
                f"takes {_describe(output)} (e.g. lambda out, targets: loss({part}, targets)), "
                "or step=(model, batch) -> loss") from err
    else:
        loss, made_by = output_loss(output), "the model's output"
        if loss is None:
            raise _no_loss(output)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise CheckupError(f"{made_by} must give a one-element tensor (the loss), got "
                           f"{type(loss).__name__}"
                           + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                              else ""))
    if not math.isfinite(float(loss)):
        with _forward_only(step):
            where = first_nonfinite_module(model, lambda: batch_loss(model, batch, loss_fn,
                                                                     step=step))
        if any(not bool(t.isfinite().all()) for t in _tensors_in((args, kwargs))
               if t.is_floating_point()):
            cause = "the inputs hold inf or NaN"
        elif where is not None:
            cause = str(where)
        elif any(not bool(t.isfinite().all()) for t in _tensors_in(targets)
                 if t.is_floating_point()):
            cause = "the targets hold inf or NaN"
        else:
            cause = (f"every module's output is finite, so {made_by} made it"
                     if made_by != "the model's output" else "the model's own loss made it")
        raise CheckupError(f"the loss is {float(loss)} in fp32, before any AMP ({cause}): fix "
                           "the model or the data in fp32 first")


def _first_amp_forward(model: nn.Module, batch: Batch, loss_fn: LossFn | None,
                       step: StepFn | None, info: DeviceInfo, dtype: torch.dtype) -> None:
    """One forward and loss under autocast, in training mode with autograd on, as the steps
    run them: a model that cannot run under autocast here (oneDNN's LSTM under bf16 on a CPU
    without AVX-512 raises "could not create a primitive descriptor") is one line naming the
    module that raised and what to try."""
    model.train()
    name = dtype_name(dtype)
    watch = _ModuleWatch(model)
    try:
        with watch, torch.autocast(info.type, dtype=dtype):
            loss = batch_loss(model, batch, loss_fn, step=step)
    except CheckupError:
        raise
    except Exception as err:  # noqa: BLE001 - what autocast cannot run is the finding
        where = watch.stack[-1] if watch.stack else None  # the innermost module still running
        if _too_big(err):
            raise _out_of_memory(info.device, f"in the first forward pass under {name} "
                                 "autocast", err) from err
        if where is None or where == MODEL:
            culprit, fix = "the model's own forward", (
                f'run the op that raised in fp32 (with torch.autocast("{info.type}", '
                "enabled=False), its inputs .float())")
        else:
            module = dict(watch.modules)[where]
            culprit = f"{where} ({type(module).__name__})"
            fix = (f'keep {where} in fp32: with torch.autocast("{info.type}", enabled=False): '
                   f"h = {_attribute(where)}(h.float())")
        raise CheckupError(f"{name} autocast cannot run this model on {info.device}: "
                           f"{culprit} raised {type(err).__name__} under autocast: "
                           f"{_first_line(err)}: {fix}, then check again") from err
    if not loss.requires_grad and any(p.requires_grad for p in model.parameters()):
        raise CheckupError("the loss does not require grad (computed under torch.no_grad, or "
                           "detached), so no step can train on it: return the loss as computed")
    del loss


def recommended_dtype(info: DeviceInfo) -> torch.dtype | None:
    """The AMP dtype the check-up recommends (and checks by default): bf16 where the device
    computes it natively (fp32's exponent range: no overflow, no GradScaler), even where fp16
    comes first in its AMP dtypes (an NVIDIA GPU from Ampere on); else the device's first AMP
    dtype. A dtype put first by ``AMP_TUTORIAL_DTYPE`` stays first: it was asked for."""
    asked = any(note.startswith(f"{DTYPE_ENV}=") for note in info.notes)
    if not asked and info.native_bf16 and torch.bfloat16 in info.amp_dtypes:
        return torch.bfloat16
    return info.amp_dtype


def why_fp32_is_faster(info: DeviceInfo) -> str | None:
    """Why fp32 is the fast choice on ``info``: a CPU whose every AMP dtype offered (bf16) is
    only emulated, its bf16 matmuls on ATen's reference gemm (``device.cpu_bf16_native``);
    None elsewhere."""
    if info.type != "cpu" or info.native_bf16 is not False or any(
            d != torch.bfloat16 for d in info.amp_dtypes):
        return None
    return ("this CPU only emulates bf16, the AMP dtype offered on it (no avx512_bf16 or AMX), "
            "so fp32 is faster here: train in fp32 on it, and keep the AMP lines for a device "
            "that computes bf16 natively (the check-up ran them to show they are right)")


def _recommend(info: DeviceInfo, dtype: torch.dtype) -> str:
    name = dtype_name(dtype)
    if dtype == torch.bfloat16:
        native = {True: "this device computes bf16 natively", False: "this device only emulates "
                  "bf16 (slow)", None: "whether bf16 is native here is not known"}
        return f"{native[info.native_bf16]}; bf16 keeps fp32's exponent range, so no GradScaler"
    why = f"{name} has a narrow range (max 65504, smallest normal 2^-14): it needs a GradScaler"
    if torch.bfloat16 not in info.amp_dtypes:
        return f"{why}; bf16 is not offered here"
    said = [note for note in info.notes if note.startswith(f"{DTYPE_ENV}=")]
    if said and dtype == info.amp_dtype:
        return f"{why}; asked for ({'; '.join(said)})"
    preferred = recommended_dtype(info)
    if dtype != preferred:
        native = (": this device computes bf16 natively, with fp32's range and no GradScaler"
                  if preferred == torch.bfloat16 and info.native_bf16 else "")
        return (f"{why}; checked because you asked for it (recommended here: "
                f"{dtype_name(preferred)}{native})")
    return f"{why}; first of this device's AMP dtypes, and bf16 is not native here"


class _ModuleWatch:
    """Forward hooks on every module that is not a plain container: the running module's name
    (for the op trace), and in the fp32 step each output's range and its gradient."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None) -> None:
        self.modules = [(n or MODEL, m) for n, m in model.named_modules()
                        if not n or not isinstance(m, CONTAINERS)]
        self.stack: list[str] = []
        self.phase = "(loss)"
        self.dtype = dtype  # given: measure each output and its gradient (numbers, no tensors)
        self.outputs: dict[str, tuple[float, float]] = {}  # name -> (max |output|, rounding)
        self.tuples: set[str] = set()  # modules whose output is a tuple or list
        self.grads: dict[str, tuple[float, float, float, torch.Tensor]] = {}  # max, 2 shares,
        # and a strided sample of the nonzero |gradient| values for the scale's quantile

    def where(self) -> str:
        return self.stack[-1] if self.stack else self.phase

    def __enter__(self) -> _ModuleWatch:
        self.handles = []
        for name, module in self.modules:
            self.handles.append(module.register_forward_pre_hook(
                lambda _m, _a, name=name: self.stack.append(name)))
            self.handles.append(module.register_forward_hook(self._post(name)))
        return self

    def _post(self, name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: object, output: object) -> None:
            self.stack.pop()
            if isinstance(output, (tuple, list)):  # LSTM (out, (h, c)), attention (out, w)
                self.tuples.add(name)
                output = next((t for t in output if isinstance(t, torch.Tensor)), None)
            if (self.dtype is not None and isinstance(output, torch.Tensor)
                    and output.is_floating_point()):
                out = output.detach()
                self.outputs[name] = (float(out.abs().max()) if out.numel() else 0.0,
                                      _rounding(out, self.dtype))
                if output.requires_grad:
                    output.register_hook(lambda g, name=name: self._grad(name, g))
        return hook

    def _grad(self, name: str, grad: torch.Tensor) -> None:
        g = grad.detach().abs().flatten()
        nonzero = g[g > 0].float()
        shares = [float((nonzero < limit).float().mean()) if nonzero.numel() else 0.0
                  for limit in (FP16_TINY, FP16_SMALLEST)]
        sample = nonzero[::max(1, nonzero.numel() // 100_000)]
        self.grads[name] = (float(g.max()) if g.numel() else 0.0, *shares, sample)

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()


def _rounding(output: torch.Tensor, dtype: torch.dtype) -> float:
    """The dtype's rounding step at each feature's typical value over that feature's spread
    across the samples (median over features): above ``ROUNDING_LIMIT`` rounding swamps what
    tells one sample from another. Features are the last dimension (the channels of an image);
    the samples are every other position. Features that do not vary are left out."""
    if output.dim() >= 4:  # (N, C, H, W, ...): each channel a feature, each pixel a sample
        output = output.movedim(1, -1)
    if output.dim() < 2 or output.numel() // output.shape[-1] < 2:
        return 0.0
    flat = output.float().reshape(-1, output.shape[-1])  # samples x features
    mean, spread = flat.mean(0).abs(), flat.std(0)
    keep = (spread > 0) & (mean > 0)
    if not bool(keep.any()):
        return 0.0
    step = torch.exp2(torch.floor(torch.log2(mean[keep])) - MANTISSA_BITS[dtype])
    return float((step / spread[keep]).median())


def _ranges(watch: _ModuleWatch, dtype: torch.dtype) -> list[ModuleRange]:
    rows, rounded = [], False
    for name, module in watch.modules:
        if name not in watch.outputs:
            continue
        act_max, rounding = watch.outputs[name]
        grad_max, below_tiny, below_smallest, _ = watch.grads.get(name, (0.0, 0.0, 0.0, None))
        first_rounded = rounding > ROUNDING_LIMIT and not rounded  # later ones inherit it
        rounded = rounded or first_rounded
        rows.append(ModuleRange(name, type(module).__name__, act_max, grad_max, below_tiny,
                                below_smallest, rounding, act_max > FP16_MAX, first_rounded,
                                name in watch.tuples))
    return rows


def _scales(watch: _ModuleWatch, param_grad_max: float = 0.0
            ) -> tuple[float | None, float | None]:
    """The smallest power of two that lifts 99% of the module-output gradients above fp16's
    smallest normal (2^-14), and the largest scale under which no gradient overflows fp16: the
    module outputs' and the parameters' (``param_grad_max``; a weight gradient sums over the
    batch and can be far larger than any output gradient)."""
    samples = [sample for *_, sample in watch.grads.values() if sample.numel()]
    if not samples:
        return None, None
    low = float(torch.quantile(torch.cat(samples), 0.01))  # of strided samples: size-limited
    needed = 2.0 ** max(0, math.ceil(math.log2(FP16_TINY / low)))
    largest = max(param_grad_max, *(g[0] for g in watch.grads.values()))
    return needed, (FP16_MAX / largest if largest > 0 else None)


def _train(model: nn.Module, initial: dict, batch: Batch, loss_fn: LossFn | None,
           user_step: StepFn | None, dtype: torch.dtype | None, make_optimizer: Callable,
           steps: int, warmup: int, device: torch.device, init_scale: float = INIT_SCALE
           ) -> tuple[list[float], StepTimer, int | None, list[bool], float | None]:
    """``steps`` training steps from the initial weights, fp32 (``dtype`` None) or AMP with a
    GradScaler for fp16: losses, the StepTimer and the allocator's peak, as the bench takes
    them, and which steps the scaler skipped (its scale went down: the gradients overflowed)."""
    model.load_state_dict(initial)
    optimizer = make_optimizer(model.parameters())
    scaler = (torch.amp.GradScaler(device.type, init_scale=init_scale)
              if dtype == torch.float16 else None)
    # the course's step (steps._amp_train_step), its forward and loss the batch's own
    step = _amp_train_step(lambda _: batch_loss(model, batch, loss_fn, step=user_step),
                           optimizer, lambda _: (None, None), lambda loss, _: loss,
                           device.type, dtype, scaler)
    free_memory(device)
    reset_peak_memory(device)
    timer = StepTimer(device, warmup=warmup)
    losses, skipped = [], []
    scale = scaler.get_scale() if scaler is not None else 1.0
    for i in range(steps):
        with timer.step():
            losses.append(step(i))
        before, scale = scale, scaler.get_scale() if scaler is not None else 1.0
        skipped.append(scale < before)
    return (losses, timer, peak_memory_bytes(device), skipped,
            scale if scaler is not None else None)


def _time_interleaved(model: nn.Module, initial: dict, batch: Batch, loss_fn: LossFn | None,
                      user_step: StepFn | None, dtype: torch.dtype, make_optimizer: Callable,
                      blocks: int, warmup: int, device: torch.device, init_scale: float
                      ) -> Interleaved:
    """fp32 and AMP training steps of the one model taking turns (``interleave``: palindromic
    blocks, fp32 run twice as the A/A control), so a load that comes or goes meets both alike;
    no copy of the model is made. The weights drift from step to step; the work of a step, which
    is what is timed, does not. fp16 starts at ``init_scale`` (the scale the loss curves ended
    at), so the scaler skips no step here that it did not skip there."""
    model.load_state_dict(initial)
    optimizer = make_optimizer(model.parameters())
    scaler = (torch.amp.GradScaler(device.type, init_scale=init_scale)
              if dtype == torch.float16 else None)

    def train_step(amp_dtype: torch.dtype | None) -> Callable[[], float]:
        step = _amp_train_step(lambda _: batch_loss(model, batch, loss_fn, step=user_step),
                               optimizer, lambda _: (None, None), lambda loss, _: loss,
                               device.type, amp_dtype, scaler if amp_dtype else None)
        return lambda: step(0)

    runs = {"fp32": train_step(None), "fp32 again": train_step(None),
            f"AMP {dtype_name(dtype)}": train_step(dtype)}
    return interleave(runs, "fp32", "fp32 again", device, blocks, warmup=warmup, progress=False)


def _fp32_spread(model: nn.Module, initial: dict, batch: Batch, loss_fn: LossFn | None,
                 step: StepFn | None, make_optimizer: Callable, steps: int,
                 device: torch.device, dtype: torch.dtype, losses32: list[float]) -> float:
    """How far fp32's own loss curve moves when its weights move by one rounding step of
    ``dtype``: the largest relative gap to ``losses32`` over NUDGES reruns, each from the
    initial weights with every parameter times (1 +- ``dtype``'s unit roundoff), a seeded
    random sign per weight. The runs are untimed; their random numbers (dropout) are fp32's."""
    names = {name for name, _ in model.named_parameters()}
    roundoff = torch.finfo(dtype).eps / 2
    worst = 0.0
    for seed in range(NUDGES):
        g = torch.Generator().manual_seed(seed)
        nudged = {}
        for key, value in initial.items():
            if key in names and value.is_floating_point():
                sign = torch.randint(0, 2, value.shape, generator=g).to(value.dtype) * 2 - 1
                value = value + value * (roundoff * sign.to(value.device))
            nudged[key] = value
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(0)
            losses = _train(model, nudged, batch, loss_fn, step, None, make_optimizer, steps,
                            0, device)[0]
        if not all(map(math.isfinite, losses)):
            return math.inf
        worst = max([worst] + [loss_gap(a, b, losses32[0])
                               for a, b in zip(losses, losses32, strict=True)])
    return worst


def loss_gap(loss: float, fp32: float, fp32_first: float) -> float:
    """``loss``'s distance from fp32's ``fp32`` relative to ``fp32``, or to ``LOSS_FLOOR`` of
    fp32's first loss where fp32's has fallen below that (1e-12 at the very least)."""
    return abs(loss - fp32) / max(abs(fp32), LOSS_FLOOR * abs(fp32_first), 1e-12)


def _advice(report: Checkup, info: DeviceInfo, dtype: torch.dtype) -> list[Advice]:
    kind, name = info.type, dtype_name(dtype)
    torch_dtype = f"torch.{str(dtype).split('.')[-1]}"
    bf16_native = bool(info.native_bf16) and torch.bfloat16 in info.amp_dtypes
    overflow = report.first_nonfinite is not None or bool(report.overflow_modules)
    out = [Advice(f'with torch.autocast(device_type="{kind}", dtype={torch_dtype}):  '
                  "# forward and loss only", f"{name}: {report.dtype_why}")]
    if report.fp32_faster:
        out.insert(0, Advice("# on this device: no autocast, fp32 (the lines below are for "
                             "one with native bf16)", report.fp32_faster))
    if report.grad_scaler:
        share = max((r.grad_below_smallest for r in report.ranges), default=0.0)
        lift = (f"; a scale of at least {report.scale_needed:g} lifts 99% of the gradients "
                "above fp16's smallest normal" if report.scale_needed else "")
        if (report.scale_needed and report.scale_max
                and report.scale_needed > report.scale_max):
            lift = (f"; no single scale fits: lifting 99% of the gradients needs "
                    f"{report.scale_needed:.3g}, more than the largest safe one (keep the "
                    "modules with the smallest gradients in fp32"
                    + (", or use bf16, native here)" if bf16_native else ")"))
        start = ""  # a scale the gradients need above the one it starts at, where it is safe
        if (report.scale_needed and report.scale_max and report.init_scale
                and report.init_scale < report.scale_needed <= report.scale_max):
            start = f", init_scale={_scale(report.scale_needed)}"
        out.append(Advice(f'scaler = torch.amp.GradScaler("{kind}"{start}); '
                          "scaler.scale(loss).backward(); scaler.step(optimizer); "
                          "scaler.update()",
                          f"fp16: up to {share:.1%} of a module's output gradients are below "
                          f"2^-24 and would be zero unscaled{lift}; the largest safe scale is "
                          f"{report.scale_max:.3g}" if report.scale_max else "fp16 needs it"))
        n_skipped = sum(report.skipped_steps)
        if overflow:
            # the forward itself overflows: the loss is inf/NaN at every scale, so the scaler
            # halves each step and its last scale is a count of the steps, not a setting
            # the op that overflowed first where one did (bmm in attn), else the module whose
            # output went non-finite
            first = str(report.op_overflows[0]) if report.op_overflows else str(
                report.first_nonfinite)
            module = (report.overflow_modules[0] if report.overflow_modules
                      else str(report.first_nonfinite).split(" ")[0])
            out.append(Advice(f"# no GradScaler setting fixes this: fp16's forward overflows "
                              f"in {module}",
                              f"the first inf/NaN under fp16 autocast: {first}, before any "
                              "gradient; a scale acts on the loss and the gradients only"))
        elif n_skipped and report.final_scale:
            settled = not any(report.skipped_steps[-2:])
            scale = report.final_scale
            if not settled and report.scale_max:  # no higher than the parameters' gradients let
                scale = min(scale, 2.0 ** math.floor(math.log2(report.scale_max)))
            out.append(Advice(f'scaler = torch.amp.GradScaler("{kind}", '
                              f"init_scale={_scale(scale)})",
                              f"the scaler skipped {n_skipped} of {len(report.skipped_steps)} "
                              f"steps backing off from {report.init_scale:g} (gradients "
                              "overflowed fp16); "
                              + (f"it settled at {scale:g}" if settled else
                                 f"it was still going down at the last step "
                                 f"({report.final_scale:g}); {scale:g} is at most the largest "
                                 "safe scale of the parameters' gradients")))
    ranged = report.range_flagged
    tuples = {r.module for r in report.ranges if r.returns_tuple}
    for r in report.ranges:
        if r.module not in ranged:
            continue
        why = (f"{r.module} ({r.type}) outputs up to {r.act_max:.3g}, past fp16's 65504"
               if r.overflows_fp16 and name == "fp16" else
               f"{r.module} ({r.type}): {name}'s rounding step is {r.rounding:.3g}x the spread "
               "of its outputs across samples, so the signal is rounded away")
        out.append(_keep_in_fp32(r.module, kind, why, op="op that makes its output",
                                 returns_tuple=r.returns_tuple))
    for module in report.flagged:
        if module in ranged:
            continue
        found = [str(o) for o in report.op_overflows if o.module == module]
        why = (f"under {name} autocast {'; '.join(found)}, where fp32 made none"
               + ("" if module == MODEL or report.first_nonfinite else
                  f" (the output of {module} comes out finite, but not right)"))
        out.append(_keep_in_fp32(module, kind, why, op=report.op_overflows[0].op
                                 if module == MODEL else None, returns_tuple=module in tuples))
    if overflow and name == "fp16" and bf16_native:
        out.append(Advice(f'with torch.autocast(device_type="{kind}", dtype=torch.bfloat16):  '
                          "# instead of fp16, no GradScaler",
                          "this device computes bf16 natively, and bf16 has fp32's exponent "
                          "range: what overflows fp16 here fits in bf16"))
    tolerance = AGREEMENT[dtype]
    if (not report.judged and not overflow and report.output_rel_diff <= tolerance):
        n = len(report.skipped_steps)
        out.append(Advice(f"amp_checkup(..., steps={2 * n})  # check again with more steps",
                          report.verdict.split("; ")[0]))
    loss_ops = [op for op in report.ops if op.where == "(loss)" and op.op != "_to_copy"]
    if loss_ops and loss_ops[-1].output == name:
        # .float() alone is undone by autocast where the loss itself calls an op it lowers (a
        # matmul, as a contrastive loss's similarity has): the region is off around it
        out.append(Advice(f'with torch.autocast("{kind}", enabled=False): '
                          "loss = loss_fn(output.float(), targets)",
                          f"the loss was computed in {name}; in fp32 it keeps its precision"))
    fp32_matmuls = report.fp32_matmuls
    if (fp32_matmuls and kind == "cuda" and not info.is_rocm
            and torch.cuda.get_device_capability(info.device)[0] >= 8
            and not tf32_state()["matmuls"]):
        # torch.set_float32_matmul_precision sets the legacy precision and the new
        # cuda.matmul.fp32_precision together (Context::setFloat32MatmulPrecision, ATen's
        # Context.cpp); the new setting alone makes the legacy getters raise on 2.9, 2.11 and
        # 2.14, and torch 2.9's Inductor reads one for an fp32 matmul (pytorch/pytorch#166387)
        places = list(dict.fromkeys(f"{op.op} in {op.where}" for op in fp32_matmuls))
        where = ", ".join(places[:4]) + (", ..." if len(places) > 4 else "")
        out.append(Advice('torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls',
                          f"{len(fp32_matmuls)} matmul(s) still ran in IEEE fp32 under autocast "
                          f"({where}); TF32 speeds them up on this GPU"))
    if report.speed_noise:
        out.append(Advice("# time it again on an idle machine before deciding on speed",
                          f"no speed verdict: {report.speed_noise}"))
    elif report.speedup < 1:
        out.append(Advice("# keep this model in fp32 on this device",
                          f"AMP ran at {report.speedup:.2f}x fp32's speed here (t_fp32 / t_amp)"))
    return out


def amp_checkup(model: nn.Module, batch: Batch, loss_fn: LossFn | None = None, *,
                step: StepFn | None = None, dtype: torch.dtype | None = None, steps: int = 6,
                warmup: int = 1, make_optimizer: Callable | None = None,
                init_scale: float = INIT_SCALE,
                ceiling: Ceiling | None = None, ceiling_sizes: Sequence[int] = (512,),
                free_bytes: int | None = None, info: DeviceInfo | None = None,
                blocks: int = BLOCKS) -> Checkup:
    """Check ``model`` for AMP on one ``batch``, its loss by ``batch_loss``'s rule: a
    ``loss_fn(output, targets)`` on ``(inputs, targets)``, the loss the model's output carries
    (a Hugging Face model given a dict with its labels), or your ``step(model, batch)``.

    Runs ``steps`` training steps in fp32 and under autocast in ``dtype`` (default:
    ``recommended_dtype``, bf16 where the device computes it natively; fp16 with a GradScaler
    starting at ``init_scale``), from the same weights, with ``make_optimizer(params)``
    (default AdamW, lr 1e-3): the loss curves. The time per step comes from ``blocks`` more
    blocks in which fp32 and AMP steps take turns, after ``warmup`` untimed ones
    (``interleave``; fp32 twice, its A/A control). The
    model's weights, buffers and train/eval mode are restored afterwards. ``ceiling`` reuses a
    measured matmul ceiling (else one is measured at ``ceiling_sizes``); ``free_bytes``
    overrides the device's free memory. Raises CheckupError with one plain line where the
    check-up cannot run (``checkup`` returns that line instead).
    """
    device = _device_of(model) if isinstance(model, nn.Module) else torch.device("cpu")
    _check_inputs(model, batch, loss_fn, step, device, free_bytes)
    floating = [p.dtype for p in model.parameters() if p.is_floating_point()]
    if floating and all(d == torch.float64 for d in floating):
        raise CheckupError("the model's parameters are float64, and autocast lowers no float64 "
                           "tensor (is_eligible in ATen's autocast_mode.h): AMP would change "
                           "nothing here. To check AMP, cast the model and the batch to float32 "
                           "first (model.float())")
    if steps <= warmup:
        raise CheckupError(f"steps ({steps}) must be more than warmup ({warmup})")
    if blocks < MIN_BLOCKS:
        raise CheckupError(f"blocks ({blocks}) must be at least {MIN_BLOCKS}: fewer give no "
                           "interval worth the name")
    info = info or select_device(str(device))
    dtype = dtype or recommended_dtype(info)
    if dtype not in MANTISSA_BITS:
        raise CheckupError(f"{device} offers no AMP dtype here (torch {torch.__version__})")
    make_optimizer = make_optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-3))
    was_training = model.training
    initial = copy.deepcopy(model.state_dict())
    try:
        _first_forward(model, batch, loss_fn, step, device)
        _first_amp_forward(model, batch, loss_fn, step, info, dtype)
        return _run(model, initial, batch, loss_fn, step, dtype, info, steps, warmup,
                    make_optimizer, ceiling, ceiling_sizes, init_scale, blocks)
    except CheckupError:
        raise
    except Exception as err:  # noqa: BLE001 - one plain line, the cause chained for a developer
        if _too_big(err):
            raise _out_of_memory(device, "during the check-up's training steps", err) from err
        raise CheckupError(f"the check-up stopped in its {dtype_name(dtype)} training steps on "
                           f"{device}: {type(err).__name__}: {_first_line(err)}") from err
    finally:
        model.load_state_dict(initial)
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _run(model: nn.Module, initial: dict, batch: Batch, loss_fn: LossFn | None,
         step: StepFn | None, dtype: torch.dtype, info: DeviceInfo, steps: int, warmup: int,
         make_optimizer: Callable, ceiling: Ceiling | None,
         ceiling_sizes: Sequence[int], init_scale: float = INIT_SCALE,
         blocks: int = BLOCKS) -> Checkup:
    device, kind = info.device, info.type
    model.train()  # the check-up trains; the caller's mode comes back in amp_checkup

    def forward_loss(amp: bool) -> torch.Tensor:
        # ops outside every module: the loss_fn's, or the step's own around the model call
        watch.phase = "(step)" if step is not None else "(loss)"
        with torch.autocast(kind, dtype=dtype, enabled=amp):
            return batch_loss(model, batch, loss_fn, step=step)

    def output() -> torch.Tensor:
        """The model's output on the batch as one fp32 vector (every floating tensor in it)."""
        if step is None:
            args, kwargs, _ = _split(batch, loss_fn)
            return _flat(model(*args, **kwargs))
        return _output_of(model, lambda: step(model, batch))

    # ranges: one fp32 forward and backward with every module's output and gradient kept, the
    # bytes saved for backward counted on the way
    saved = {}
    model.load_state_dict(initial)
    with _ModuleWatch(model, dtype) as watch:
        kept: list[torch.Tensor] = []
        saved["fp32"] = saved_bytes(lambda: kept.append(forward_loss(False)), model)
        kept.pop().backward()
    param_grad_max = max((float(p.grad.abs().max()) for p in model.parameters()
                          if p.grad is not None and p.grad.numel()), default=0.0)
    ranges, (scale_needed, scale_max) = _ranges(watch, dtype), _scales(watch, param_grad_max)
    del watch.outputs, watch.grads
    model.zero_grad(set_to_none=True)

    # ops: one AMP forward, loss and backward, each kernel timed and tagged with its module
    model.load_state_dict(initial)
    with _ModuleWatch(model) as watch:
        def amp_step() -> None:
            losses = []
            saved["amp"] = saved_bytes(lambda: losses.append(forward_loss(True)), model)
            watch.phase = "(backward)"
            losses[0].float().backward()
        ops = trace_dtypes(amp_step, where=watch.where, timed_on=device)
    model.zero_grad(set_to_none=True)

    # agreement of the outputs from the same weights in eval mode (no dropout, the same
    # normalisation statistics), where AMP first goes non-finite (a module's output), and
    # which ops made inf/NaN out of finite inputs under autocast that fp32's did not
    model.load_state_dict(initial)
    model.eval()
    outputs, made = {}, {}
    outside = "(step)" if step is not None else "(loss)"
    with torch.no_grad():
        with _ModuleWatch(model) as watch, _NonfiniteOps(watch.where) as made["fp32"]:
            watch.phase = outside
            outputs["fp32"] = output()
        with (torch.autocast(kind, dtype=dtype), _ModuleWatch(model) as watch,
              _NonfiniteOps(watch.where) as made["amp"]):
            watch.phase = outside
            bad = first_nonfinite_module(model, lambda: outputs.setdefault("amp", output()))
    op_overflows = [o for key, o in made["amp"].found.items() if key not in made["fp32"].found]
    model.train()
    ref, amp_out = outputs["fp32"], outputs["amp"]
    max_diff = float((amp_out - ref).abs().max())
    rel = float(torch.linalg.vector_norm(amp_out - ref) / torch.linalg.vector_norm(ref).clamp_min(
        torch.finfo(torch.float32).tiny))
    if not math.isfinite(max_diff):
        rel = math.inf

    # payoff and loss curves: the learner's step, fp32 then AMP, from the same weights and the
    # same random numbers (dropout), the caller's random state kept
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        losses32, _, peak32, _, _ = _train(model, initial, batch, loss_fn, step, None,
                                                 make_optimizer, steps, warmup, device)
        torch.manual_seed(0)
        losses_amp, _, peak_amp, skipped, final_scale = _train(
            model, initial, batch, loss_fn, step, dtype, make_optimizer, steps, warmup, device,
            init_scale)
    # a skipped step leaves the weights as they were: AMP's loss after k applied updates is
    # compared with fp32's after k updates
    applied = [sum(not s for s in skipped[:i]) for i in range(len(skipped))]
    gaps = [loss_gap(a, losses32[k], losses32[0]) for a, k in zip(losses_amp, applied, strict=True)]
    gap = max(gaps) if all(math.isfinite(x) for x in losses_amp) else math.inf
    spread = _fp32_spread(model, initial, batch, loss_fn, step, make_optimizer, steps, device,
                          dtype, losses32)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        timed = _time_interleaved(model, initial, batch, loss_fn, step, dtype, make_optimizer,
                                  blocks, warmup, device, final_scale or init_scale)
    amp_run = f"AMP {dtype_name(dtype)}"
    runs = {"fp32": "fp32", "amp": amp_run}
    per_step = {mode: timed.step_times(run) for mode, run in runs.items()}
    ceiling = ceiling or matmul_ceiling(info, tuple(ceiling_sizes), steps=10, budget_s=0.5)
    name = dtype_name(dtype)
    tf32 = fp32_baseline(info) if kind == "cuda" else "not on this device (NVIDIA CUDA only)"
    report = Checkup(
        device=str(info), amp_dtype=name, dtype_why=_recommend(info, dtype),
        recommended=(f"{dtype_name(recommended_dtype(info))}: "
                     f"{_recommend(info, recommended_dtype(info))}"),
        grad_scaler=dtype == torch.float16, tf32=tf32, ops=ops, ranges=ranges,
        scale_needed=scale_needed, scale_max=scale_max, skipped_steps=skipped,
        final_scale=final_scale,
        losses={"fp32": losses32, name: losses_amp}, output_max_abs_diff=max_diff,
        output_rel_diff=rel, loss_rel_gap=gap,
        agrees=False,  # judged below, once the applied updates are counted
        first_nonfinite=str(bad) if bad is not None else None,
        timing_ms={m: t.median * 1e3 for m, t in per_step.items()},
        timing_iqr_ms={m: t.iqr * 1e3 for m, t in per_step.items()},
        timing_wait_share={m: timed.timings[run].wait_share for m, run in runs.items()},
        speed=timed.comparison(amp_run),
        peak_bytes={"fp32": peak32, "amp": peak_amp}, saved=saved,
        ceiling=ceiling.as_dict(),
        # the bench's rule: no ceiling where the dtype is emulated or the timings were noise
        ceiling_ratio=ceiling.ceiling(name) if name in ceiling.low_dtypes else None,
        ceiling_why=(ceiling.why_no_ceiling(name) if name in ceiling.low_dtypes
                     else f"{name} matmuls were not measured here"),
        op_overflows=op_overflows, init_scale=init_scale if dtype == torch.float16 else None,
        fp32_spread=spread, outputs_all_zero=not bool(ref.any()),
        fp32_faster=why_fp32_is_faster(info))
    # a run that compared too few applied AMP updates (the scaler skipped the others) is not
    # judged: its losses are those of the initial weights
    report.agrees = (rel <= AGREEMENT[dtype] and math.isfinite(gap)
                     and gap <= report.loss_tolerance and report.judged and report.discerning)
    report.advice = _advice(report, info, dtype)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m amp_tutorial.checkup module:function``: the check-up of what ``function()``
    returns, ``(model, batch, loss_fn)``, ``(model, batch)`` or a dict of ``amp_checkup``'s
    arguments (``{"model": ..., "batch": ..., "step": ...}``), as text or ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m amp_tutorial.checkup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="module:function returning (model, batch, loss_fn), "
                        "(model, batch) or a dict of amp_checkup's arguments")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), help="default: the device's")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    module_name, _, function = args.target.partition(":")
    try:
        if not function:
            raise CheckupError(f"{args.target!r} is not module:function (e.g. my_model:make)")
        sys.path.insert(0, os.getcwd())
        try:
            make = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as err:
            raise CheckupError(f"cannot load {args.target}: {err}") from err
        made = make()
        if isinstance(made, Mapping):
            made_args, made_options = (), dict(made)
        elif isinstance(made, (tuple, list)) and len(made) in (2, 3):
            made_args, made_options = tuple(made), {}
        else:
            raise CheckupError(f"{args.target} must return (model, batch, loss_fn), (model, "
                               "batch) or a dict of amp_checkup's arguments")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[args.dtype]
        try:
            report = amp_checkup(*made_args, **{"dtype": dtype, "steps": args.steps,
                                                **made_options})
        except TypeError as err:  # a dict with a key amp_checkup does not take
            raise CheckupError(f"{args.target} returned what amp_checkup does not take: "
                               f"{err}") from err
    except CheckupError as err:
        print(f"amp check-up: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
