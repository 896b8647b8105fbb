"""Keep the profiler's own C++ log lines out of a lesson's output.

``torch.profiler`` records through libkineto, whose logger (``libkineto/src/Logger.cpp``, built
without glog in PyTorch's wheels) writes each line to ``std::cerr``, the process's file descriptor
2; a Jupyter kernel forwards that to the notebook as a red stderr box, which reads as a failure.
The lines the lessons provoked:

- ``USDT:... SyncActivityProfilerHandler.cpp:39] profiler_start`` and ``... profiler_stop``, on
  every profile, from torch 2.14 (kineto's ``USDT_EMIT_START_TRACE``, severity USDT);
- ``ERROR:... DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35``, from a CUDA build
  of torch on a machine without a GPU (35: no CUDA driver), when kineto reads the GPUs'
  properties for the trace (``createDeviceProps``); torch 2.9 to 2.14;
- ``STAGE:... Completed Stage: Warm Up`` (and INFO lines) when the level is set lower.

The control kineto offers is ``KINETO_LOG_LEVEL``: a line prints when its severity is at least
that number. ``libkineto_init`` reads it once, when the process starts its first profiler
(``prepareTrace`` in torch's ``torch/csrc/profiler/kineto_shim.cpp``), so it must be set before
that, not before ``import torch``; torch then keeps it (``suppressLibkinetoLogMessages`` sets
ERROR only when it is unset). The severities are VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4
and, from torch 2.14, USDT 5: no level shows ERROR and hides USDT. So the course turns the
logger off with a level above every severity, with room for ones kineto adds (``5``, which
PyTorch's own benchmarks and torchtitan set, stopped being silent when USDT came).

What this hides is the profiler's account of itself, not of the learner's code: Python warnings,
``TORCH_WARN`` and exceptions take other ways and still show. A value the learner sets (``0``
shows everything) is kept. ``amp_tutorial`` applies it on import, before any lesson profiles; the
lab launcher and the image set it for every kernel, lessons or not.

One Python log line joins them: ``torch.utils.cpp_extension``, which ``torch.compile``'s C++
backend imports, logs "No CUDA runtime is found, using CUDA_HOME='...'" at WARNING on import when
a CUDA build of torch finds a CUDA toolkit (``CUDA_HOME``, an ``nvcc`` on the PATH, or
``/usr/local/cuda``) but no GPU (``_find_cuda_home``; the same call and text in torch 2.9 to
2.14). With logging not configured, Python's last-resort handler writes it to stderr: a red box
in lesson 14 on a machine that has the toolkit and no GPU. ``quiet_cuda_home_notice`` filters that
one message on that one logger; the logger's other records still pass.
"""

from __future__ import annotations

import logging
import os
import re

KINETO_LOG_ENV = "KINETO_LOG_LEVEL"
KINETO_LOG_OFF = "99"  # above every kineto severity (the highest, USDT, is 5 in torch 2.14)

# One line of kineto's logger: "USDT:2026-11-27 16:30:14 11279:11279 SyncActivityProfilerHandler
# .cpp:39] profiler_start" (severity, local time, process:thread, source file:line).
KINETO_LOG_LINE = re.compile(
    r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
    r"\d+:\d+ [\w.+-]+:\d+\] .*$", re.MULTILINE)


def kernel_environ() -> dict[str, str]:
    """The environment entries a kernel needs so that kineto never logs into its output."""
    return {KINETO_LOG_ENV: KINETO_LOG_OFF}


def quiet_kineto_logs() -> None:
    """Turn kineto's logger off in this process (and the ones it starts) unless the variable is
    already set; it takes effect if no profiler has run here yet."""
    if not os.environ.get(KINETO_LOG_ENV):  # unset or empty: kineto's default, ERROR and up
        os.environ.update(kernel_environ())


def kineto_log_lines(text: str) -> list[str]:
    """The lines of ``text`` (a process's or a cell's stderr) that kineto's logger wrote."""
    return KINETO_LOG_LINE.findall(text)


CUDA_HOME_LOGGER = "torch.utils.cpp_extension"
CUDA_HOME_NOTICE = "No CUDA runtime is found, using CUDA_HOME='%s'"  # its format, unformatted


def _not_the_cuda_home_notice(record: logging.LogRecord) -> bool:
    return record.msg != CUDA_HOME_NOTICE


def quiet_cuda_home_notice() -> None:
    """Drop cpp_extension's "No CUDA runtime is found" notice (see the module docstring), whether
    or not torch.utils.cpp_extension is imported yet: a logger is one object per name."""
    logger = logging.getLogger(CUDA_HOME_LOGGER)
    if _not_the_cuda_home_notice not in logger.filters:
        logger.addFilter(_not_the_cuda_home_notice)


def log_noise_lines(text: str) -> list[str]:
    """The lines of ``text`` (a cell's output) that a learner must not see: kineto's, and the
    CUDA_HOME notice."""
    notice = CUDA_HOME_NOTICE.split("%")[0]
    return kineto_log_lines(text) + [line for line in text.splitlines() if notice in line]
