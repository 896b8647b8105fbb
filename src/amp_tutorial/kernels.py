"""Which ops have a kernel of their own on a device, rather than a body that calls other ops.

Lessons 12 and 17 pick the op a linear layer shows up as: ``aten::linear`` where the device has
its own kernel for it (MPS: ``_mps_linear``), ``aten::addmm``/``mm`` where ``linear`` is only its
CompositeImplicitAutograd body (CPU, CUDA, XPU). The dispatcher knows only the devices this build
was compiled for; the ``native_functions.yaml`` shipped with torch lists them all.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import torch


@cache
def _native_functions() -> str | None:
    try:
        import torchgen  # shipped inside every torch wheel, with the yaml under packaged/
    except ImportError:
        return None
    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    return path.read_text() if path.is_file() else None


def yaml_dispatch_keys(op: str) -> set[str] | None:
    """The dispatch keys ``native_functions.yaml`` gives ``op`` (``"aten::linear"``), as shipped
    with the installed torch (``torchgen/packaged``); None where the file or the op is missing.

    The file lists kernels for every device, built or not: a Linux wheel has no MPS kernels in
    its dispatcher, yet the yaml says ``linear`` has one (``MPS: _mps_linear``).
    """
    text = _native_functions()
    name = op.removeprefix("aten::")
    entry = re.search(rf"^- func: {re.escape(name)}\(.*?(?=^- func:|\Z)", text or "", re.M | re.S)
    if entry is None:
        return None
    delegate = re.search(r"^  structured_delegate: (\S+)", entry.group(0), re.M)
    if delegate is not None:  # e.g. addmm computes through addmm.out's kernels
        return yaml_dispatch_keys(delegate.group(1))
    block = re.search(r"^  dispatch:\n((?:    .*\n?)*)", entry.group(0), re.M)
    if block is None:
        return set()
    return {key.strip() for line in block.group(1).splitlines()
            for key in line.split(":")[0].split(",")}


def has_device_kernel(op: str, device_type: str) -> bool:
    """Whether ``op`` has a kernel of its own for ``device_type`` (e.g. ``aten::linear`` on MPS,
    ``_mps_linear``), instead of decomposing into other ops (``addmm``/``mm`` on CPU and CUDA).

    Asks the dispatcher (``torch._C._dispatch_has_kernel_for_dispatch_key``), which knows only the
    devices this build was compiled for, and ``native_functions.yaml``, which lists them all.
    """
    key = device_type.upper() if device_type != "privateuseone" else "PrivateUse1"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op, key):
        return True
    return key in (yaml_dispatch_keys(op) or set())
