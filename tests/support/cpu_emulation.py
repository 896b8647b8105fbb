"""The suite's AVX2 emulation, and whether it changes anything on this machine.

``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` makes a CPU with native bf16 (avx512_bf16,
AMX) run torch's CPU kernels as an AVX2-only one does (a Zen 3): oneDNN's bf16 kernels off, bf16
matmuls in ATen's reference gemm, ATen's vectorised kernels at AVX2. The suite runs the unit tests
and the lessons once more so. On a CPU that already runs AVX2 kernels without oneDNN's bf16 (a
Zen 3 itself), or that is not x86, the emulation changes no kernel: that run would repeat the
plain one, so it is left out (on a Zen 3 the unit phase alone took 27 minutes).

``python -m tests.support.cpu_emulation`` exits 0 where the emulation changes something and 1
where it does not, saying which. ``python -m tests.support.cpu_emulation COMMAND ...`` runs the
command under the emulation where it changes something, and else says why it is left out and
exits 0: the README's test command runs the emulated unit tests so.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

AVX2_EMULATION = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
EMULATED_CAPABILITIES = ("AVX2", "DEFAULT")  # what ATen reports at or below the emulated level


def emulation_changes_kernels() -> tuple[bool, str]:
    """Whether the AVX2 emulation changes which CPU kernels torch runs here, and why."""
    import torch

    from amp_tutorial.device import onednn_bf16

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"a {platform.machine()} CPU: the x86 ISA caps do not apply"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in EMULATED_CAPABILITIES:
        return True, f"ATen runs {capability} kernels here, AVX2 under the emulation"
    if onednn_bf16():
        return True, "oneDNN's bf16 kernels are on here, off under the emulation"
    return False, (f"ATen already runs {capability} kernels and oneDNN's bf16 kernels are off: "
                   "this CPU is what the emulation imitates")


def main(argv: list[str]) -> int:
    changes, why = emulation_changes_kernels()
    print(f"AVX2 emulation {'runs' if changes else 'left out'}: {why}", flush=True)
    if not argv:
        return 0 if changes else 1
    if not changes:
        return 0
    return subprocess.run(argv, env={**os.environ, **AVX2_EMULATION}, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
