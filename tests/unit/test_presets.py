"""Presets: the seed's sizes, auto selection by what the machine can do, and a helpful error."""

import os
import platform
import subprocess
import sys

import pytest

from amp_tutorial import device
from amp_tutorial.presets import (
    CPU_FP16_WIDTH,
    GPU_SIZES_ENV,
    PRESET_ENV,
    PRESETS,
    UnknownPresetError,
    fp16_width,
    get_preset,
)
from tests.support import NOTEBOOKS

# /proc/cpuinfo lines of the CPU kinds `auto` tells apart
CPUINFO = {
    "xeon_amx": "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16\n",
    "epyc_zen4": "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n",
    "epyc_zen3_avx2": "flags\t\t: fpu sse2 avx2 fma f16c\n",
    "arm_bf16": "Features\t: fp asimd sve bf16 i8mm\n",
    "arm_no_bf16": "Features\t: fp asimd crc32\n",
}


# whether PyTorch's oneDNN runs bf16 on each kind (it needs avx512bw/vl/dq on x86, bf16 on Arm)
ONEDNN_BF16 = {"xeon_amx": True, "epyc_zen4": True, "epyc_zen3_avx2": False, "arm_bf16": True,
               "arm_no_bf16": False, None: None}


@pytest.fixture
def cpu_kind(tmp_path, monkeypatch):
    """Point the course at another CPU's /proc/cpuinfo (None: a machine without one), with
    oneDNN's bf16 kernels on or off as on that CPU, or as ``onednn`` says."""
    monkeypatch.delenv(PRESET_ENV, raising=False)

    def use(kind: str | None, onednn: bool | None = None) -> None:
        path = tmp_path / "cpuinfo"
        if kind is not None:
            path.write_text(f"processor\t: 0\n{CPUINFO[kind]}")
        monkeypatch.setattr(device, "CPUINFO", str(path))
        on = ONEDNN_BF16[kind] if onednn is None else onednn
        monkeypatch.setattr(device, "onednn_bf16", lambda: on)
    return use


def test_paper_preset_matches_the_seed():
    paper = PRESETS["paper"]
    assert (paper.grid, paper.hidden, paper.n_hidden_layers, paper.steps) == (512, 256, 2, 512)


def test_presets_shrink_from_paper_to_smoke():
    paper, cpu, small, smoke = (PRESETS[n] for n in ("paper", "cpu", "small", "smoke"))
    assert paper.grid > cpu.grid > small.grid > smoke.grid
    assert paper.hidden > cpu.hidden > small.hidden > smoke.hidden
    assert paper.steps > cpu.steps >= small.steps > smoke.steps


@pytest.mark.parametrize(("device_type", "kind", "expected"), [
    ("cuda", "epyc_zen3_avx2", "paper"),  # a GPU: whatever the host CPU
    ("xpu", "epyc_zen3_avx2", "paper"),
    ("mps", "arm_no_bf16", "cpu"),
    ("cpu", "xeon_amx", "cpu"),
    ("cpu", "epyc_zen4", "cpu"),
    ("cpu", "arm_bf16", "cpu"),
    ("cpu", "epyc_zen3_avx2", "small"),  # bf16 emulated: the smaller sizes
    ("cpu", "arm_no_bf16", "small"),
    ("cpu", None, "small"),  # no /proc/cpuinfo (macOS, Windows): not known to be native
])
def test_auto_picks_by_what_the_machine_can_do(cpu_kind, device_type, kind, expected):
    cpu_kind(kind)
    assert get_preset("auto", device_type).name == expected
    assert get_preset(None, device_type).name == expected


@pytest.mark.parametrize(("kind", "says"), [
    ("epyc_zen4", "so the `auto` preset is `cpu`"),
    ("epyc_zen3_avx2", "so the `auto` preset is `small` here"),
    (None, "so the `auto` preset is `small` here"),
])
def test_the_device_line_says_which_preset_auto_picks_and_why(cpu_kind, kind, says):
    cpu_kind(kind)
    text = device.describe_device(device.select_device("cpu"))
    assert says in text
    assert ("on a CPU with native bf16 it is `cpu`" in text) is (kind != "epyc_zen4")


def test_bf16_flags_with_onednn_capped_count_as_emulated(cpu_kind):
    """ONEDNN_MAX_CPU_ISA=AVX2 on a Zen 4: the instructions are there, PyTorch does not use them."""
    cpu_kind("epyc_zen4", onednn=False)
    assert get_preset("auto", "cpu").name == "small"
    info = device.select_device("cpu")
    text = device.describe_device(info)
    assert info.native_bf16 is False
    assert "the CPU has avx512_bf16, but oneDNN's bf16 kernels are off" in text
    assert "so the `auto` preset is `small` here" in text


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86 oneDNN cap")
def test_capping_onednn_at_avx2_makes_this_cpu_emulate_bf16():
    """The rehearsal docs/devices.md gives, in a real process: oneDNN's bf16 path goes off and
    ``auto`` picks ``small``, whatever this CPU has."""
    code = ("from amp_tutorial import device; from amp_tutorial.presets import get_preset; "
            "print(device.onednn_bf16(), get_preset('auto', 'cpu').name)")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    env.pop(PRESET_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "small"]


def test_environment_overrides_auto(monkeypatch):
    monkeypatch.setenv(PRESET_ENV, "Smoke ")
    assert get_preset(device_type="cuda").name == "smoke"
    assert get_preset("paper", "cpu").name == "paper"  # an explicit argument wins


def test_unknown_name_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv(PRESET_ENV, "huge")
    expected = r"'huge'.*AMP_TUTORIAL_PRESET.*auto, paper, cpu, small, smoke"
    with pytest.raises(UnknownPresetError, match=expected):
        get_preset()


def test_transformer_sizes_shrink_from_paper_to_smoke():
    paper, cpu, small, smoke = (PRESETS[n].transformer for n in ("paper", "cpu", "small", "smoke"))
    assert paper.d_model >= cpu.d_model > small.d_model >= smoke.d_model
    assert paper.seq_len > max(cpu.seq_len, small.seq_len) >= smoke.seq_len
    # tokens x width^2 per step, the matmuls' work: the bf16-native size does the most on a CPU
    work = [t.batch * t.seq_len * t.d_model**2 for t in (paper, cpu, small, smoke)]
    assert work == sorted(work, reverse=True) and len(set(work)) == 4


@pytest.mark.parametrize("name", list(PRESETS))
def test_transformer_task_is_not_solved_by_guessing(name):
    sizes = PRESETS[name].transformer
    assert sizes.d_model % sizes.n_heads == 0 and sizes.seq_len % 2 == 0
    # the target is far above chance (1 / n_symbols per answer token), so a loop that does not
    # learn misses it
    assert sizes.accuracy_target >= 5 / sizes.n_symbols
    assert sizes.warmup < sizes.steps


@pytest.mark.parametrize("name", list(PRESETS))
def test_fp16_width_narrows_on_a_cpu_only(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GPU_SIZES_ENV, raising=False)
    preset = PRESETS[name]
    assert fp16_width(preset, "cpu") == min(preset.hidden, CPU_FP16_WIDTH)
    for gpu in ("cuda", "xpu", "mps"):
        assert fp16_width(preset, gpu) == preset.hidden
    monkeypatch.setenv(GPU_SIZES_ENV, "0")
    assert fp16_width(preset, "cpu") == min(preset.hidden, CPU_FP16_WIDTH)


def test_gpu_sizes_give_a_cpu_the_gpus_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GPU_SIZES_ENV, "1")
    assert fp16_width(PRESETS["paper"], "cpu") == 256
    assert fp16_width(PRESETS["cpu"], "cpu") == 128
    monkeypatch.delenv(GPU_SIZES_ENV)
    assert fp16_width(PRESETS["paper"], "cpu") == 16


def test_a_bad_gpu_sizes_value_names_the_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GPU_SIZES_ENV, "yes")
    with pytest.raises(ValueError, match=f"{GPU_SIZES_ENV}='yes'.*use 1"):
        fp16_width(PRESETS["paper"], "cpu")


def test_lessons_size_their_fp16_network_with_the_helper_only() -> None:
    """The memory tool's variable reaches every lesson's fp16 width: none narrows it itself."""
    users = sorted(path.name[:2] for path in NOTEBOOKS.glob("[0-9][0-9]_*.py")
                   if "fp16_width(preset, fp16_device.type)" in path.read_text(encoding="utf-8"))
    assert users == ["02", "09", "10"]
    for path in NOTEBOOKS.glob("[0-9][0-9]_*.py"):
        assert "min(preset.hidden" not in path.read_text(encoding="utf-8"), path.name
