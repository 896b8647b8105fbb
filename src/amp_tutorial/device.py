"""Device selection: which accelerator to use, what it is called, and which AMP dtypes it supports.

CUDA and ROCm share the ``cuda`` device type; ROCm is recognised by ``torch.version.hip``.
Set ``AMP_TUTORIAL_DEVICE`` (``cuda``, ``cuda:1``, ``mps``, ``xpu`` or ``cpu``) to override the
choice, and ``AMP_TUTORIAL_DTYPE`` (``float16`` or ``bfloat16``) to put that autocast dtype first:
``float16`` on a CPU runs every lesson the way an NVIDIA or AMD GPU does by default (fp16 autocast
with an enabled GradScaler), which is how CI rehearses the GPU path without a GPU.
On CUDA, ROCm and XPU bfloat16 is offered only where the GPU computes it natively (NVIDIA compute
capability 8.0+, AMD architectures with bf16 matrix instructions, Intel GPUs that report bf16
conversions); on MPS from torch 2.6 and macOS 14, after fp16. On the CPU it is always offered
(it is CPU autocast's default dtype), native or not: ``native_bf16`` and the description say
which, because an emulated bf16 runs, but usually slower than fp32.

It also says why a GPU that is there is not usable: ROCm reaches an AMD GPU through
``/dev/kfd`` and ``/dev/dri/renderD*``; a user outside their group gets "Permission denied", and
torch then reports no GPU, so every lesson would run on the CPU without saying why. The device
line and the container's entry points (``docker/start-lab.py``, ``docker/start-singleuser.py``)
name the files and the fix (``gpu_access_problem``).
"""

from __future__ import annotations

import glob
import inspect
import os
import platform
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from amp_tutorial.host_memory import keep_freed_memory

if TYPE_CHECKING:
    from amp_tutorial.presets import Preset

DEVICE_ENV = "AMP_TUTORIAL_DEVICE"
DTYPE_ENV = "AMP_TUTORIAL_DTYPE"
DTYPE_CHOICES = {"auto": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
KNOWN_DEVICE_TYPES = ("cuda", "mps", "xpu", "cpu")


class DeviceNotAvailableError(RuntimeError):
    """Raised when the requested device does not exist on this machine.
    """


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "mps":
        return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    if device_type == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def _backend_and_name(device: torch.device) -> tuple[str, str]:
    if device.type == "cuda":
        backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        return backend, torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "MPS (Apple Metal)", f"Apple GPU (macOS {platform.mac_ver()[0]})"
    if device.type == "xpu":
        return "XPU (Intel)", torch.xpu.get_device_name(device)
    return "CPU", _cpu_name()


def _cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# CPU flags (Linux /proc/cpuinfo) of instructions that compute on bf16: x86 AVX512-BF16 and AMX,
# Arm's BF16 extension ("bf16" in the Features line).
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
CPUINFO = "/proc/cpuinfo"  # where Linux lists the CPU's flags (tests point it at other CPUs')
ONEDNN_ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN's cap, new and old names


def cpu_bf16_flags(cpuinfo: str | None = None) -> tuple[str, ...] | None:
    """The bf16 instruction flags this CPU reports, or None where there is no cpuinfo to read.
    """
    try:
        with open(cpuinfo or CPUINFO, encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    found = set(value.split())
                    return tuple(f for f in CPU_BF16_FLAGS if f in found)
    except OSError:
        pass
    return None


def onednn_bf16() -> bool | None:
    """Whether PyTorch runs bf16 matmuls through oneDNN (mkldnn) on this CPU.

    oneDNN's bf16 kernels need avx512bw/vl/dq or avx_ne_convert on x86 (``mkldnn_bf16_device_check``
    in ``aten/src/ATen/native/mkldnn/Utils.h``). Without them (an AVX2-only CPU) a bf16 matmul
    falls back to ATen's reference gemm (``cpublas_gemm_impl`` in ``native/cpu/BlasKernel.cpp``),
    which is many times slower than fp32. PyTorch's own tests ask the same private op; None where
    this torch has no oneDNN or not the op.
    """
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


def cpu_bf16_native(flags: tuple[str, ...] | None) -> bool | None:
    """Whether bf16 runs natively on this CPU, from its bf16 ``flags`` (``cpu_bf16_flags``): the
    instructions are there and PyTorch's oneDNN bf16 kernels are on. With the flags but oneDNN
    capped at an ISA without bf16 kernels (``ONEDNN_MAX_CPU_ISA=AVX2``, as an instructor rehearses
    an older laptop), bf16 matmuls take ATen's reference gemm as on an AVX2-only CPU. None: no
    flags to read."""
    if flags is None:
        return None
    return bool(flags) and onednn_bf16() is not False


def _cpu_bf16_note(flags: tuple[str, ...] | None) -> str:
    capability = torch.backends.cpu.get_cpu_capability()
    small = ("; so the `auto` preset is `small` here, sized for slow bf16 runs; on a CPU with "
             "native bf16 it is `cpu`, larger, where bf16 trains about twice as fast as fp32")
    if flags is None:
        return (f"native bf16 on this CPU: unknown (no /proc/cpuinfo; torch CPU kernels: "
                f"{capability}){small}")
    if cpu_bf16_native(flags):
        return (f"native bf16 on this CPU: yes ({', '.join(flags)}; torch CPU kernels: "
                f"{capability}), so the `auto` preset is `cpu`")
    if flags:
        caps = [f"{name}={os.environ[name]}" for name in ONEDNN_ISA_CAPS if os.environ.get(name)]
        return (f"native bf16 on this CPU: no, in this process: the CPU has {', '.join(flags)}, "
                f"but oneDNN's bf16 kernels are off ({', '.join(caps) or 'no ISA cap set'}; "
                f"torch CPU kernels: {capability}): bf16 matmuls fall back to ATen's reference "
                f"gemm, slower than fp32, as on an AVX2-only CPU{small}")
    text = (f"native bf16 on this CPU: no (none of the flags {', '.join(CPU_BF16_FLAGS)}; torch "
            f"CPU kernels: {capability})")
    if onednn_bf16() is False:
        return (f"{text}; oneDNN bf16 kernels: no, so bf16 matmuls fall back to ATen's reference "
                f"gemm (up to tens of times slower than fp32, by operand layout): bf16 autocast is "
                f"slower than fp32 here, whatever the problem size{small}")
    return (f"{text}: without bf16 instructions every bf16 value is converted to fp32 for the "
            f"arithmetic and back, so bf16 autocast can be slower than fp32 here{small}")


# AMD GPU architectures with bf16 matrix instructions: MFMA on CDNA (gfx908 MI100, gfx90a MI200,
# gfx94x MI300, gfx95x MI350), WMMA on RDNA 3 and 4 (gfx11xx, gfx12xx); from AMD's ISA documents
# and the LLVM AMDGPU backend's feature lists. Older ones (gfx906, RDNA 2's gfx103x) convert.
ROCM_BF16_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def rocm_bf16_native(arch: str) -> bool:
    """Whether an AMD GPU architecture (``gcnArchName``, e.g. ``gfx942:sramecc+:xnack-``) has bf16
    matrix instructions. ``torch.cuda.is_bf16_supported()`` returns True for every ROCm device,
    whatever its arguments (``torch/cuda/__init__.py``), so it cannot tell.
    """
    return arch.split(":")[0].startswith(ROCM_BF16_ARCHS)


def _cuda_bf16_native(device: torch.device) -> bool:
    """Native bf16 on a CUDA/ROCm GPU. ``torch.cuda.is_bf16_supported()`` counts emulation by
    default (True on V100, T4); ``including_emulation=False`` asks for native support on NVIDIA;
    on ROCm it says True for every GPU, so the architecture decides."""
    if torch.version.hip:
        return rocm_bf16_native(torch.cuda.get_device_properties(device).gcnArchName)
    if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters:
        with torch.cuda.device(device):
            return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cuda.get_device_capability(device)[0] >= 8  # what that argument checks


def _xpu_bf16_native() -> bool:
    """``torch.xpu.is_bf16_supported()`` counts emulation by default (True on every XPU);
    ``including_emulation=False`` asks the device's ``has_bfloat16_conversions``."""
    is_bf16 = getattr(torch.xpu, "is_bf16_supported", None)
    if is_bf16 is None:
        return True  # older torch: XPU autocast's default dtype is bf16
    if "including_emulation" in inspect.signature(is_bf16).parameters:
        return bool(is_bf16(including_emulation=False))
    return bool(is_bf16())


def _supported_amp_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """AMP dtypes worth training with on this device, preferred first."""
    if device.type == "cuda":
        dtypes: list[torch.dtype] = [torch.float16]
        if _cuda_bf16_native(device):
            dtypes.append(torch.bfloat16)
        return tuple(dtypes)
    if device.type == "mps":
        version = _torch_version()
        dtypes = []
        if version >= (2, 8):  # fp16 autocast since 2.5, but its GradScaler only since 2.8
            dtypes.append(torch.float16)
        if version >= (2, 6) and int(platform.mac_ver()[0].split(".")[0] or 0) >= 14:
            dtypes.append(torch.bfloat16)
        return tuple(dtypes)
    if device.type == "xpu":
        return (torch.bfloat16, torch.float16) if _xpu_bf16_native() else (torch.float16,)
    # CPU autocast also accepts float16, but bfloat16 is the CPU's fast path (AVX512-BF16 / AMX).
    return (torch.bfloat16,)


def _requested_dtype() -> torch.dtype | None:
    """The dtype ``AMP_TUTORIAL_DTYPE`` asks for (None: the device's own order)."""
    value = os.environ.get(DTYPE_ENV, "").strip().lower() or "auto"
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}
    value = aliases.get(value, value)
    if value not in DTYPE_CHOICES:
        raise ValueError(f"{DTYPE_ENV}={os.environ[DTYPE_ENV]!r} is not a choice; use one of "
                         f"{', '.join(DTYPE_CHOICES)} (or unset it)")
    return DTYPE_CHOICES[value]


def _put_first(dtypes: tuple[torch.dtype, ...], device: torch.device,
               wanted: torch.dtype | None) -> tuple[torch.dtype, ...]:
    """``dtypes`` with ``wanted`` first. The CPU takes float16 too (fp16 autocast and
    ``GradScaler("cpu")`` work there, emulated), then offers (float16, bfloat16) as an NVIDIA GPU
    with native bf16 does; another device must offer ``wanted`` already."""
    if wanted is None or (dtypes and dtypes[0] == wanted):
        return dtypes
    if device.type == "cpu":
        return (wanted, *(d for d in (torch.float16, torch.bfloat16) if d != wanted))
    if wanted not in dtypes:
        offered = ", ".join(dtype_name(d) for d in dtypes) or "none"
        raise ValueError(f"{DTYPE_ENV} asks for {dtype_name(wanted)}, which {device.type} does not "
                         f"offer here (offered: {offered}); unset {DTYPE_ENV} or pick one of those")
    return (wanted, *(d for d in dtypes if d != wanted))


@dataclass(frozen=True)
class DeviceInfo:
    """Everything the course needs to know about the device it runs on.
    """

    device: torch.device
    backend: str
    name: str
    amp_dtypes: tuple[torch.dtype, ...] = field(default_factory=tuple)
    native_bf16: bool | None = None  # None: not known (MPS, XPU, a CPU without /proc/cpuinfo)
    notes: tuple[str, ...] = ()  # why a dtype is (not) offered, or what to expect from it

    @property
    def type(self) -> str:
        """The autocast ``device_type``: ``cuda`` (also ROCm), ``mps``, ``xpu`` or ``cpu``."""
        return self.device.type

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The preferred autocast dtype, or None where this device/torch has no usable AMP."""
        return self.amp_dtypes[0] if self.amp_dtypes else None

    @property
    def is_rocm(self) -> bool:
        return self.device.type == "cuda" and bool(torch.version.hip)

    @property
    def has_allocator_stats(self) -> bool:
        """True where peak memory can be read from a caching allocator (CUDA/ROCm, XPU)."""
        return self.device.type in ("cuda", "xpu")

    def needs_grad_scaler(self, dtype: torch.dtype | None = None) -> bool:
        """float16 has a narrow exponent range and needs a GradScaler; bfloat16 and fp32 do not."""
        return (dtype or self.amp_dtype) == torch.float16

    def __str__(self) -> str:
        dtypes = ", ".join(dtype_name(d) for d in self.amp_dtypes) or "none"
        return f"{self.device} ({self.backend}: {self.name}); AMP dtypes: {dtypes}"


BF16_NOT_OFFERED = "bf16 not offered"  # the note of a GPU without native bf16 starts so


def _bf16_support(device: torch.device) -> tuple[bool | None, tuple[str, ...]]:
    """Whether ``device`` computes bf16 natively, and a note saying how that was decided."""
    if device.type == "cpu":
        flags = cpu_bf16_flags()
        return cpu_bf16_native(flags), (_cpu_bf16_note(flags),)
    if device.type == "cuda":
        if _cuda_bf16_native(device):
            return True, ()
        if torch.version.hip:
            arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
            return False, (f"{BF16_NOT_OFFERED}: this AMD GPU ({arch}) has no bf16 matrix "
                           f"instructions (those start at {', '.join(ROCM_BF16_ARCHS)}); "
                           "torch.cuda.is_bf16_supported() says True on every ROCm GPU",)
        major, minor = torch.cuda.get_device_capability(device)
        return False, (f"{BF16_NOT_OFFERED}: this GPU (compute capability {major}.{minor}) has no "
                       "native bf16 (torch counts it from 8.0, Ampere); "
                       "torch.cuda.is_bf16_supported() without including_emulation=False also "
                       "counts emulated bf16, which runs but slowly",)
    if device.type == "xpu":
        native = _xpu_bf16_native()
        return native, (() if native else (f"{BF16_NOT_OFFERED}: this Intel GPU reports no bf16 "
                                           "conversions (has_bfloat16_conversions)",))
    if device.type == "mps" and torch.bfloat16 in _supported_amp_dtypes(device):
        return None, ("bf16 on MPS: Metal runs it on every Apple GPU, natively on some chips and "
                      "emulated on others, and PyTorch does not say which, so fp16 comes first",)
    return None, ()


def dtype_name(dtype: torch.dtype | None) -> str:
    """Short name used in tables and plots: fp32, fp16, bf16.
    """
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    return names.get(dtype, str(dtype).replace("torch.", "")) if dtype is not None else "fp32"


def select_device(requested: str | None = None) -> DeviceInfo:
    """Pick the best device (cuda > mps > xpu > cpu), or the one requested / set in the environment.

    Raises DeviceNotAvailableError with the available choices when the requested one is absent,
    and ValueError when ``AMP_TUTORIAL_DTYPE`` names a dtype the device does not offer.
    """
    requested = requested or os.environ.get(DEVICE_ENV) or None
    if requested:
        try:
            device = torch.device(requested)
        except RuntimeError as err:
            raise DeviceNotAvailableError(
                f"{requested!r} is not a device name; use one of {', '.join(KNOWN_DEVICE_TYPES)}"
                f" (set by {DEVICE_ENV} or the device argument)"
            ) from err
        if device.type not in KNOWN_DEVICE_TYPES or not _available(device.type):
            raise DeviceNotAvailableError(
                f"device {requested!r} is not available on this machine "
                f"(torch {torch.__version__}); available: {', '.join(available_devices())}. "
                f"Unset {DEVICE_ENV} or pick one of those."
            )
        if device.type == "cuda" and device.index is not None:
            if device.index >= torch.cuda.device_count():
                raise DeviceNotAvailableError(
                    f"device {requested!r} does not exist: {torch.cuda.device_count()} GPU(s) seen"
                )
    else:
        device = torch.device(available_devices()[0])
    backend, name = _backend_and_name(device)
    native_bf16, notes = _bf16_support(device)
    wanted = _requested_dtype()
    dtypes = _put_first(_supported_amp_dtypes(device), device, wanted)
    if wanted is not None:
        notes = (*notes, f"{DTYPE_ENV}={dtype_name(wanted)} puts {dtype_name(wanted)} first")
    notes = (*notes, keep_freed_memory())
    return DeviceInfo(device=device, backend=backend, name=name, amp_dtypes=dtypes,
                      native_bf16=native_bf16, notes=notes)


def available_devices() -> list[str]:
    """Device types usable here, best first; always ends with cpu.
    """
    return [t for t in KNOWN_DEVICE_TYPES if _available(t)]


def describe_device(info: DeviceInfo | None = None) -> str:
    """The device in full: which device, backend and AMP dtypes, and every note on them (why bf16
    is or is not native, why there is no GPU, what was done to host memory). A lesson opens with
    :func:`device_line`, whose ``verbose=True`` adds these notes.
    """
    info = info or select_device()
    scaler = "GradScaler needed" if info.needs_grad_scaler() else "no GradScaler needed"
    line = f"Running on {info} -> default autocast dtype {dtype_name(info.amp_dtype)}, {scaler}"
    if info.type == "cpu" and (problem := gpu_access_problem()):
        line += f". No GPU because {problem}"  # a GPU is there, but closed to this user
    return "\n  ".join((line, *info.notes))


DETAILS_HINT = "details: print(device_line(info, verbose=True))"  # every lesson names it `info`


def _bf16_here(info: DeviceInfo) -> str | None:
    """A few words on bf16 for the device part of the line: native or emulated on a CPU, absent
    on a GPU that lacks it (its note says why), nothing where it is native or unknown on a GPU."""
    if info.type == "cpu":
        if info.native_bf16 is None:
            return "native bf16 unknown"
        return "native bf16" if info.native_bf16 else "bf16 emulated, slower than fp32"
    if any(note.startswith(BF16_NOT_OFFERED) for note in info.notes):
        return "no native bf16"
    return None


def device_line(info: DeviceInfo, preset: Preset | None = None, *, dtype: torch.dtype | None = None,
                sizes: str | None = None, verbose: bool = False) -> str:
    """The one plain line a lesson opens with: the device, the autocast dtype, whether it needs a
    GradScaler, and the preset's sizes, e.g. ``CPU (AMD EPYC, bf16 emulated, slower than fp32) ·
    autocast bfloat16 · no GradScaler needed · preset 'small' (grid 128, hidden 64, 64 steps)``.

    A GPU that is there but closed to this user (``gpu_access_problem``) and a dtype set by
    ``AMP_TUTORIAL_DTYPE`` stay on the line; the other notes (:func:`describe_device`) come with
    ``verbose=True``, which the line's last words say how to ask for. ``dtype``: the autocast dtype
    the lesson uses where it is not the device's first; ``sizes``: the sizes the lesson uses, where
    they are not the preset's image problem (``"grid 128, 64 steps"``).
    """
    bf16 = _bf16_here(info)
    if info.type == "cpu":
        where = f"CPU ({info.name}{', ' + bf16 if bf16 else ''})"
    else:
        where = f"{info.name} ({info.backend}, device '{info.device}'{', ' + bf16 if bf16 else ''})"
    parts = [where]
    used = dtype or info.amp_dtype
    if used is None:
        parts.append("no usable autocast dtype with this torch")
    else:
        said = str(used).removeprefix("torch.")
        if dtype is not None and dtype != info.amp_dtype:
            said += f" in this lesson (the device's first: {dtype_name(info.amp_dtype)})"
        elif set_by := [n for n in info.notes if n.startswith(f"{DTYPE_ENV}=")]:
            said += f" ({set_by[0].split(' ')[0]})"
        parts += [f"autocast {said}",
                  "GradScaler needed" if info.needs_grad_scaler(used) else "no GradScaler needed"]
    if preset is not None:
        shown = sizes or f"grid {preset.grid}, hidden {preset.hidden}, {preset.steps} steps"
        parts.append(f"preset {preset.name!r} ({shown})")
    if info.type == "cpu" and (problem := gpu_access_problem()):
        parts.append(f"no GPU: {problem}")  # a GPU is there, but closed to this user
    if not verbose:
        return " · ".join((*parts, DETAILS_HINT))
    details = [*info.notes, *([f"preset {preset.name!r}: {preset.description}"] if preset else [])]
    return "\n  ".join((" · ".join(parts), f"{info}", *details))


def has_fp32_precision_api() -> bool:
    """True where torch has the per-backend ``fp32_precision`` settings (torch >= 2.9), which
    replace ``allow_tf32``; after only the new ones are set, the old getters can raise there.
    """
    cudnn = torch.backends.cudnn
    return hasattr(cudnn, "conv") and hasattr(torch.backends.cuda.matmul, "fp32_precision")


# What the course calls each kind of CUDA op, and the setting torch keeps for it: cuDNN's
# convolutions and RNNs (``torch.backends.cudnn.conv`` / ``.rnn``), cuBLAS's matmuls
# (``torch.backends.cuda.matmul``). All three sit under ``torch.backends.cudnn.fp32_precision``,
# which is torch's ("cuda", "all") level, the parent of the matmuls too, and that under the
# generic ``torch.backends.fp32_precision``.
TF32_OPS = {"convolutions": ("cudnn", "conv"), "matmuls": ("cuda", "matmul"),
            "rnns": ("cudnn", "rnn")}


def _fp32_precision(kind: str) -> str:
    """The precision torch computes one kind of CUDA op's fp32 in: the first of op, backend
    ("cuda", "all") and generic level that is not ``"none"``; ``"none"`` where all three are,
    which is no TF32 (full fp32).

    That is ``Context::float32Precision`` in ``aten/src/ATen/Context.cpp`` (torch 2.9: op ->
    backend "all" -> "generic"; the "none" it ends on is returned as it is, and the kernels ask
    ``== "tf32"``, e.g. ``Context::allowTF32CuDNN(op)``). The Python getters
    (``torch._C._get_fp32_precision_getter``, read by ``_FP32Precision.__getattr__`` in
    ``torch/backends/__init__.py``) already return that resolved value on 2.9.0, 2.11.0 and
    2.14.1 (probed: with every level "none" ``cudnn.conv`` reads "none"; with only
    ``cudnn.fp32_precision = "tf32"`` the matmuls read "tf32"), so the walk up changes nothing
    there and keeps the answer right where a getter returned the level's own setting. The
    fresh values differ by release only inside: cuDNN's convolutions and RNNs start at "tf32" on
    2.9 and 2.11 (``include/ATen/Context.h``) and at an internal ``DEFAULT`` on 2.14 that reads
    "tf32" unless a parent level is set (2.14 only: ``torch.backends.fp32_precision = "ieee"``
    makes them "ieee").
    """
    backend, op = TF32_OPS[kind]
    levels = (getattr(getattr(torch.backends, backend), op).fp32_precision,
              torch.backends.cudnn.fp32_precision,  # torch's ("cuda", "all")
              getattr(torch.backends, "fp32_precision", "none"))  # ("generic", "all")
    return next((level for level in levels if level != "none"), "none")


def tf32_state(rnns: bool = False) -> dict[str, bool]:
    """Whether CUDA convolutions and matmuls (and with ``rnns``, cuDNN's RNNs) may use TF32 now,
    read with the API torch has. The keys are ``"convolutions"``, ``"matmuls"`` (``"rnns"``).
    """
    kinds = [kind for kind in TF32_OPS if rnns or kind != "rnns"]
    if has_fp32_precision_api():
        return {kind: _fp32_precision(kind) == "tf32" for kind in kinds}
    legacy = {"convolutions": torch.backends.cudnn.allow_tf32,  # one flag for conv and RNN
              "matmuls": torch.backends.cuda.matmul.allow_tf32,
              "rnns": torch.backends.cudnn.allow_tf32}
    return {kind: legacy[kind] for kind in kinds}


def tf32_in_use(info: DeviceInfo, rnns: bool = False) -> list[str]:
    """What runs its fp32 in TF32 on this device now ("convolutions", "matmuls", with ``rnns``
    also "rnns"): on Ampere and newer NVIDIA GPUs cuDNN's convolutions (and RNNs) do unless
    switched off (``set_strict_fp32``); nothing elsewhere, ROCm included. TF32 keeps 10 of fp32's
    23 mantissa bits, so "agrees to fp32 rounding" does not hold.
    """
    if info.type != "cuda" or info.is_rocm:
        return []
    major, _ = torch.cuda.get_device_capability(info.device)
    return [what for what, on in tf32_state(rnns).items() if on and major >= 8]


def fp32_baseline(info: DeviceInfo, kinds: tuple[str, ...] | None = None) -> str:
    """Name the fp32 baseline honestly: "fp32 (TF32 convolutions)" where ``tf32_in_use``; "strict"
    only where no kind of op uses TF32, cuDNN's RNNs included. ``kinds``: the kinds of op the
    model has ("matmuls" for the transformer, which has no convolution), where it is known."""
    if info.type == "cuda" and not info.is_rocm:
        if kinds is not None and not tf32_in_use(info, rnns=True):
            return "fp32 (strict, TF32 off)"
        if kinds is not None:
            parts = [p for p in tf32_in_use(info) if p in kinds]
            return (f"fp32 (TF32 {' and '.join(parts)})" if parts
                    else f"fp32 (no TF32 in its {' and '.join(kinds)})")
        if parts := tf32_in_use(info):
            return f"fp32 (TF32 {' and '.join(parts)})"
        if tf32_in_use(info, rnns=True):
            return "fp32 (TF32 RNNs)"
        return "fp32 (strict, TF32 off)"
    return "fp32"


def set_strict_fp32(strict: bool = True) -> None:
    """Switch TF32 off for every kind of CUDA op (strict: cuDNN's convolutions and RNNs, cuBLAS's
    matmuls), or back to PyTorch's defaults (TF32 convolutions and RNNs, IEEE fp32 matmuls).

    Sets the new per-op settings (``cudnn.conv`` / ``cudnn.rnn`` / ``cuda.matmul
    .fp32_precision``) and keeps the legacy ones in step, because torch still reads those: the
    legacy ``torch.backends.cudnn.allow_tf32`` getter checks conv, RNN and its own flag agree
    (``Context::allowTF32CuDNN`` in ``aten/src/ATen/Context.cpp``) and raises otherwise, and
    ``torch.backends.cudnn.set_flags`` (``torch/backends/cudnn/__init__.py``) reads it on every
    call, which ``torch.export`` makes on 2.11 and 2.14 (``_ignore_backend_decomps`` in
    ``torch/export/_trace.py``); Inductor's convolution templates read it on 2.9 and 2.14
    (``torch/_inductor/kernel/conv.py``); and torch 2.9's Inductor reads
    ``torch.backends.cuda.matmul.allow_tf32`` for an fp32 matmul
    (``_warn_tf32_disabled`` in ``torch/_inductor/compile_fx.py``, pytorch/pytorch#166387). So the
    legacy cuDNN flag is set first (its setter, ``Context::setAllowTF32CuDNN``, sets conv and RNN
    to "tf32" or "none"), then the per-op values; matmuls go through
    ``torch.set_float32_matmul_precision`` (``Context::setFloat32MatmulPrecision``: the legacy
    precision and the cuda and mkldnn matmul settings together). Checked on 2.9.0, 2.11.0 and
    2.14.1: afterwards every legacy getter answers, and agrees.

    Not strict puts back what a fresh process reads: "tf32" for cuDNN's convolutions and RNNs,
    "none" (inherit: full fp32 while the parent levels are "none" too) for cuBLAS's and oneDNN's
    matmuls, ``get_float32_matmul_precision() == "highest"``. On 2.14 a fresh process's cuDNN
    values follow a later ``torch.backends.fp32_precision`` and these do not: that internal
    ``DEFAULT`` cannot be set from Python ("Unknown precision").
    """
    if has_fp32_precision_api():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch 2.9 warns once that the legacy API will go
            torch.backends.cudnn.allow_tf32 = not strict
            torch.set_float32_matmul_precision("highest")  # cuda and mkldnn matmuls "ieee"
        precision = "ieee" if strict else "tf32"
        torch.backends.cudnn.conv.fp32_precision = precision
        torch.backends.cudnn.rnn.fp32_precision = precision
        if not strict:
            torch.backends.cuda.matmul.fp32_precision = "none"
            torch.backends.mkldnn.matmul.fp32_precision = "none"
        return
    torch.backends.cudnn.allow_tf32 = not strict  # one flag for cuDNN's convolutions and RNNs
    torch.backends.cuda.matmul.allow_tf32 = False


# --- GPU device files closed to this user (ROCm) ----------------------------------------
# The kfd file first, then the render nodes; these exist only where a ROCm driver does (or where
# compose passed them into the container).
ROCM_DEVICE_FILES = ("/dev/kfd", "/dev/dri/renderD*")
# Set in the course's Docker image: the fix is then a compose setting, not a host group.
IN_CONTAINER_ENV = "AMP_TUTORIAL_IN_CONTAINER"
# docker/rocm.yml's group_add takes the host's group numbers from these two settings.
COMPOSE_GID_SETTINGS = ("RENDER_GID", "VIDEO_GID")


@dataclass(frozen=True)
class ClosedDeviceFile:
    """A GPU device file this process may not open for reading and writing, and its group.
    """

    path: str
    gid: int


def closed_device_files(patterns: tuple[str, ...] = ROCM_DEVICE_FILES) -> list[ClosedDeviceFile]:
    """The GPU device files present here that this process may not open read-write.

    ``os.access`` asks the kernel the open() permission question for the real user and its
    groups, without opening the file (opening /dev/kfd would create a GPU context).
    """
    closed = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if not os.access(path, os.R_OK | os.W_OK):
                closed.append(ClosedDeviceFile(path, os.stat(path).st_gid))
    return closed


def gpu_access_problem(closed: list[ClosedDeviceFile] | None = None) -> str | None:
    """One sentence saying which GPU device files this user cannot open, and the exact fix;
    None when there is nothing to fix (all present device files open, or none present).
    """
    closed = closed_device_files() if closed is None else closed
    if not closed:
        return None
    # The render nodes' group first: it is the one compose's RENDER_GID is for.
    gids = list(dict.fromkeys(f.gid for f in sorted(closed, key=lambda f: f.path == "/dev/kfd")))
    files = ", ".join(f"{f.path} (group {f.gid})" for f in closed)
    groups = ", ".join(str(g) for g in sorted(set(os.getgroups()) | {os.getgid()}))
    problem = (f"the GPU device files {files} are closed to this user (uid {os.getuid()}, "
               f"groups {groups})")
    if os.environ.get(IN_CONTAINER_ENV):
        named = zip(COMPOSE_GID_SETTINGS, gids, strict=False)  # a third group: see below
        settings = " and ".join(f"{name}={gid}" for name, gid in named)
        fix = (f"put {settings} in the .env file next to docker-compose.yml (the host's group "
               f"numbers of these files), then run `docker compose up -d`")
        if len(gids) > len(COMPOSE_GID_SETTINGS):
            others = ", ".join(map(str, gids[len(COMPOSE_GID_SETTINGS):]))
            fix += f", and add group(s) {others} to group_add in docker/rocm.yml"
    else:
        names = [_group_name(g) for g in gids]
        fix = (f"add yourself to group(s) {', '.join(names)} (`sudo usermod -aG "
               f"{','.join(names)} $USER`), then log out and in again")
    return f"{problem}; fix: {fix}"


def _group_name(gid: int) -> str:
    import grp  # POSIX only, like the device files themselves

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
