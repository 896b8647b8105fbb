"""Keep freed host (CPU) memory in the process, so a training step reuses the last step's pages.

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB, adjusted as blocks
are freed) with a fresh ``mmap`` and gives it back to the kernel on ``free``; it also trims the top
of its heap once 128 KiB of it is free. A CPU training step allocates and frees the same large
activation and gradient buffers every step, so each step page-faults them in again, and the
kernel zeroes every 4 KiB page first. On the 2-core virtual machines this course is tested on
that was most of an fp32 step: the ConvModel at the ``cpu`` preset took 309 ms per step with
glibc's defaults and 133 ms with freed memory kept; lesson 05 at ``cpu`` ran 207 s and 21 s.
It also flatters bf16, whose buffers are half the size: fewer faults, not faster arithmetic.

PyTorch's CPU performance tuning guide recommends a different allocator for the same reason
("for deep learning workloads, Jemalloc or TCMalloc can get better performance by reusing memory
as much as possible than default malloc function", https://pytorch.org/tutorials/recipes/recipes/
tuning_guide.html); that needs ``LD_PRELOAD`` before the process starts. A running kernel can
instead tell glibc, through ``mallopt``, never to ``mmap`` a block (``M_MMAP_MAX`` = 0) and not to
trim its heap (``M_TRIM_THRESHOLD``), which is what :func:`keep_freed_memory` does. The price: the
process keeps its peak host memory until it exits. ``AMP_TUTORIAL_MALLOC=system`` leaves glibc as
it is (``pdm run bench --system-malloc`` sets it, to measure the difference).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MALLOC_ENV = "AMP_TUTORIAL_MALLOC"
M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # the largest value mallopt's int takes: in effect, never trim

_state: str | None = None  # the note of the first call; later calls return it unchanged


def glibc_version() -> str | None:
    """glibc's version where this process runs on glibc (Linux, not musl), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        get_version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    get_version.restype = ctypes.c_char_p
    return get_version().decode()


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory for reuse (see the module docstring); return a note saying
    what was done, for the device line. Does nothing off glibc, or with AMP_TUTORIAL_MALLOC=system.
    """
    global _state
    if _state is not None:
        return _state
    version = glibc_version()
    if os.environ.get(MALLOC_ENV, "").strip().lower() == "system":
        _state = f"host memory: the system's malloc as it is ({MALLOC_ENV}=system)"
    elif version is None:
        _state = "host memory: the system's malloc (not glibc, so not tuned)"
    else:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, _NEVER_TRIM) == 1
        _state = (f"host memory: glibc {version} keeps freed blocks for reuse (mallopt), so a step "
                  f"does not page-fault its buffers in again" if done else
                  f"host memory: glibc {version} refused mallopt; freed blocks go back to the OS")
    return _state
