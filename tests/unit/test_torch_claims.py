"""What the lessons say about PyTorch's own source, dispatcher registry and headers, checked on
every torch the course supports: the lock's in this process, each of ``OTHER_TORCHES`` in its
overlay venv (``tests.support.torch_envs``), where the lessons run too.

These are consistency checks, not lessons: a lesson shows the behaviour and asserts what a learner
can see; that its sentences about ``autocast_mode.h``, ``grad_scaler.py`` or ``parallel_apply.py``
still hold for each release is this file's job. Each check is a plain function of this module, so
an overlay's interpreter runs the same code (``python -m tests.unit.test_torch_claims``).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from functools import cache

import pytest
import torch

from amp_tutorial.autocast_policy import (
    BANNED,
    FP32,
    FP32_OUT,
    NO_RULE,
    autocast_policy,
    header_policy,
    header_rules,
    registered_ops,
    source_policy,
)
from amp_tutorial.versions import TESTED_TORCHES, parse
from tests.support import ROOT, missing_tool


class NotHere(Exception):
    """A check that cannot run with this torch build (no header shipped, no registry API)."""


def autocast_columns_are_what_pytorch_registers() -> None:
    """Lesson 01 ("Every device, probed here"): each device's probed bf16 column is the list the
    course read from that release's source, the dispatcher's registry of Autocast<device> kernels,
    and (CUDA/ROCm and XPU) the installed ``autocast_mode.h``, whose lists lack only the ban on
    binary_cross_entropy that ``autocast_mode.cpp`` registers."""
    source = source_policy(torch.__version__)
    assert source is not None, f"no autocast lists read for torch {torch.__version__}"
    for device_type in ("cpu", "cuda", "xpu", "mps"):
        rows = autocast_policy(device_type, torch.bfloat16)  # real CPU, fake tensors elsewhere
        probed = {r.op: r.verdict for r in rows}
        assert probed == source[1][device_type], (device_type, source[0])
        registered = registered_ops(rows, device_type)
        if registered is not None:
            assert registered == {op: rule != NO_RULE for op, rule in probed.items()}, device_type
        if device_type in ("cuda", "xpu") and (from_header := header_policy(rows)) is not None:
            assert {**from_header, "binary_cross_entropy": BANNED} == probed, device_type


def cuda_reductions_and_fp32_ops_are_the_header_lists() -> None:
    """Lesson 07 ("Numerically sensitive regions"): on CUDA and XPU these reductions give an fp32
    output unless a dtype= is passed, these ops run in fp32, and mean, max, amax, var and std are
    on no list (``AT_FORALL_*`` of ``autocast_mode.h``)."""
    rules = header_rules()
    if rules is None:
        raise NotHere("this torch build ships no include/ATen/autocast_mode.h")
    fp32_out = {"sum", "prod", "cumsum", "cumprod", "softmax.int", "log_softmax.int",
                "linalg_vector_norm", "linalg_matrix_norm"}
    assert {op: rules.get(op) for op in fp32_out} == dict.fromkeys(fp32_out, FP32_OUT)
    fp32 = ("exp", "log", "logsumexp", "layer_norm", "mse_loss")
    assert {op: rules.get(op) for op in fp32} == dict.fromkeys(fp32, FP32)
    assert not {"mean", "max", "amax", "var", "std"} & set(rules)


def grad_scaler_syncs_where_lesson_09_says() -> None:
    """Lesson 09 (the scheduler fix): ``get_scale()`` is ``scale.item()``, a CPU-GPU sync (its
    docstring says so); ``scaler.step`` reads found_inf with ``.item()`` (``_maybe_opt_step``) for
    an optimizer that is not fused; a fused one takes the flag on the device."""
    assert "CPU-GPU sync" in torch.amp.GradScaler.get_scale.__doc__
    assert ".item()" in inspect.getsource(torch.amp.GradScaler._maybe_opt_step)
    weight = [torch.zeros(1, requires_grad=True)]
    assert not getattr(torch.optim.Adam(weight), "_step_supports_amp_scaling", False)
    assert torch.optim.Adam(weight, fused=True)._step_supports_amp_scaling


def data_parallel_reenters_autocast_without_a_dtype() -> None:
    """Lesson 10 (threads): DataParallel's worker reads ``torch.is_autocast_enabled()`` with no
    device type (CUDA's switch) and re-enters autocast with no dtype: for CUDA only in 2.9, for the
    current accelerator's type from 2.11."""
    worker = inspect.getsource(torch.nn.parallel.parallel_apply)
    assert "torch.is_autocast_enabled()," in worker  # no device type given
    accelerator = "torch.amp.autocast(device_type, enabled=autocast_enabled)"
    cuda_only = 'torch.amp.autocast("cuda", enabled=autocast_enabled)'
    found = [call for call in (accelerator, cuda_only) if call in worker]
    assert found == ([accelerator] if parse(torch.__version__)[:2] >= (2, 11) else [cuda_only])


CHECKS: dict[str, Callable[[], None]] = {check.__name__: check for check in (
    autocast_columns_are_what_pytorch_registers,
    cuda_reductions_and_fp32_ops_are_the_header_lists,
    grad_scaler_syncs_where_lesson_09_says,
    data_parallel_reenters_autocast_without_a_dtype,
)}


def run_checks() -> dict[str, str]:
    """Each check's outcome in this interpreter: "ok", "not here: ..." or its traceback."""
    outcomes = {}
    for name, check in CHECKS.items():
        try:
            check()
            outcomes[name] = "ok"
        except NotHere as reason:
            outcomes[name] = f"not here: {reason}"
        except Exception:  # noqa: BLE001 - reported to the test that runs in the lock's torch
            outcomes[name] = traceback.format_exc()
    return outcomes


@cache
def outcomes_here() -> dict[str, str]:
    return run_checks()


@cache
def outcomes_in(torch_version: str) -> dict[str, str]:
    """run_checks in the overlay of ``torch_version``, in one process for every check."""
    from tests.support import torch_envs

    python = torch_envs.overlay_python(torch_version)
    if python is None:
        missing_tool(f"the torch {torch_version} test environment is not built",
                     "run `pdm run python -m tests.support.torch_envs` (pip, about 7 GB each)")
    done = subprocess.run([str(python), "-m", "tests.unit.test_torch_claims"], cwd=ROOT,
                          env={**os.environ, **torch_envs.overlay_environ(torch_version)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CHECKS)
@pytest.mark.parametrize("torch_version", TESTED_TORCHES)
def test_what_the_lessons_say_about_pytorch_holds(torch_version: str, name: str) -> None:
    if torch_version == torch.__version__.split("+")[0]:  # the lock's: this process
        outcome = outcomes_here()[name]
    else:
        outcome = outcomes_in(torch_version)[name]
    if outcome.startswith("not here: "):
        pytest.skip(outcome)
    assert outcome == "ok", f"torch {torch_version}: {name}\n{outcome}"


if __name__ == "__main__":  # in an overlay: print the outcomes as one JSON line
    print(json.dumps(run_checks()))
    sys.exit(0)
