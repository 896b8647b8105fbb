"""The ``contrastive_loss`` exercise (lesson 07): a loss kept in fp32 inside an autocast region,
and a checker that names mistakes.

``check_contrastive_loss(fn)`` calls the learner's function *inside* CPU autocast (float16, then
bfloat16), on 16-bit inputs built to break 16-bit math: dot products above float16's largest
value (65504), and small differences riding on a large common part, which 16-bit rounding erases.
Then drawn scenarios (``random.Random(7)``): other batch sizes, widths and temperatures;
float16, bfloat16 and float32 inputs; autocast on (either dtype) or off around the call; one call
under ``torch.no_grad()``. Every scenario runs the reference answer
(``exercises.solutions.contrastive_loss``) beside the learner's on the same inputs, in the same
autocast and grad mode, and compares the loss (and the gradients of both inputs) with it.
To say *why* a loss is wrong it watches the code run, never its source: a ``TorchFunctionMode``
notes whether autocast was on at each torch call the learner makes and what dtypes it passed, a
``TorchDispatchMode`` notes each kernel that computed in 16 bits, and a wrapper around
``autocast.__enter__`` notes which autocast regions were entered. A last run on fake CUDA tensors
with CUDA's autocast on (shapes and dtypes, no values) checks that the code is device-agnostic.
"""

from __future__ import annotations

import functools
import math
import numbers
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from amp_tutorial.autocast_policy import autocast_flags, fake_tensors
from amp_tutorial.exercises.checking import (
    RAISED,
    Attempt,
    CheckResult,
    Exercise,
    Problem,
    attempt,
    autocast_regions,
    error_problem,
    left_behind,
    stops,
    type_problem,
)
from amp_tutorial.exercises.solutions.contrastive_loss import contrastive_loss as reference_answer
from amp_tutorial.exercises.training_spy import simulated_name

# The problem: N_PAIRS (query, key) pairs of DIM features; small enough for about a second.
N_PAIRS = 16
DIM = 32
# How far a loss may be from the reference answer's on the same inputs, as a fraction of the
# largest logit: fp32 itself rounds each logit by up to 6e-8 of it, and correct fp32 spellings
# agree within 1e-7 of it on every scenario (measured, 2-core Zen 3, torch 2.14.1); 16-bit math
# misses by 2e-5 of it or more (by 1e-3 to 2 times the loss), on the drawn inputs too.
TOLERANCE = 2e-6
# Gradient components that cancel to 0 analytically keep fp32 noise of up to 0.25% of the largest
# gradient (logits near 1000 are exact to about 1e-4); a term detached from the graph puts the
# gradient off by 70% of the largest or more.
GRAD_ATOL = 0.03
DEVICE_TYPE = "cpu"  # float16 and bfloat16 autocast both run on the CPU
# fake tensors: each device's autocast policy, without the device (forward only: no backward)
SIMULATED_DEVICE_TYPES = ("cuda", "xpu", "mps")

# Problem keys: one per mistake the checker can name.
UNDER_AUTOCAST = "computed-under-autocast"
NOT_CAST = "inputs-not-cast"
AUTOCAST_STILL_ON = "cast-but-autocast-on"
OTHER_DEVICE = "autocast-off-for-another-device"
RESULT_DTYPE = "result-not-float32"
GRAPH_BROKEN = "graph-broken"
RETURNED_NUMBER = "returned-python-number"
WRONG_REDUCTION = "wrong-reduction"
WRONG_VALUE = "wrong-value"
WRONG_GRADIENT = "wrong-gradient"
__all__ = ["check_contrastive_loss", "make_cases",
           "reference_loss"]
PRAISE = ("All checks passed: under float16 and bfloat16 autocast your loss is float32, matches "
          "the fp32 reference on inputs that break 16-bit math and sends the right gradients to "
          "both inputs; on simulated CUDA tensors no op of yours ran in 16 bits either.")
EXERCISE = Exercise("07", "contrastive_loss", PRAISE, loops=(
    "any loop over the rows: the loss is a few whole-tensor operations (one matmul, "
    "cross_entropy), with no loop at all"))

LossFn = Callable[[torch.Tensor, torch.Tensor, float], object]
LOW = (torch.float16, torch.bfloat16)
# Kernels that move or make values without rounding them; views are recognised by their schema.
_NO_ARITHMETIC = frozenset({
    "_to_copy", "clone", "copy_", "_unsafe_view", "cat", "stack", "index", "index_select",
    "gather", "lift_fresh", "lift_fresh_copy", "detach", "alias", "empty", "empty_like",
    "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_empty",
    "new_empty_strided", "new_zeros", "new_ones", "new_full", "fill_", "zero_", "repeat", "flip",
    "roll", "scalar_tensor", "arange", "masked_select", "take", "tril", "triu", "where",
    "masked_fill", "masked_fill_", "constant_pad_nd", "diag_embed", "_unsafe_index", "resize_",
})


@dataclass(frozen=True, eq=False)
class Case:
    """One input: queries and keys (float32 values, exact in both 16-bit dtypes) and a temperature.
    """

    name: str
    queries: torch.Tensor
    keys: torch.Tensor
    temperature: float

    @functools.cached_property
    def tolerance(self) -> float:
        """How far a right loss may be from the fp32 reference: TOLERANCE of the largest logit."""
        logits = self.queries @ self.keys.T / self.temperature
        return TOLERANCE * logits.abs().max().item()


def make_cases(seed: int = 0) -> tuple[Case, Case]:
    """The two inputs every check runs, the same on every call; the global RNG is left alone.

    "large dot products": unnormalised embeddings whose dot products reach about 99,000, above
    float16's largest value (65504); the loss is large (about 4e5) but exact in fp32.
    "small differences": every query and key shares a first feature of 16, so each similarity is
    256 plus a small part of about 1 that tells the pairs apart; 16-bit rounding near 256
    (steps of 0.25 in float16, 2 in bfloat16) erases it.
    """
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    def exact(x: torch.Tensor) -> torch.Tensor:  # representable in float16 and in bfloat16
        return x.to(torch.bfloat16).float()

    large = Case("large dot products", exact(60 * randn(N_PAIRS, DIM)),
                 exact(60 * randn(N_PAIRS, DIM)), 0.1)
    parts = exact(0.15 * randn(N_PAIRS, DIM - 1))
    common = torch.full((N_PAIRS, 1), 16.0)
    small = Case("small differences", torch.cat([common, parts], 1),
                 torch.cat([common, exact(parts + 0.15 * randn(N_PAIRS, DIM - 1))], 1), 0.25)
    return large, small


def reference_loss(queries: torch.Tensor, keys: torch.Tensor, temperature: float
                   ) -> torch.Tensor:
    """The fp32 reference, outside autocast: query i's target is key i."""
    logits = queries.float() @ keys.float().T / temperature
    return F.cross_entropy(logits, torch.arange(len(queries), device=queries.device))


@dataclass(frozen=True)
class Scenario:
    """One run of the learner's function: the inputs' dtype, the caller's autocast dtype (None:
    no autocast around the call), the input, and whether the caller is under torch.no_grad()."""

    name: str
    dtype: torch.dtype
    amp_dtype: torch.dtype | None
    case: Case
    no_grad: bool = False


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


CASES = make_cases()
DRAW_SEED = 7
# The drawn scenarios, one per rule the lesson states: (input dtype, autocast dtype or None,
# under no_grad). The inputs (batch size, width, temperature, magnitude) are drawn for each.
DRAWN = (
    (torch.float32, torch.float16, False),  # fp32 asked whatever autocast does: fp32 inputs too
    (torch.float16, torch.bfloat16, False),  # an autocast dtype other than the inputs'
    (torch.bfloat16, None, False),  # no autocast around the call: 16-bit inputs as they are
    (torch.float32, None, False),  # nothing to undo: the same loss
    (torch.float16, torch.float16, True),  # an evaluation: under torch.no_grad(), no graph
    # fp32 inputs under no_grad: `.float()` returns the caller's own tensor, and nothing stops an
    # in-place change to it (with autograd on, a leaf that requires grad refuses one)
    (torch.float32, None, True),
)


def _drawn_case(rng: random.Random, index: int) -> Case:
    """A batch of ``n`` pairs of width ``dim`` whose logits spread by about ``spread`` around a
    positive pair a little above the rest: a loss of 0.1 to 10, neither 0 nor overflowing in
    fp32, so the temperature and every pair count; values exact in float16 and bfloat16."""
    n, dim = rng.randint(3, 40), rng.choice((4, 8, 24, 48, 64))
    temperature, spread = rng.choice((0.05, 0.1, 0.3, 0.7, 1.0)), rng.choice((3.0, 10.0, 30.0))
    scale = (temperature * spread / dim**0.5) ** 0.5  # q.k / t spreads by about `spread`
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    queries = scale * torch.randn(n, dim, generator=generator)
    keys = 2 / dim**0.5 * queries + scale * torch.randn(n, dim, generator=generator)
    exact = [x.to(torch.bfloat16).float() for x in (queries, keys)]
    return Case(f"drawn {index + 1}: {n} pairs of {dim}, temperature {temperature:g}", *exact,
                temperature)


def _drawn_scenarios(seed: int = DRAW_SEED) -> tuple[Scenario, ...]:
    rng = random.Random(seed)
    found = []
    for index, (dtype, amp_dtype, no_grad) in enumerate(DRAWN):
        case = _drawn_case(rng, index)
        around = f"under {_dtype(amp_dtype)} autocast" if amp_dtype else "no autocast"
        name = f"{_dtype(dtype)} inputs, {around}{', torch.no_grad()' if no_grad else ''}"
        found.append(Scenario(f"{name}, {case.name}", dtype, amp_dtype, case, no_grad))
    return tuple(found)


SCENARIOS = tuple(Scenario(f"{_dtype(dtype)}, {case.name}", dtype, dtype, case)
                  for dtype in LOW for case in CASES) + _drawn_scenarios()


# -- watching the learner's code run -----------------------------------------------------------
@dataclass(frozen=True)
class _Call:
    """A torch call the learner made: its name, whether autocast was on, the float dtypes given."""

    name: str
    autocast_on: bool
    inputs: tuple[torch.dtype, ...]


@dataclass(frozen=True)
class _LowKernel:
    """A kernel that computed in 16 bits, and the learner's call it ran in (None if unknown)."""

    op: str
    dtype: torch.dtype
    call: _Call | None


def _float_tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0]
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


class _CallWatch(TorchFunctionMode):
    """Notes, at each torch call of the learner's, the autocast state and the dtypes it passed."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.current: _Call | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        dtypes = tuple(t.dtype for t in _float_tensors((args, kwargs)))
        outer = self.current
        self.current = _Call(name, torch.is_autocast_enabled(self.device_type), dtypes)
        try:
            return func(*args, **kwargs)
        finally:
            self.current = outer


class _KernelWatch(TorchDispatchMode):
    """Notes each kernel that computed a float16 or bfloat16 result (casts and views excluded)."""

    def __init__(self, calls: _CallWatch) -> None:
        super().__init__()
        self.calls = calls
        self.low: list[_LowKernel] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _NO_ARITHMETIC or any(r.alias_info for r in func._schema.returns):
            return out
        low = [t.dtype for t in _float_tensors(out) if t.dtype in LOW]
        if low:
            self.low.append(_LowKernel(name, low[0], self.calls.current))
        return out


@dataclass
class _Watch:
    """What one run of the learner's function did."""

    device_type: str
    arrived: torch.dtype = torch.float16  # the inputs' dtype as the caller passed them
    calls: _CallWatch = field(init=False)
    kernels: _KernelWatch = field(init=False)
    regions: list[tuple[str, bool, str]] = field(default_factory=list)  # device, enabled, class

    def __post_init__(self) -> None:
        self.calls = _CallWatch(self.device_type)
        self.kernels = _KernelWatch(self.calls)

    @contextmanager
    def installed(self) -> Iterator[None]:
        with autocast_regions() as self.regions, self.calls, self.kernels:
            yield

    def cause(self) -> tuple[str, _LowKernel] | None:
        """Why the first 16-bit kernel ran in 16 bits (a problem key), or None if none did."""
        if not self.kernels.low:
            return None
        first = self.kernels.low[0]
        off_here = any(dev == self.device_type and not on for dev, on, _ in self.regions)
        off_elsewhere = any(dev != self.device_type and not on for dev, on, _ in self.regions)
        autocast_on = first.call.autocast_on if first.call else not off_here
        if not autocast_on:  # turned off here, or the caller had none: 16 bits as given
            return (NOT_CAST if off_here else UNDER_AUTOCAST), first
        if off_elsewhere and not off_here:
            return OTHER_DEVICE, first
        given = first.call.inputs if first.call else ()
        if given and not any(dtype in LOW for dtype in given) and self.arrived in LOW:
            return AUTOCAST_STILL_ON, first
        return UNDER_AUTOCAST, first

    def other_region(self) -> tuple[str, str]:
        """The device type and class of the first autocast(enabled=False) for another device."""
        return next((dev, kind) for dev, on, kind in self.regions
                    if dev != self.device_type and not on)


# -- the problems ------------------------------------------------------------------------------
_FIX = ("wrap the math in `with torch.autocast(device_type=queries.device.type, enabled=False):` "
       "and cast both inputs with `.float()` first thing inside it.")
_MATMUL_LISTS = ("On the CPU (as on CUDA) autocast's lower-precision list has the matmuls (`mm`, "
                 "`bmm`, `addmm`, `matmul`, `linear`: so `@`, `torch.matmul` and `einsum` too); "
                 "exp, log, sum and logsumexp are on no CPU list and keep the dtype they get.")


def _effect(value: torch.Tensor | None, reference: torch.Tensor | None) -> str:
    """What 16-bit math does to this loss, with the numbers of the checker's inputs."""
    large, small = CASES
    top = (large.queries @ large.keys.T).abs().max().item()
    common = small.queries[0, 0].item() ** 2
    steps = " in float16, ".join(f"{common * torch.finfo(d).eps:g}" for d in LOW)
    what = (f"float16's largest finite value is {torch.finfo(torch.float16).max:.0f}, so dot "
            f"products like those of the \"{large.name}\" inputs (up to {top:,.0f}) become inf "
            f"in float16, and 16-bit rounding near {common:g} (steps of {steps} in bfloat16) "
            f"erases the small differences that tell the \"{small.name}\" inputs' pairs apart.")
    if value is None or reference is None:  # fake tensors carry no values
        return f"Fake tensors carry no values, but on a GPU 16-bit math breaks this loss: {what}"
    return (f"Here that breaks the loss: {what} Your loss in the first run listed: "
            f"{value.item():.6g}, a right answer's in fp32: {reference.item():.6g}.")


def _cause_problem(key: str, kernel: _LowKernel, watch: _Watch, value: torch.Tensor | None = None,
                   reference: torch.Tensor | None = None) -> Problem:
    where, op = f'"{watch.device_type}"', f"`{kernel.op}`"
    low = f"16 bits ({_dtype(kernel.dtype)} in the first run listed)"
    if kernel.call and kernel.call.name != kernel.op:
        op += f" (in your `{kernel.call.name}` call)"
    effect = _effect(value, reference)
    if key == NOT_CAST:
        return Problem.named(
            NOT_CAST, "You turned autocast off, but the inputs arrived in 16 bits and stayed "
            f"so inside the region, and {op} ran in {low}.", "`autocast(enabled=False)` casts "
            "nothing: it only stops autocast from casting, and ops then run in the dtype they "
            f"are given, on every device. {effect}", "cast both inputs with `.float()` (or "
            "`.to(torch.float32)`) inside the region, before any math.")
    if key == AUTOCAST_STILL_ON:
        return Problem.named(
            AUTOCAST_STILL_ON, f"You cast the inputs to float32, but the {where} autocast was "
            f"still on and cast them back down: {op} got float32 inputs and ran in {low}.",
            f"{_MATMUL_LISTS} {effect}", _FIX)
    if key == OTHER_DEVICE:
        device, kind = watch.other_region()
        alias = (" (`torch.cuda.amp.autocast(...)` is the deprecated spelling of "
                 "`torch.autocast(\"cuda\", ...)`; it warns with a FutureWarning)"
                 if kind.startswith("torch.cuda.amp") else "")
        return Problem.named(
            OTHER_DEVICE, f"You turned autocast off for device_type \"{device}\"{alias}, but the "
            f"inputs are on {where}: that switched off the \"{device}\" autocast only, the "
            f"{where} one stayed on, and {op} ran in {low}.", "Each device type has its own "
            "autocast switch; the one that matters is the inputs' device (\"cuda\" on NVIDIA and "
            f"AMD GPUs, \"cpu\" here). {effect}", "take the device type from the inputs: `with "
            "torch.autocast(device_type=queries.device.type, enabled=False):`, then `.float()`.")
    if kernel.call is not None and not kernel.call.autocast_on:  # no autocast around the call
        return Problem.named(
            UNDER_AUTOCAST, f"Your loss was computed in 16 bits: with no autocast around the "
            f"call, {op} ran in {low} on the inputs as they came.", "The task asks for fp32 "
            f"math whatever the inputs' dtype and whatever autocast does. {effect}", _FIX)
    how = ("on the 16-bit inputs as they came" if watch.arrived in LOW else
           "autocast casting your float32 inputs down for it")
    return Problem.named(
        UNDER_AUTOCAST, f"Your loss was computed under the caller's autocast: {op} ran in {low}, "
        f"with autocast on, {how}.", f"{_MATMUL_LISTS} {effect}", _FIX)


def _value_problems(value: torch.Tensor, reference: torch.Tensor, case: Case) -> list[Problem]:
    """A float32 tensor whose value is not the reference's, every op having run in fp32."""
    ratio = value.item() / reference.item() if reference.item() else math.nan
    n = len(case.queries)
    if math.isclose(ratio, n, rel_tol=1e-3):
        return [Problem.named(
            WRONG_REDUCTION, f"Your loss is {n} times a right answer's: the sum over the "
            f"{n} pairs, not their mean.", "The task asks for the mean, so the loss "
            "does not grow with the batch size.", "`F.cross_entropy(logits, targets)` (its "
            "default reduction is 'mean'), or `.mean()` over the per-pair losses.")]
    what = (f"Your loss is {value.item():.6g}, a right answer's {reference.item():.6g} (on the "
            f"\"{case.name}\" inputs), though no op of yours ran in 16 bits.")
    formula = ("`F.cross_entropy(logits, torch.arange(len(queries), device=queries.device))` "
               "with `logits = queries @ keys.T / temperature`, in fp32.")
    if not math.isfinite(value.item()):
        top = (case.queries @ case.keys.T / case.temperature).abs().max().item()
        limit = math.log(torch.finfo(torch.float32).max)
        return [Problem.named(
            WRONG_VALUE, what, f"The logits here reach {top:.3g}, and exp overflows float32 "
            f"above about {limit:.1f}, so a hand-written log(exp(logits).sum()) is inf even in "
            "fp32.", "`torch.logsumexp(logits, dim=1)` or F.cross_entropy, which subtract each "
            f"row's maximum before exp: {formula}")]
    return [Problem.named(WRONG_VALUE, what, "So the formula differs from the task's: the mean "
                          "over i of the cross-entropy of row i of the logits with target i.",
                          formula)]


def _close(value: torch.Tensor, reference: torch.Tensor, case: Case) -> bool:
    """Within the case's tolerance of the reference rounded to the value's dtype (a wrong dtype
    is its own problem)."""
    rounded = reference.to(value.dtype).to(torch.float64)
    return bool(torch.isclose(value.detach().to(torch.float64), rounded, atol=case.tolerance,
                              rtol=torch.finfo(value.dtype).eps))


def _grad_close(grad: torch.Tensor, reference: torch.Tensor) -> bool:
    """Elementwise within two roundings to the gradient's dtype, or GRAD_ATOL of the largest.
    """
    rounded = reference.to(grad.dtype).float()
    return bool(torch.allclose(grad.float(), rounded, rtol=2 * torch.finfo(grad.dtype).eps,
                               atol=GRAD_ATOL * reference.abs().max().item()))


# -- the runs ----------------------------------------------------------------------------------
def _inputs(case: Case, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh leaf copies: float32 inputs must not be the case's own tensors (a learner's in-place
    change, or their gradients, would carry over to the next check)."""
    return (case.queries.to(dtype, copy=True).requires_grad_(),
            case.keys.to(dtype, copy=True).requires_grad_())


@contextmanager
def _caller(scenario: Scenario) -> Iterator[None]:
    """What the caller has on around the call: its autocast (or none) and its grad mode."""
    with torch.autocast(DEVICE_TYPE, dtype=scenario.amp_dtype or torch.bfloat16,
                        enabled=scenario.amp_dtype is not None), \
            torch.set_grad_enabled(not scenario.no_grad):
        yield


@functools.cache
def _reference(scenario: Scenario) -> tuple[torch.Tensor, torch.Tensor | None,
                                            torch.Tensor | None]:
    """The reference answer's loss and the gradients of both inputs (None under no_grad), called
    as the learner's function is: same inputs, same autocast, same grad mode."""
    queries, keys = _inputs(scenario.case, scenario.dtype)
    with _caller(scenario), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = reference_answer(queries, keys, scenario.case.temperature)
    if not scenario.no_grad:
        loss.backward()
    return loss.detach(), queries.grad, keys.grad


def _run(fn: LossFn, scenario: Scenario, call: Callable[..., Attempt] = attempt
         ) -> tuple[list[Problem], bool]:
    """The problems of one scenario, and whether its result is the reference answer's."""
    case = scenario.case
    reference, *reference_grads = _reference(scenario)
    queries, keys = _inputs(case, scenario.dtype)
    watch = _Watch(DEVICE_TYPE, scenario.dtype)
    with _caller(scenario), \
            left_behind("contrastive_loss", tensors={"queries": queries, "keys": keys}) as left, \
            watch.installed(), warnings.catch_warnings():  # the watch sees the learner's ops only
        warnings.simplefilter("ignore")  # the deprecated spellings warn; the problem names them
        run = call(fn, queries, keys, case.temperature)
    if left:
        return left, False
    if crashed := error_problem(run, "contrastive_loss"):
        return [crashed], False
    value = run.value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [Problem.named(
            RETURNED_NUMBER, f"contrastive_loss returned a Python {type(value).__name__} "
            f"({value:.6g}), not a tensor.", "`.item()` (or `float(...)`) gives a number with "
            "no autograd graph behind it, so the caller cannot call backward() on it and "
            "nothing trains.", "return the loss tensor itself, a 0-dim float32 tensor.")], False
    if wrong := type_problem(value, torch.Tensor, "contrastive_loss", "a 0-dim float32 tensor",
                             "return the loss tensor, e.g. `return F.cross_entropy(...)`."):
        return [wrong], False
    if value.shape != ():
        if value.shape == (len(case.queries),):
            return [Problem.named(
                WRONG_REDUCTION, f"contrastive_loss returned shape {tuple(value.shape)}: one "
                "loss per pair.", "The caller needs one number to call backward() on.",
                "return their mean: `F.cross_entropy(logits, targets)` with its default "
                "reduction='mean', or `.mean()`.")], False
        return [Problem.named(
            WRONG_VALUE, f"contrastive_loss returned a tensor of shape {tuple(value.shape)}.",
            "The loss is one number, the mean over the pairs.", "return a 0-dim tensor.")], False
    return _judge(value, queries, keys, watch, scenario, reference, reference_grads)


def _judge(value: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, watch: _Watch,
           scenario: Scenario, reference: torch.Tensor, reference_grads: list[torch.Tensor]
           ) -> tuple[list[Problem], bool]:
    """Problems with a returned 0-dim tensor: its value, dtype, graph and gradients (under
    no_grad there is no graph to judge), and whether it is the reference answer's result."""
    close, fp32 = value.is_floating_point() and _close(value, reference, scenario.case), \
        value.dtype == torch.float32
    grads_ok, detached = True, None
    if scenario.no_grad:
        pass  # an evaluation: nothing needs a graph, the value alone is judged
    elif not value.requires_grad:
        detached = "the returned loss does not require grad"
    elif close:
        backward = attempt(value.backward)
        if crashed := error_problem(backward, "loss.backward()"):
            return [crashed], False
        missing = [n for n, x in (("queries", queries), ("keys", keys)) if x.grad is None]
        if missing:
            detached = f"no gradient reached {' and '.join(missing)}"
        else:
            grads_ok = all(_grad_close(x.grad, g) for x, g in
                           zip((queries, keys), reference_grads, strict=True))
    found = []
    cause = watch.cause()
    if cause and not (close and fp32 and grads_ok):
        found.append(_cause_problem(*cause, watch, value.detach().float(), reference))
    elif not fp32:
        found.append(_dtype_problem(value.dtype))
    elif not close:
        found += _value_problems(value.detach(), reference, scenario.case)
    elif not grads_ok:
        found.append(Problem.named(
            WRONG_GRADIENT, "The loss value is right, but the gradients it sends back to queries "
            "and keys are not those of a right answer.", "Part of the loss is cut out of the "
            "graph (a `.detach()` on a term of it, say), so training would follow the wrong "
            "direction.", "build the whole loss from the inputs with differentiable ops, "
            "detaching nothing."))
    if detached:
        found.append(Problem.named(
            GRAPH_BROKEN, f"The loss is cut off from its inputs: {detached}.", "`.detach()`, "
            "`torch.no_grad()` or a tensor rebuilt from `.item()` leave nothing for backward() "
            "to follow, so the model that made the inputs would not train.", "return the loss "
            "tensor as computed; `.float()` and `autocast(enabled=False)` both keep the graph."))
    return found, close and fp32 and grads_ok and detached is None


def _dtype_problem(dtype: torch.dtype) -> Problem:
    if dtype in LOW:
        return Problem.named(
            RESULT_DTYPE, f"Your loss came back in {_dtype(dtype)}: the fp32 result was cast "
            "back down.", f"That rounds the loss to {_dtype(dtype)} (about "
            f"{-math.log10(torch.finfo(dtype).eps):.0f} significant digits) and hands the caller "
            "a 16-bit loss, undoing the fp32 region.", "return the float32 result as it is.")
    return Problem.named(
        RESULT_DTYPE, f"Your loss came back in {_dtype(dtype)}, not float32.", "The task, like "
        "autocast's own fp32 ops, returns float32.", "if you computed in float64, return "
        "`loss.float()`.")


_AUTOCAST_CAUSES = (UNDER_AUTOCAST, AUTOCAST_STILL_ON)


def _one_cause(found: list[tuple[str, list[Problem]]]) -> list[tuple[str, list[Problem]]]:
    """float32 inputs under autocast cannot tell "never cast" from "cast, autocast left on" (the
    cast changes nothing): there the mistake takes the key the 16-bit inputs' runs named."""
    fp32 = {s.name for s in SCENARIOS if s.dtype == torch.float32}
    named = [p.key for name, problems in found if name not in fp32 for p in problems
             if p.key in _AUTOCAST_CAUSES]
    if not named:
        return found
    return [(name, [Problem(named[0], p.message) if name in fp32 and p.key in _AUTOCAST_CAUSES
                    else p for p in problems]) for name, problems in found]


def _run_simulated(fn: LossFn, device_type: str, call: Callable[..., Attempt] = attempt
                   ) -> tuple[list[Problem], Attempt | None]:
    """The learner's function on fake ``device_type`` tensors with that device's float16
    autocast on: is it device-agnostic? Only the kernels' dtypes are judged; fake tensors have no
    values, and nothing requires grad (autograd on fake MPS and XPU tensors can abort)."""
    watch = _Watch(device_type)
    case = CASES[0]
    try:
        with fake_tensors():
            queries, keys = (torch.empty(N_PAIRS, DIM, dtype=torch.float16,
                                         device=device_type) for _ in range(2))
            with left_behind("contrastive_loss") as left, \
                    autocast_flags(device_type, torch.float16), watch.installed(), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run = call(fn, queries, keys, case.temperature)
    except RuntimeError:  # this torch build has no such fake tensors: nothing to simulate
        return [], None
    if run.error is not None and "is not linked with support for" in str(run.error):
        return left, None  # an op the fake device cannot run here (no device guard): not judged
    cause = watch.cause()
    return ([_cause_problem(*cause, watch)] if cause else []) + left, run


def _untimed(fn: LossFn, *args: object) -> Attempt:
    return Attempt(value=fn(*args))


def _in_fp32_region(queries: torch.Tensor, keys: torch.Tensor, temperature: float
                    ) -> torch.Tensor:
    with torch.autocast(queries.device.type, enabled=False):
        return reference_loss(queries, keys, temperature)


@functools.cache
def _warm_up() -> None:
    """Run a right answer through every watcher once, without a time limit: the first use of a
    dispatch mode or of fake tensors imports ``torch._dynamo`` (seconds; more without .pyc files),
    which must neither count against the learner's time nor be cut off halfway by it."""
    _run(_in_fp32_region, SCENARIOS[0], _untimed)
    _run_simulated(_in_fp32_region, "cuda", _untimed)


@EXERCISE.checker
def check_contrastive_loss(fn: LossFn) -> CheckResult:
    """Call ``fn(queries, keys, temperature)`` inside CPU autocast (float16 and bfloat16, two
    inputs each), then in the drawn scenarios (other shapes, temperatures and input dtypes,
    autocast on or off, torch.no_grad()), beside the reference answer, then on simulated CUDA
    tensors, and name every mistake.

    An op that fake XPU or MPS tensors cannot run in this torch build ("not linked with support")
    leaves that device unjudged.

    ``fn`` must return the mean InfoNCE loss (query i's positive is key i) as a 0-dim float32
    tensor that matches the reference answer's and passes gradients back to both inputs.
    """
    _warm_up()
    found, matched = [], []
    for scenario in SCENARIOS:
        problems, right = _run(fn, scenario)
        found.append((scenario.name, problems))
        matched.append(right)
        if stops(problems):
            return EXERCISE.report(found)  # the rest would only say it again
    found = _one_cause(found)
    if all(matched):  # the reference answer's result everywhere: however it is written
        found = [(name, [p for p in problems if p.key not in RESULT_KEYS])
                 for name, problems in found]
    for device_type in SIMULATED_DEVICE_TYPES:
        problems, run = _run_simulated(fn, device_type)
        found.append((simulated_name(device_type), problems))
        if run is not None and not any(problems for _, problems in found):
            if crashed := error_problem(run, f"contrastive_loss on fake {device_type} tensors "
                                        "(shapes and dtypes only, the checker's stand-in for "
                                        "the device)"):
                if "device" in str(run.error):
                    crashed = Problem(RAISED, f"{crashed.message} Make every tensor you create "
                                      "on the inputs' device: `torch.arange(len(queries), "
                                      "device=queries.device)`.")
                found.append((simulated_name(device_type), [crashed]))
    return EXERCISE.report(found)


# What only describes a result: where the result is the reference answer's in every scenario,
# none of these rejects the answer (a different spelling of the same loss is right).
RESULT_KEYS = frozenset({WRONG_VALUE, WRONG_REDUCTION, WRONG_GRADIENT, RESULT_DTYPE, GRAPH_BROKEN})
