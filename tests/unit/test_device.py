"""Device selection: the right device, a clear error for one that is missing, honest dtypes."""

import inspect
import json
import os
import subprocess
import sys
import warnings
from contextlib import contextmanager

import pytest
import torch

from amp_tutorial import device as device_module
from amp_tutorial.device import (
    BF16_NOT_OFFERED,
    DETAILS_HINT,
    DEVICE_ENV,
    DTYPE_ENV,
    ONEDNN_ISA_CAPS,
    ClosedDeviceFile,
    DeviceInfo,
    DeviceNotAvailableError,
    _put_first,
    _requested_dtype,
    _supported_amp_dtypes,
    available_devices,
    cpu_bf16_flags,
    describe_device,
    device_line,
    dtype_name,
    fp32_baseline,
    has_fp32_precision_api,
    onednn_bf16,
    rocm_bf16_native,
    select_device,
    set_strict_fp32,
    tf32_in_use,
    tf32_state,
)
from amp_tutorial.presets import get_preset


def test_cpu_is_always_available_and_last():
    devices = available_devices()
    assert devices[-1] == "cpu"
    assert ("cuda" in devices) == torch.cuda.is_available()


def test_default_picks_best_available(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert select_device().type == available_devices()[0]


def test_cpu_uses_bf16_without_scaler():
    info = select_device("cpu")
    assert info.amp_dtype == torch.bfloat16
    assert not info.needs_grad_scaler()
    assert info.needs_grad_scaler(torch.float16)
    assert not info.has_allocator_stats
    assert info.backend == "CPU" and info.name


def test_env_variable_overrides(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert select_device().type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA/ROCm GPU")
def test_missing_device_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(DeviceNotAvailableError, match=r"'cuda' is not available.*available: .*cpu"):
        select_device()


def test_nonsense_device_name_lists_choices():
    with pytest.raises(DeviceNotAvailableError, match="cuda, mps, xpu, cpu"):
        select_device("gpu0")


def test_dtype_names_and_description():
    assert [dtype_name(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == [
        "fp32", "fp16", "bf16"]
    text = describe_device(select_device("cpu"))
    assert "bf16" in text and "no GradScaler needed" in text


def test_cpu_baseline_is_plain_fp32():
    assert fp32_baseline(select_device("cpu")) == "fp32"


def test_cpu_bf16_flags_read_from_cpuinfo(tmp_path):
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma f16c\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_bf16_flags(str(amx)) == ("avx512_bf16", "amx_bf16")
    assert cpu_bf16_flags(str(avx2)) == ()
    assert cpu_bf16_flags(str(arm)) == ("bf16",)
    assert cpu_bf16_flags(str(tmp_path / "missing")) is None


# oneDNN ISAs without its bf16 kernels (those need avx512_core or avx_ne_convert)
NO_BF16_ISAS = {"SSE41", "AVX", "AVX2", "AVX2_VNNI"}


def test_cpu_description_says_whether_bf16_is_native():
    info = select_device("cpu")
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read().split()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    # oneDNN capped below its bf16 kernels (as the suite's AVX2 emulation does) runs bf16 as an
    # AVX2-only CPU does, whatever the flags say
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in NO_BF16_ISAS
    native = any(f in flags for f in ("avx512_bf16", "amx_bf16", "bf16")) and not capped
    assert info.native_bf16 is native
    text = describe_device(info)
    assert f"native bf16 on this CPU: {'yes' if native else 'no'}" in text
    assert torch.backends.cpu.get_cpu_capability() in text
    if not native:
        assert "slower than fp32" in text  # the real cause of a bf16 slowdown, named


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_gpu_offers_bf16_only_where_native():
    info = select_device("cuda")
    native = (torch.cuda.is_bf16_supported(including_emulation=False)
              if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters
              else torch.cuda.get_device_capability()[0] >= 8)
    assert (torch.bfloat16 in info.amp_dtypes) is native
    says_why = any(note.startswith(BF16_NOT_OFFERED) for note in info.notes)
    assert says_why is not native  # a GPU without native bf16 says why (and only that one)


def _tf32_snapshot() -> dict[str, object]:
    """Every TF32 setting torch has, legacy and new (each read can raise in a mixed state)."""
    b = torch.backends
    reads = {"cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
             "matmul.allow_tf32": lambda: b.cuda.matmul.allow_tf32}
    if has_fp32_precision_api():
        reads = {**reads, "float32_matmul_precision": torch.get_float32_matmul_precision,
                 "generic": lambda: b.fp32_precision, "cuda": lambda: b.cudnn.fp32_precision,
                 "conv": lambda: b.cudnn.conv.fp32_precision,
                 "rnn": lambda: b.cudnn.rnn.fp32_precision,
                 "matmul": lambda: b.cuda.matmul.fp32_precision,
                 "mkldnn.matmul": lambda: b.mkldnn.matmul.fp32_precision}
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.9 warns that the legacy API will go
        for name, read in reads.items():
            try:
                out[name] = read()
            except RuntimeError:
                out[name] = "raises"
    return out


@contextmanager
def tf32_settings_kept():
    """Every TF32 setting as it is, all put back after the block (they are process-wide)."""
    saved = _tf32_snapshot()
    try:
        yield saved
    finally:
        b = torch.backends
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch 2.9 warns that the legacy API will go
            if saved["cudnn.allow_tf32"] != "raises":  # a mixed state is put back below
                b.cudnn.allow_tf32 = saved["cudnn.allow_tf32"]
            if not has_fp32_precision_api():
                b.cuda.matmul.allow_tf32 = saved["matmul.allow_tf32"]
            elif saved["float32_matmul_precision"] != "raises":
                torch.set_float32_matmul_precision(saved["float32_matmul_precision"])
        if has_fp32_precision_api():
            b.fp32_precision, b.cudnn.fp32_precision = saved["generic"], saved["cuda"]
            b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = saved["conv"], saved["rnn"]
            b.cuda.matmul.fp32_precision = saved["matmul"]
            b.mkldnn.matmul.fp32_precision = saved["mkldnn.matmul"]
        assert _tf32_snapshot() == saved


@pytest.fixture
def tf32_settings():
    with tf32_settings_kept() as saved:
        yield saved


needs_fp32_precision = pytest.mark.skipif(not has_fp32_precision_api(),
                                          reason="this torch has only allow_tf32")

# a CUDA device as the course sees an H100 (compute capability 9.0): nothing here runs on it
FAKE_H100 = DeviceInfo(torch.device("cuda"), "CUDA 13.0", "a fake H100",
                       (torch.float16, torch.bfloat16), True)


def pretend_ampere(monkeypatch) -> DeviceInfo:
    """``FAKE_H100``, with torch answering as on that GPU where the course asks (no ROCm)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    return FAKE_H100


@pytest.fixture
def fake_ampere(monkeypatch):
    return pretend_ampere(monkeypatch)


def test_strict_fp32_switch_uses_the_installed_api(tf32_settings):
    assert tf32_state() == {"convolutions": True, "matmuls": False}  # PyTorch's defaults
    set_strict_fp32(True)
    assert tf32_state() == {"convolutions": False, "matmuls": False}
    if has_fp32_precision_api():
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    set_strict_fp32(False)
    assert tf32_state() == {"convolutions": True, "matmuls": False}


def test_strict_fp32_is_strict_for_rnns_too(tf32_settings):
    """Issue 46: ``set_strict_fp32(True)`` left ``cudnn.rnn.fp32_precision = "tf32"``."""
    assert tf32_state(rnns=True) == {"convolutions": True, "matmuls": False, "rnns": True}
    set_strict_fp32(True)
    assert tf32_state(rnns=True) == {"convolutions": False, "matmuls": False, "rnns": False}
    if has_fp32_precision_api():
        assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
    set_strict_fp32(False)
    assert tf32_state(rnns=True)["rnns"] is True


@needs_fp32_precision
def test_strict_fp32_keeps_the_legacy_getters_answering(tf32_settings):
    """The legacy getters check that they agree with the new settings and raise where they do
    not; torch reads them itself (``cudnn.set_flags``, hence ``torch.export`` from 2.11;
    Inductor's convolution templates; 2.9's Inductor ``matmul.allow_tf32``)."""
    for strict in (True, False):
        set_strict_fp32(strict)
        assert torch.backends.cudnn.allow_tf32 is not strict  # raised after the new API alone
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "highest"
        torch.backends.cudnn.set_flags(*torch.backends.cudnn.set_flags(False))
    set_strict_fp32(True)
    exported = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    assert exported.graph_module is not None


@needs_fp32_precision
@pytest.mark.parametrize(("settings", "expected"), [
    ({}, {"convolutions": True, "matmuls": False, "rnns": True}),  # a fresh process
    # every level "none": torch resolves it to "none", no TF32 (the old reading said TF32)
    ({"conv": "none", "rnn": "none"}, {"convolutions": False, "matmuls": False, "rnns": False}),
    # ("cuda", "all") is torch.backends.cudnn.fp32_precision, the parent of the matmuls too
    ({"conv": "none", "rnn": "none", "cuda": "tf32"},
     {"convolutions": True, "matmuls": True, "rnns": True}),
    ({"matmul": "none", "generic": "tf32"},
     {"convolutions": True, "matmuls": True, "rnns": True}),
    ({"matmul": "ieee", "cuda": "tf32"}, {"convolutions": True, "matmuls": False, "rnns": True}),
    ({"rnn": "ieee"}, {"convolutions": True, "matmuls": False, "rnns": False}),
], ids=["fresh", "all-none", "cuda-level", "generic-level", "op-level-wins", "rnn-only"])
def test_tf32_state_reads_the_chain_as_torch_resolves_it(tf32_settings, settings, expected):
    """op -> ("cuda", "all") -> generic, the first level not "none" (``Context::float32Precision``
    in ``aten/src/ATen/Context.cpp``); the same on torch 2.9.0, 2.11.0 and 2.14.1 (probed)."""
    handles = {"conv": torch.backends.cudnn.conv, "rnn": torch.backends.cudnn.rnn,
               "matmul": torch.backends.cuda.matmul, "cuda": torch.backends.cudnn,
               "generic": torch.backends}
    for name, value in settings.items():
        handles[name].fp32_precision = value
    assert tf32_state(rnns=True) == expected
    assert tf32_state() == {k: v for k, v in expected.items() if k != "rnns"}
    # torch's own getters answer with the resolved value, and agree
    resolved = {"convolutions": torch.backends.cudnn.conv.fp32_precision,
                "matmuls": torch.backends.cuda.matmul.fp32_precision,
                "rnns": torch.backends.cudnn.rnn.fp32_precision}
    assert {k: v == "tf32" for k, v in resolved.items()} == expected


def test_the_baseline_is_named_by_what_runs_in_tf32(tf32_settings, fake_ampere):
    assert fp32_baseline(fake_ampere) == "fp32 (TF32 convolutions)"
    set_strict_fp32(True)
    assert tf32_in_use(fake_ampere, rnns=True) == []
    assert fp32_baseline(fake_ampere) == "fp32 (strict, TF32 off)"
    if has_fp32_precision_api():
        torch.backends.cudnn.rnn.fp32_precision = "tf32"  # strict is not strict with this on
        assert fp32_baseline(fake_ampere) == "fp32 (TF32 RNNs)"


def test_a_model_without_convolutions_is_not_called_tf32_for_them(tf32_settings, fake_ampere):
    # the H200 bench of 2026-11-27 labelled the transformer's fp32 "TF32 convolutions"
    assert fp32_baseline(fake_ampere, ("matmuls",)) == "fp32 (no TF32 in its matmuls)"
    assert fp32_baseline(fake_ampere, ("convolutions",)) == "fp32 (TF32 convolutions)"
    set_strict_fp32(True)
    assert fp32_baseline(fake_ampere, ("matmuls",)) == "fp32 (strict, TF32 off)"


def test_rocm_never_counts_tf32_whatever_the_flags(tf32_settings, fake_ampere, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "7.1.25424")
    assert fake_ampere.is_rocm
    assert tf32_state()["convolutions"] is True  # the flag says TF32 ...
    assert tf32_in_use(fake_ampere, rnns=True) == []  # ... ROCm does not use it
    assert fp32_baseline(fake_ampere) == "fp32"


@needs_fp32_precision
def test_non_strict_restores_what_a_fresh_process_starts_with(tf32_settings):
    read = ("import json, warnings, torch\nfrom amp_tutorial.device import has_fp32_precision_api\n"
            f"{inspect.getsource(_tf32_snapshot)}print(json.dumps(_tf32_snapshot()))")
    fresh = json.loads(subprocess.run([sys.executable, "-c", read], capture_output=True,
                                      text=True, check=True).stdout)
    set_strict_fp32(True)
    set_strict_fp32(False)
    # "tf32" for cuDNN, "none" (inherit) for the matmuls, not "ieee"; legacy getters answer
    assert _tf32_snapshot() == fresh


@pytest.mark.parametrize("native", [True, False])
def test_xpu_offers_bf16_only_where_native(monkeypatch, native):
    asked = []

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return including_emulation or native  # torch/xpu/__init__.py: emulation counts by default

    monkeypatch.setattr(torch.xpu, "is_bf16_supported", is_bf16_supported, raising=False)
    dtypes = _supported_amp_dtypes(torch.device("xpu"))
    assert (torch.bfloat16 in dtypes) is native and torch.float16 in dtypes
    assert asked == [False]  # asked for native support, not the emulation-counting default


@pytest.mark.parametrize(("arch", "native"), [
    ("gfx942:sramecc+:xnack-", True),  # MI300X
    ("gfx90a:sramecc+:xnack-", True),  # MI250X
    ("gfx908", True),  # MI100
    ("gfx1100", True),  # RX 7900 XTX (RDNA 3, WMMA)
    ("gfx1201", True),  # RDNA 4
    ("gfx950", True),  # MI350
    ("gfx906", False),  # MI50 (Vega 20)
    ("gfx1030", False),  # RX 6800 (RDNA 2)
])
def test_rocm_bf16_read_from_the_architecture(arch, native):
    assert rocm_bf16_native(arch) is native


def test_rocm_is_bf16_supported_cannot_tell():
    # the reason the course reads the architecture: on ROCm torch answers True for every device
    body = inspect.getsource(torch.cuda.is_bf16_supported).split('"""')[-1]  # after the docstring
    assert body.index("torch.version.hip") < body.index("including_emulation")
    assert "return True" in body.split("torch.version.hip")[1].split("\n")[1]


def test_dtype_setting_puts_fp16_first_on_the_cpu(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "float16")
    info = select_device("cpu")
    assert info.amp_dtypes == (torch.float16, torch.bfloat16)  # as an Ampere+ NVIDIA GPU offers
    assert info.needs_grad_scaler() and not info.needs_grad_scaler(torch.bfloat16)
    assert "GradScaler needed" in describe_device(info) and DTYPE_ENV in describe_device(info)
    monkeypatch.setenv(DTYPE_ENV, "bf16")
    assert select_device("cpu").amp_dtypes == (torch.bfloat16,)
    monkeypatch.setenv(DTYPE_ENV, "auto")
    assert select_device("cpu").amp_dtypes == (torch.bfloat16,)


def test_dtype_setting_rejects_what_the_device_lacks(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "float8")
    with pytest.raises(ValueError, match="auto, float16, bfloat16"):
        select_device("cpu")
    # a GPU without native bf16 offers (float16,): asking for bf16 there is a clear error
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    with pytest.raises(ValueError, match=r"does not offer.*offered: fp16.*unset AMP_TUTORIAL"):
        _put_first((torch.float16,), torch.device("cuda"), _requested_dtype())


def test_fp32_precision_api_detected_by_torch_version():
    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) >= (2, 9):  # the fp32_precision settings are documented from torch 2.9
        assert has_fp32_precision_api()


def test_onednn_bf16_follows_the_cpu_flags():
    try:
        flags = set(open("/proc/cpuinfo", encoding="utf-8").read().split())
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if not {"avx2", "sse2"} & flags or onednn_bf16() is None:
        pytest.skip("not an x86 CPU, or this torch has no oneDNN")
    if any(os.environ.get(name) for name in ONEDNN_ISA_CAPS):
        pytest.skip("oneDNN's ISA is capped in this environment (a rehearsal of an older CPU)")
    avx512_core = {"avx512bw", "avx512vl", "avx512dq"} <= flags
    if avx512_core or "avx_ne_convert" in flags:
        assert onednn_bf16() is True
    else:  # an AVX2-only CPU: bf16 matmuls take ATen's fallback, and the device notes say so
        assert onednn_bf16() is False
        assert "oneDNN bf16 kernels: no" in describe_device(select_device("cpu"))


def test_a_gpu_without_native_bf16_says_why_in_a_note_of_its_own(monkeypatch):
    """The probe ``device-cuda-bf16`` looks for this note among all the device's notes (the host
    memory note is there on every device: counting notes failed on an H100)."""
    from amp_tutorial import device as device_module

    monkeypatch.setattr(device_module, "_cuda_bf16_native", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.version, "hip", None)
    native, notes = device_module._bf16_support(torch.device("cuda"))
    assert native is False and len(notes) == 1
    assert notes[0].startswith(BF16_NOT_OFFERED) and "compute capability 7.5" in notes[0]
    monkeypatch.setattr(device_module, "_cuda_bf16_native", lambda device: True)
    assert device_module._bf16_support(torch.device("cuda")) == (True, ())


# --- the one line a lesson opens with -------------------------------------------------------
EMULATING_CPU = DeviceInfo(torch.device("cpu"), "CPU", "AMD EPYC", (torch.bfloat16,), False,
                           notes=("native bf16 on this CPU: no (...)", "host memory: ..."))


def test_the_device_line_is_one_line_with_the_dtype_the_scaler_and_the_preset(monkeypatch):
    monkeypatch.setattr(device_module, "closed_device_files", lambda *args: [])  # no GPU here
    line = device_line(EMULATING_CPU, get_preset("small"))
    assert "\n" not in line
    assert line == ("CPU (AMD EPYC, bf16 emulated, slower than fp32) · autocast bfloat16 · "
                    "no GradScaler needed · preset 'small' (grid 128, hidden 64, 64 steps) · "
                    f"{DETAILS_HINT}")
    assert "host memory" not in line  # the notes wait for verbose=True
    fp16 = device_line(FAKE_H100, get_preset("paper"), sizes="d_model 512, 600 steps")
    assert fp16.startswith("a fake H100 (CUDA 13.0, device 'cuda') · autocast float16 · "
                           "GradScaler needed · preset 'paper' (d_model 512, 600 steps)")
    bf16 = device_line(FAKE_H100, dtype=torch.bfloat16)  # a lesson that picks bf16 itself
    assert "autocast bfloat16 in this lesson (the device's first: fp16) · no GradScaler" in bf16


def test_the_device_line_keeps_a_gpu_closed_to_the_learner_in_view(monkeypatch):
    monkeypatch.setattr(device_module, "closed_device_files",
                        lambda *args: [ClosedDeviceFile("/dev/kfd", 44)])
    line = device_line(EMULATING_CPU, get_preset("smoke"))
    assert "\n" not in line and "autocast bfloat16" in line and "preset 'smoke'" in line
    assert "no GPU: the GPU device files /dev/kfd (group 44) are closed to this user" in line
    assert "fix:" in line


def test_the_device_line_says_what_set_the_dtype_and_verbose_adds_the_notes(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "float16")
    info = select_device("cpu")
    line = device_line(info)
    assert "autocast float16 (AMP_TUTORIAL_DTYPE=fp16) · GradScaler needed" in line
    details = device_line(info, get_preset("smoke"), verbose=True).split("\n")
    assert details[0] == line.removesuffix(f" · {DETAILS_HINT}") + " · preset 'smoke' (grid 32, " \
        "hidden 16, 12 steps)"
    assert [d.strip() for d in details[2:]] == [*info.notes, "preset 'smoke': "
                                                  + get_preset("smoke").description]
