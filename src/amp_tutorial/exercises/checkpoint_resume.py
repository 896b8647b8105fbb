"""The ``save`` / ``load`` exercise (lesson 05): a checkpoint that resumes AMP training exactly.

``check_save_and_load(save, load)`` trains lesson 06's small MLP behind a BatchNorm (whose running
statistics are buffers, not parameters) on the CPU, with a learning rate that decays every step as
a schedule would set it (so ``optimizer.param_groups`` carries state), in a few scenarios
(:data:`SCENARIOS`): float16 with a GradScaler whose scale grows every few steps, after steps it
skipped (their targets are huge, so their gradients overflow), and bfloat16 with a disabled
scaler; Adam (moments and a step count) and SGD with momentum; saves after different numbers of
steps. In each it saves with the learner's ``save``, loads with the learner's ``load`` into fresh
objects (other initial weights), trains the rest, and compares the result (the step returned, the
final model, optimizer and scaler states, the scale after every step) with the same resume done by
the reference answer (``exercises.solutions.save_and_load``), whose result is bit for bit the
uninterrupted run's (tested). A right resume is exact: any files the learner picks (one dict, files
beside it, the scaler's state in JSON) pass if the result is the reference's in every scenario.
The rules the lesson states in words hold whatever the result: the checkpoint is at the path given,
``load`` reads the path it is given (the files are moved to another folder first), ``torch.load``
reads every torch file with its default ``weights_only=True``, and neither call leaves anything
else changed (``checking.left_behind``). Where a result differs, what ``save`` wrote and what
``load`` restored name the part that was lost. No randomness is drawn after the resume (fixed
batches, no dropout), so the checker asks for no RNG state.
"""

from __future__ import annotations

import copy
import functools
import json
import numbers
import pickle
import random
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from amp_tutorial.exercises.checking import (
    CheckResult,
    Exercise,
    Problem,
    attempt,
    error_problem,
    left_behind,
    type_problem,
)
from amp_tutorial.exercises.solutions.save_and_load import load as reference_load
from amp_tutorial.exercises.solutions.save_and_load import save as reference_save
from amp_tutorial.exercises.train_loop import make_exercise_problem
from amp_tutorial.exercises.training_spy import check_against_reference

STEPS = 8
SAVE_AT = 3  # the course's scenario: 5 steps after the resume, so a lost growth count shows
LEARNING_RATE = {"Adam": 1e-2, "SGD": 0.05}
MOMENTUM = 0.9  # SGD's momentum buffers: state a resumed run needs, as Adam's moments are
INIT_SCALE = 256.0
GROWTH_INTERVAL = 2  # the scale doubles every 2 good steps: 256 -> 2048 over the course's run
SKIPPED_AT = 1  # this step's targets are OVERFLOW_TARGETS times larger: its gradients overflow
OVERFLOW_TARGETS = 1e6  # float16 and the scaler skips it (scale 256 -> 128; Adam's step count 2)
LR_DECAY = 0.9  # lr times 0.9 after every step, as ExponentialLR would: a fresh Adam has lr 1e-2
DEVICE_TYPE = "cpu"  # float16 autocast and GradScaler("cpu") run on the CPU
DRAW_SEED = 44  # random.Random(DRAW_SEED) draws the other scenarios' counts (issue 44)

# Problem keys: one per mistake the checker can name.
NOTHING_WRITTEN = "nothing-written-at-path"
SAVED_ELSEWHERE = "checkpoint-not-at-path"
LOAD_IGNORES_PATH = "load-reads-another-path"
OBJECTS_SAVED = "objects-pickled"
MODEL_NOT_SAVED = "model-not-saved"
OPTIMIZER_NOT_SAVED = "optimizer-not-saved"
PARAM_GROUPS_LOST = "optimizer-param-groups-lost"
BUFFERS_LOST = "model-buffers-lost"
SCALER_NOT_SAVED = "scaler-not-saved"
SCALE_ONLY = "scale-without-growth-tracker"
OTHER_SCALER_SAVED = "another-scalers-state-saved"
NOT_LOADED = "state-not-loaded-into-object"
WEIGHTS_DOWNCAST = "weights-in-low-precision"
WRONG_STEP = "wrong-step"
RESUME_DIFFERS = "resume-differs"
UNSAFE_LOAD = "torch-load-weights-only-false"
__all__ = ["check_save_and_load"]
PRAISE = ("All checks passed: in every scenario (float16 with a GradScaler after skipped steps, "
          "bfloat16 with a disabled one; Adam and SGD with momentum; saved after different "
          "steps) the run loaded into fresh objects resumed at the right step and ended bit for "
          "bit like the uninterrupted one (parameters and BatchNorm's running statistics, the "
          "optimizer's state and its decayed learning rate, the GradScaler's scale and growth "
          "count).")
EXERCISE = Exercise("05", "save_and_load", PRAISE, loops=(
    "save and load: each needs no loop, one torch.save of a dict and one torch.load; a loop "
    "that waits for the file, or re-reads it until something changes, does not end"))


@dataclass(frozen=True)
class Scenario:
    """One checkpointed run: the optimizer, the autocast dtype (float16 with an enabled
    GradScaler, bfloat16 with a disabled one), the scaler's settings, the steps whose gradients
    overflow (float16 only), the step saved after and the steps in all."""

    name: str
    optimizer: str  # "Adam" or "SGD" (with momentum)
    amp_dtype: torch.dtype = torch.float16
    init_scale: float = INIT_SCALE
    growth_interval: int = GROWTH_INTERVAL
    skipped: tuple[int, ...] = (SKIPPED_AT,)  # steps with OVERFLOW_TARGETS times the targets
    save_at: int = SAVE_AT
    steps: int = STEPS

    @property
    def scaler_enabled(self) -> bool:
        return self.amp_dtype == torch.float16


def _draw_scenarios() -> tuple[Scenario, ...]:
    """The course's scenario (float16, Adam, saved after step 3 of 8, step 1 skipped), then
    scenarios whose counts ``random.Random(DRAW_SEED)`` draws: SGD in float16 (two steps before
    the save skipped), Adam in float16 from a scale that overflows the first steps, and both
    optimizers in bfloat16 with a disabled scaler. Every float16 draw saves with a growth count
    above 0, at a scale other than ``init_scale`` (a fresh scaler's), and trains at least
    ``growth_interval`` steps on, so a lost count shows (tested)."""
    rng = random.Random(DRAW_SEED)
    sgd_at = rng.randint(3, 5)
    high_at = rng.randint(4, 6)
    return (
        Scenario("float16, Adam", "Adam"),
        Scenario("float16, SGD", "SGD", init_scale=rng.choice((128.0, 512.0, 1024.0)),
                 growth_interval=3, skipped=tuple(sorted(rng.sample(range(sgd_at - 1), 2))),
                 save_at=sgd_at,
                 steps=sgd_at + rng.randint(4, 6)),
        Scenario("float16, Adam, from a scale that overflows", "Adam", init_scale=2.0**20,
                 growth_interval=rng.choice((2, 3)), skipped=(), save_at=high_at,
                 steps=high_at + rng.randint(4, 6)),
        Scenario("bfloat16, Adam, scaler disabled", "Adam", torch.bfloat16, skipped=(),
                 save_at=(at := rng.randint(2, 5)), steps=at + rng.randint(3, 5)),
        Scenario("bfloat16, SGD, scaler disabled", "SGD", torch.bfloat16, skipped=(),
                 save_at=(at := rng.randint(2, 5)), steps=at + rng.randint(3, 5)),
    )


SCENARIOS = _draw_scenarios()
SCENARIO = SCENARIOS[0].name


@dataclass
class Run:
    """The objects one training run holds: what a checkpoint must carry."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    scenario: Scenario = SCENARIOS[0]
    scales: list[float] = field(default_factory=list)  # the scale after each step

    @classmethod
    def start(cls, seed: int = 0, scenario: Scenario = SCENARIOS[0]) -> Run:
        mlp, _ = make_exercise_problem(seed)
        model = nn.Sequential(nn.BatchNorm1d(mlp[0].in_features), *mlp)  # buffers to carry
        lr = LEARNING_RATE[scenario.optimizer]
        optimizer = (torch.optim.Adam(model.parameters(), lr=lr) if scenario.optimizer == "Adam"
                     else torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM))
        return cls(model, optimizer,
                   torch.amp.GradScaler(DEVICE_TYPE, init_scale=scenario.init_scale,
                                        growth_interval=scenario.growth_interval,
                                        enabled=scenario.scaler_enabled), scenario)

    def train(self, first: int, last: int) -> None:
        """Steps ``first`` to ``last - 1``: step ``i`` uses batch ``i % len(batches)``."""
        batches = _batches()
        for step in range(first, last):
            inputs, targets = batches[step % len(batches)]
            if step in self.scenario.skipped:
                targets = targets * OVERFLOW_TARGETS
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast(DEVICE_TYPE, dtype=self.scenario.amp_dtype):
                loss = nn.functional.mse_loss(self.model(inputs), targets)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            for group in self.optimizer.param_groups:  # what a learning-rate schedule does
                group["lr"] *= LR_DECAY
            self.scales.append(self.scaler.get_scale())

    def state(self) -> dict[str, Any]:
        """A deep copy of everything the next step depends on."""
        return copy.deepcopy({"model": self.model.state_dict(),
                              "optimizer": self.optimizer.state_dict(),
                              "scaler": self.scaler.state_dict()})


@functools.cache
def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return make_exercise_problem()[1]


@dataclass(frozen=True)
class Result:
    """How a resumed run ended: the step load returned, the final states, the scale after each
    step from the resume on."""

    step: int
    state: dict[str, Any]
    scales: tuple[float, ...]


def _numerics() -> tuple[object, ...]:
    """What decides the last bits of a CPU run besides its inputs: the thread count (it splits
    the BatchNorm and matmul sums differently) and the matmul settings. The runs kept between
    checks are kept per value, so a learner who changes them between checks is not compared
    with a run made under others."""
    return (torch.get_num_threads(), torch.get_float32_matmul_precision(),
            torch.backends.mkldnn.enabled)


def uninterrupted(scenario: Scenario) -> Result:
    """The run that never stopped (its scales from the save on, as a resumed run sees them)."""
    return _uninterrupted(scenario, _numerics())


@functools.cache
def _uninterrupted(scenario: Scenario, numerics: tuple[object, ...]) -> Result:
    run = Run.start(scenario=scenario)
    run.train(0, scenario.steps)
    return Result(scenario.save_at, run.state(), tuple(run.scales[scenario.save_at:]))


def _first_half(scenario: Scenario) -> dict[str, Any]:
    return _first_half_under(scenario, _numerics())


@functools.cache
def _first_half_under(scenario: Scenario, numerics: tuple[object, ...]) -> dict[str, Any]:
    run = Run.start(scenario=scenario)
    run.train(0, scenario.save_at)
    return run.state()


def _saved_run(scenario: Scenario) -> Run:
    """The run as it is after ``save_at`` steps, when it is saved: its states trained once and
    loaded into new objects (bit for bit the same run, trained once per process)."""
    run, state = Run.start(scenario=scenario), copy.deepcopy(_first_half(scenario))
    for name in ("model", "optimizer", "scaler"):
        getattr(run, name).load_state_dict(state[name])
    return run


def reference_result(scenario: Scenario) -> Result:
    """The reference answer's resume: saved after ``save_at`` steps, loaded into fresh objects,
    trained to the end."""
    return _reference_result(scenario, _numerics())


@functools.cache
def _reference_result(scenario: Scenario, numerics: tuple[object, ...]) -> Result:
    first = Run.start(scenario=scenario)
    first.train(0, scenario.save_at)
    resumed = Run.start(seed=1, scenario=scenario)
    assert same(first.state(), _first_half(scenario))  # what _saved_run hands to save
    with tempfile.TemporaryDirectory(prefix="amp_checkpoint_reference_") as folder:
        path = Path(folder) / "checkpoint.pt"
        reference_save(path, first.model, first.optimizer, first.scaler, scenario.save_at)
        step = reference_load(path, resumed.model, resumed.optimizer, resumed.scaler)
    resumed.train(step, scenario.steps)
    return Result(step, resumed.state(), tuple(resumed.scales))


def same(a: object, b: object) -> bool:
    """Equal all the way down; tensors bit for bit, with the same dtype."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# -- what save wrote -------------------------------------------------------------------------------
@dataclass
class Written:
    """What the files ``save`` wrote hold, as ``torch.load(weights_only=True)`` reads them."""

    files: int = 0  # how many files save wrote in the checkpoint's folder
    refused: str = ""  # torch.load's error for a file of pickled objects
    model: list[Mapping] = field(default_factory=list)  # model state dicts found
    optimizer: bool = False  # an optimizer state dict ("state" and "param_groups") was found
    scaler: bool = False  # a GradScaler state dict (with "_growth_tracker") was found
    scalers: list[Mapping] = field(default_factory=list)  # the GradScaler state dicts found


def _parts(value: object, depth: int = 0) -> Iterator[object]:
    """``value`` and the values nested in it (dicts, lists, tuples), a few levels deep."""
    yield value
    if depth < 4 and isinstance(value, Mapping):
        for item in value.values():
            yield from _parts(item, depth + 1)
    elif depth < 4 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _parts(item, depth + 1)


def _read(path: Path) -> tuple[object, str]:
    """What a file holds, as ``torch.load(weights_only=True)`` reads a torch file, or as JSON;
    and torch.load's refusal where the torch file holds pickled objects. A file of neither kind
    (a log, a temporary file, a pickle of plain values) holds nothing the checker reads."""
    try:
        return torch.load(path, weights_only=True), ""
    except pickle.UnpicklingError as error:
        if zipfile.is_zipfile(path) or "Unsupported global" in str(error):
            return None, str(error)  # torch.save's own file, with pickled classes in it
    except Exception:  # noqa: BLE001 - not a torch file: perhaps JSON
        pass
    try:
        return json.loads(path.read_text()), ""
    except (ValueError, UnicodeDecodeError):
        return None, ""


def _read_written(folder: Path, model_keys: set[str]) -> Written:
    written = Written()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        written.files += 1
        content, refused = _read(path)
        written.refused = written.refused or refused
        for part in _parts(content):
            if isinstance(part, Mapping) and set(part) == model_keys:
                written.model.append(part)
            elif isinstance(part, Mapping) and {"state", "param_groups"} <= set(part):
                written.optimizer = True
            elif isinstance(part, Mapping) and {"scale", "_growth_tracker"} <= set(part):
                written.scaler = True
                written.scalers.append(part)
    return written


def _refusal_quote(refused: str) -> str:
    """The sentences of torch.load's refusal that say what happened."""
    found = re.search(r"Unsupported global: GLOBAL \S+ was not an allowed global by default",
                      refused)
    return "Weights only load failed. ... " + found.group(0) + "." if found else refused[:200]


# -- what load restored ----------------------------------------------------------------------------
@dataclass
class Resumed:
    """How the resumed run ended against the reference answer's resume (which ends bit for bit
    like the uninterrupted run)."""

    error: BaseException | None = None
    result: Result | None = None
    matches: bool = False  # the step, the final states and every scale are the reference's
    params_equal: bool = False
    scale_gap: str = ""  # the first step whose scale differs, in words


def _finish(resumed: Run, step: int, scenario: Scenario) -> Resumed:
    """Train the resumed run from ``step`` to the end and compare with the reference's resume."""
    right = reference_result(scenario)
    if not 0 <= step <= scenario.steps:
        return Resumed()
    run = attempt(resumed.train, step, scenario.steps)
    if run.error is not None:
        return Resumed(error=run.error)
    result = Result(step, resumed.state(), tuple(resumed.scales))
    ended = Resumed(result=result, params_equal=all(
        torch.equal(p, right.state["model"][name]) for name, p in
        resumed.model.named_parameters()))
    for i, (got, want) in enumerate(zip(result.scales, right.scales, strict=False),
                                    scenario.save_at + 1):
        if got != want:
            ended.scale_gap = (f"after step {i} its scale was {got:g}, the uninterrupted "
                               f"run's {want:g}")
            break
    ended.matches = (step == right.step and result.scales == right.scales
                     and same(result.state, right.state))
    return ended


def _how_it_ended(resumed: Resumed) -> str:
    if resumed.error is not None or resumed.result is None:
        return ""
    if resumed.scale_gap:
        return f" Resumed like this, {resumed.scale_gap}."
    if not resumed.params_equal:
        return " Resumed like this, the parameters ended different from the uninterrupted run's."
    return ""


SIGNIFICANT_BITS = {torch.float16: 11, torch.bfloat16: 8}


def _split(state: Mapping[str, Any], buffers: set[str]) -> tuple[dict, dict]:
    """A model state dict as (parameters, buffers)."""
    return ({k: v for k, v in state.items() if k not in buffers},
            {k: v for k, v in state.items() if k in buffers})


def _state_problems(saved: dict[str, Any], now: dict[str, Any], written: Written,
                    ended: Resumed, buffers: set[str], init_scale: float) -> list[Problem]:
    """Which part of the saved state the fresh objects lack right after load (``now``), and
    why. ``buffers``: the names of the model's buffers in its state dict."""
    found, not_loaded = [], []
    outcome = _how_it_ended(ended)
    (now_params, now_buffers), (saved_params, saved_buffers) = (
        _split(now["model"], buffers), _split(saved["model"], buffers))
    if same(now_params, saved_params) and not same(now_buffers, saved_buffers):
        found.append(Problem.named(
            BUFFERS_LOST, "After load the model's parameters were the saved ones, but its "
            "buffers (BatchNorm's running_mean, running_var and num_batches_tracked) were a "
            "fresh model's.", "Buffers are state too, kept in model.state_dict() but not in "
            "model.parameters() or named_parameters(): the resumed model evaluates (in eval "
            "mode) with running statistics back at their initial values (mean 0, variance 1), "
            "and goes on updating them from there.", "save model.state_dict() (parameters and "
            "buffers) and restore it with model.load_state_dict(...), strict as it is by default."))
    elif not same(now["model"], saved["model"]):
        low = {t.dtype for part in [*written.model, now["model"]] for t in part.values()
               if t.dtype in SIGNIFICANT_BITS}
        if low:
            names = " and ".join(sorted(str(d).removeprefix("torch.") for d in low))
            bits = min(SIGNIFICANT_BITS[d] for d in low)
            found.append(Problem.named(
                WEIGHTS_DOWNCAST, f"The model's weights came back rounded to {names}: they were "
                "saved or loaded in that dtype instead of the fp32 that training holds.", "AMP "
                "keeps the weights in fp32 (autocast casts copies inside the forward pass); "
                f"{names} keeps {bits} significant bits of fp32's 24, so the resumed run started "
                f"from rounded weights.{outcome}", "save model.state_dict() as it is and load it "
                "with model.load_state_dict(...): no .half() or .to(dtype) anywhere."))
        elif written.model:
            not_loaded.append("model")
        else:
            found.append(Problem.named(
                MODEL_NOT_SAVED, "After load the model's parameters were not the saved ones, and "
                "no file save wrote holds the model's state dict.", "optimizer.state_dict() "
                "holds Adam's moments and the hyperparameters, not the parameters themselves: "
                f"the resumed run trained from fresh weights.{outcome}",
                "save model.state_dict() and restore it with model.load_state_dict(...)."))
    if not same(now["optimizer"], saved["optimizer"]):
        if same(now["optimizer"]["state"], saved["optimizer"]["state"]):
            lrs = [g["lr"] for g in saved["optimizer"]["param_groups"]]
            got = [g["lr"] for g in now["optimizer"]["param_groups"]]
            found.append(Problem.named(
                PARAM_GROUPS_LOST, "After load the optimizer's per-parameter state (Adam's "
                "moments, SGD's momentum) was the saved one, but its "
                f"param_groups were not: learning rate {got[0]:g} where the saved run had "
                f"{lrs[0]:g}.", "optimizer.param_groups hold the learning rate a schedule "
                "has set (and the other hyperparameters); a fresh optimizer starts again from "
                f"the one it was built with, so the resumed steps are too long.{outcome}",
                "save the whole optimizer.state_dict() ('state' and 'param_groups') and restore "
                "it with optimizer.load_state_dict(...)."))
        elif written.optimizer:
            not_loaded.append("optimizer")
        else:
            found.append(Problem.named(
                OPTIMIZER_NOT_SAVED, "After load the optimizer's state was not the saved one, "
                "and no file save wrote holds an optimizer state dict.", "Adam keeps, for "
                "every parameter, running averages of the gradient and of its square and a step "
                "count, SGD with momentum a running sum of past steps; a fresh optimizer starts "
                "them again from zero, so the resumed steps differ from the uninterrupted "
                f"ones.{outcome}", "save optimizer.state_dict() and "
                "restore it with optimizer.load_state_dict(...)."))
    found += _scaler_problems(now["scaler"], saved["scaler"], written, not_loaded, outcome,
                              init_scale)
    if not_loaded == ["optimizer"] and not now["optimizer"]["state"]:
        found.append(Problem.named(
            NOT_LOADED, "The checkpoint holds the optimizer state, but after load the "
            "optimizer passed to load still had a fresh optimizer's state (no per-parameter "
            "state at all): nothing was loaded into it.", "load skipped the optimizer: a "
            "condition that was false or a key that save did not write (the keys load reads "
            "must be the ones save wrote). The resumed run starts Adam's moments and step "
            f"count (SGD's momentum) again from zero.{outcome}", "load the optimizer's state "
            "dict, under the key save wrote it, into the optimizer you were given: "
            "optimizer.load_state_dict(checkpoint['optimizer'])."))
        not_loaded = []
    if not_loaded:
        names = ", ".join(not_loaded)
        found.append(Problem.named(
            NOT_LOADED, f"The checkpoint holds the {names} state, but after load the {names} "
            "passed to load did not have it.", "The caller trains on the objects it passed in; "
            "a name rebound inside load (optimizer = torch.optim.Adam(...), or a new GradScaler) "
            "is a new object the caller never sees, and the state dict loaded into it is "
            f"lost.{outcome}", "load each state dict into the object you were given: "
            "model.load_state_dict(...), optimizer.load_state_dict(...), "
            "scaler.load_state_dict(...)."))
    return found


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _same_scaler(part: Mapping, saved: Mapping) -> bool:
    """A scaler state dict found in the files carries the saved run's scale and growth count."""
    try:
        return (float(part["scale"]) == float(saved["scale"])
                and int(part["_growth_tracker"]) == int(saved["_growth_tracker"]))
    except (KeyError, TypeError, ValueError):
        return True  # not readable as numbers: leave it to the checks on the result


def _scaler_problems(now: dict[str, Any], saved: dict[str, Any], written: Written,
                     not_loaded: list[str], outcome: str, init_scale: float) -> list[Problem]:
    """``init_scale``: the fresh scaler's, which a scaler whose state was lost still has."""
    if same(now, saved):
        return []
    if not saved or not now:  # a disabled scaler has no state: what differs is the scaler
        return [Problem.named(
            SCALER_NOT_SAVED, f"After load the GradScaler's state was {dict(now)!r:.120} where "
            f"the saved run's was {dict(saved)!r:.120}.", "A disabled GradScaler (bfloat16) "
            f"has no state, an enabled one its scale and growth count.{outcome}",
            "save scaler.state_dict() as it is and restore it with "
            "scaler.load_state_dict(...), which does nothing for a disabled scaler.")]
    had = f"scale {saved['scale']:g} and growth count {saved['_growth_tracker']}"
    got = f"scale {now['scale']:g} and growth count {now['_growth_tracker']}"
    if now["scale"] == saved["scale"] != init_scale:  # at init_scale: a fresh scaler, too
        return [Problem.named(
            SCALE_ONLY, f"After load the GradScaler had {got} where the saved run had {had}: "
            "the scale was carried over, but not the rest of scaler.state_dict().", "The growth "
            "count is the number of good steps since the scale last changed; the scale doubles "
            f"when it reaches growth_interval ({saved['growth_interval']} here), so a resumed "
            f"run that restarts the count grows the scale at other steps.{outcome}", "save "
            "scaler.state_dict() (scale, growth and backoff factors, growth interval, growth "
            "count) and restore it with scaler.load_state_dict(...).")]
    if written.scalers and not any(_same_scaler(part, saved) for part in written.scalers):
        part = written.scalers[0]
        held = (f"scale {_number(part.get('scale'))} and growth count "
                f"{_number(part.get('_growth_tracker'))}")
        fresh = (" (a freshly built GradScaler's: its initial scale and a count of 0)"
                 if part.get("_growth_tracker") == 0 else "")
        return [Problem.named(
            OTHER_SCALER_SAVED, f"The GradScaler state that save wrote is not the run's: the "
            f"file holds {held}{fresh}, where the scaler passed to save had {had}.", "save "
            "must store the state of the scaler it is given, the one the run trained with; the "
            "state of another GradScaler (one built inside save, say) throws away the scale "
            "the run has learned and its growth count, and load then restores that other "
            f"state.{outcome}", "save scaler.state_dict() of the scaler passed to save, "
            "and restore it with scaler.load_state_dict(...).")]
    if written.scaler:
        not_loaded.append("scaler")
        return []
    return [Problem.named(
        SCALER_NOT_SAVED, f"After load the GradScaler had {got} where the saved run had {had}, "
        "and no file save wrote holds a GradScaler state dict.", "A fresh GradScaler starts "
        "again at its init_scale (on any device), so a resumed float16 run re-learns the "
        "scale: steps at a scale that overflows are skipped, and steps at a scale too small "
        f"let small gradients underflow.{outcome}", "save scaler.state_dict() and restore it with "
        "scaler.load_state_dict(...).")]


# -- the check -------------------------------------------------------------------------------------
@EXERCISE.checker
def check_save_and_load(save: Callable[..., object], load: Callable[..., object]) -> CheckResult:
    """Save mid-run with ``save``, resume fresh objects with ``load``, and name what was lost.

    ``save(path, model, optimizer, scaler, step)`` writes a checkpoint at ``path`` (a
    ``pathlib.Path`` in an empty folder; more files beside it are fine), and
    ``load(path, model, optimizer, scaler)`` restores it into the objects given and returns the
    step. Each of :data:`SCENARIOS` is resumed beside the reference answer; a result equal to its
    result in every scenario passes, whatever files hold it. About a second on a laptop CPU.
    """
    return check_against_reference(EXERCISE, SCENARIOS,
                                   lambda scenario: _problems(save, load, scenario),
                                   lambda device_type: [], {RESUME_DIFFERS}, RESULT_KEYS)


def _problems(save: Callable[..., object], load: Callable[..., object], scenario: Scenario
              ) -> tuple[list[Problem], bool]:
    """One scenario's problems, and whether its result is the reference answer's."""
    first = _saved_run(scenario)
    saved = first.state()
    resumed = Run.start(seed=1, scenario=scenario)  # other weights: all must come from the file
    with tempfile.TemporaryDirectory(prefix="amp_checkpoint_") as folder, \
            tempfile.TemporaryDirectory(prefix="amp_checkpoint_moved_") as moved:
        path = Path(folder) / "checkpoint.pt"
        with left_behind("save", models={"model": first.model}) as left:
            saving = attempt(save, path, first.model, first.optimizer, first.scaler,
                             scenario.save_at)
        if saving.error is not None:
            return [_without_paths(error_problem(saving, "save"), folder, note=True)], False
        at_path = path.is_file()
        written = _read_written(Path(folder), set(saved["model"]))
        for item in Path(folder).iterdir():  # load gets the files in another folder
            shutil.move(item, Path(moved) / item.name)
        with left_behind("load", models={"model": resumed.model}) as left_by_load, \
                _torch_load_calls() as load_calls:
            loading = attempt(load, Path(moved) / path.name, resumed.model, resumed.optimizer,
                              resumed.scaler)
    found = left + [p for p in left_by_load if p.key not in {q.key for q in left}]
    if not written.refused and any(call.get("weights_only") is False for call in load_calls):
        found.append(Problem.named(
            UNSAFE_LOAD, "load calls torch.load(..., weights_only=False) on a checkpoint that "
            "holds only tensors, state dicts and plain values.", "weights_only=False unpickles "
            "whatever the file holds, and unpickling can run any code a file carries: a "
            "checkpoint downloaded or shared by someone else could run anything on your "
            "machine. This checkpoint needs no pickle, so the safe default reads it.",
            "torch.load(path), whose default is weights_only=True (since torch 2.6), or pass "
            "weights_only=True yourself."))
    if not written.files:
        found.append(Problem.named(
            NOTHING_WRITTEN, f"save wrote no file at {path.name!r} nor beside it.", "A "
            "checkpoint kept in memory, or written somewhere else, is gone (or not found) when "
            "a new process resumes from the path it was given.", "write the checkpoint to "
            "`path` with torch.save(..., path), and read it from `path` in load."))
    elif not at_path:
        found.append(Problem.named(
            SAVED_ELSEWHERE, f"save wrote {written.files} file(s) beside {path.name!r} but "
            "nothing at that path itself.", "The caller gave the path it will resume from "
            "(and may hand it to another program, or list its checkpoints by name): a file "
            "at another name is one it never finds.", "torch.save(checkpoint, path), with path "
            "exactly as given (no suffix added, no folder of your own)."))
    if written.refused:
        quote = _refusal_quote(written.refused)
        found.append(Problem.named(
            OBJECTS_SAVED, "The checkpoint holds pickled Python objects, not only tensors, "
            "state dicts and plain values, so torch.load refuses it with its default "
            f"weights_only=True: '{quote}'",
            "Reading it needs weights_only=False, which torch warns can run arbitrary code "
            "from the file, and the same classes' code as when it was saved.", "save state "
            "dicts and plain values only: {'model': model.state_dict(), 'optimizer': "
            "optimizer.state_dict(), 'scaler': scaler.state_dict(), 'step': step} (and "
            "anything else as plain values: a torch version as a str, say), and restore each "
            "with load_state_dict."))
    if loading.error is not None:
        if isinstance(loading.error, FileNotFoundError) and written.files:
            found.append(_without_paths(Problem.named(
                LOAD_IGNORES_PATH, "load did not read the path it was given: the checkpoint "
                "was moved to another folder and handed to load there, and load raised "
                f"FileNotFoundError: {loading.error}", "A checkpoint is read back by another "
                "process, often on another machine or from another folder: load can rely on "
                "nothing but its path argument.", "torch.load(path), with the path load was "
                "given, not one remembered from save."), folder, moved))
        elif not (written.refused and isinstance(loading.error, pickle.UnpicklingError)):
            found.append(_without_paths(error_problem(loading, "load", after_others=bool(found)),
                                        moved))
        return found, False
    step = loading.value
    if wrong := type_problem(step, numbers.Integral, "load", "the step (an int)",
                             "return the step saved with the checkpoint, as an int."):
        return [*found, wrong], False
    after_load = resumed.state()
    ended = _finish(resumed, step, scenario)
    if step != scenario.save_at:
        found.append(Problem.named(
            WRONG_STEP, f"load returned step {step}, but the checkpoint was saved at step "
            f"{scenario.save_at}.", "The caller resumes its loop at the step load returns: the "
            "data order, a learning-rate schedule and the number of steps left all follow it.",
            "save the step in the checkpoint and return it from load."))
    buffers = {name for name, _ in resumed.model.named_buffers()}
    found += _state_problems(saved, after_load, written, ended, buffers, scenario.init_scale)
    if not found and not ended.matches:
        found.append(_differs(resumed, ended))
    return found, ended.matches


@contextmanager
def _torch_load_calls() -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments of every ``torch.load`` call made inside the block (the call itself
    goes through unchanged); ``torch.load`` is put back on leaving."""
    calls: list[dict[str, Any]] = []
    original = torch.load

    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        calls.append(dict(kwargs))
        return original(*args, **kwargs)

    torch.load = watched
    try:
        yield calls
    finally:
        torch.load = original


def _without_paths(problem: Problem, *folders: str, note: bool = False) -> Problem:
    """The checker's temporary folders named as the learner knows them: a file in one as
    ``path``, the folder itself as "path's folder"."""
    message = problem.message
    for folder in folders:
        message = re.sub(re.escape(str(Path(folder))) + r"[/\\][^\s'\"]*", "`path`", message)
        message = message.replace(str(Path(folder)), "path's folder")
    if note and message != problem.message and "director" in message:
        message += (" (`path` is the checkpoint file itself, in a folder that exists: write the "
                    "file at `path`, not inside it as a folder.)")
    return Problem(problem.key, message)


def _differs(resumed: Run, ended: Resumed) -> Problem:
    """Every state matched after load, yet the resumed run ended differently."""
    held = {id(p) for group in resumed.optimizer.param_groups for p in group["params"]}
    hint = ""
    if held != {id(p) for p in resumed.model.parameters()}:
        hint = (" The optimizer no longer holds the model's parameters: "
                "model.load_state_dict(..., assign=True) puts new Parameter objects into the "
                "model, and an optimizer built before keeps updating the old ones.")
    how = (f"training it further raised {type(ended.error).__name__}: {ended.error}"
           if ended.error else ended.scale_gap or (
               "the parameters ended different" if not ended.params_equal
               else "the final optimizer or BatchNorm state ended different"))
    return Problem.named(
        RESUME_DIFFERS, f"Right after load, model, optimizer and scaler held the saved state, "
        f"but the resumed run did not end like the uninterrupted one ({how}).{hint}",
        "A resumed run must continue exactly where the saved one stopped.",
        "copy each saved state into the objects you were given with load_state_dict (without "
        "assign=True), and change nothing else about them.")


# What only describes a result: where the result is the reference's in every scenario, none of
# these rejects the answer (the state reached by another route, or kept in other files, is right).
RESULT_KEYS = frozenset({
    MODEL_NOT_SAVED, OPTIMIZER_NOT_SAVED, PARAM_GROUPS_LOST, BUFFERS_LOST, SCALER_NOT_SAVED,
    SCALE_ONLY, OTHER_SCALER_SAVED, NOT_LOADED, WEIGHTS_DOWNCAST, WRONG_STEP, RESUME_DIFFERS})
