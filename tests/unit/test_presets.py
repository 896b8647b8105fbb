"""Presets: the seed's sizes, auto selection by device, and a helpful error for a typo."""

import pytest

from amp_tutorial.presets import PRESET_ENV, PRESETS, UnknownPresetError, get_preset


def test_paper_preset_matches_the_seed():
    paper = PRESETS["paper"]
    assert (paper.grid, paper.hidden, paper.n_hidden_layers, paper.steps) == (512, 256, 2, 512)


def test_presets_shrink_from_paper_to_smoke():
    paper, cpu, smoke = PRESETS["paper"], PRESETS["cpu"], PRESETS["smoke"]
    assert paper.grid > cpu.grid > smoke.grid
    assert paper.steps > cpu.steps > smoke.steps


@pytest.mark.parametrize(("device_type", "expected"),
                         [("cuda", "paper"), ("xpu", "paper"), ("cpu", "cpu"), ("mps", "cpu")])
def test_auto_picks_by_device(monkeypatch, device_type, expected):
    monkeypatch.delenv(PRESET_ENV, raising=False)
    assert get_preset("auto", device_type).name == expected
    assert get_preset(None, device_type).name == expected


def test_environment_overrides_auto(monkeypatch):
    monkeypatch.setenv(PRESET_ENV, "Smoke ")
    assert get_preset(device_type="cuda").name == "smoke"
    assert get_preset("paper", "cpu").name == "paper"  # an explicit argument wins


def test_unknown_name_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv(PRESET_ENV, "huge")
    expected = r"'huge'.*AMP_TUTORIAL_PRESET.*auto, paper, cpu, smoke"
    with pytest.raises(UnknownPresetError, match=expected):
        get_preset()


def test_transformer_sizes_shrink_from_paper_to_smoke():
    paper, cpu, smoke = (PRESETS[n].transformer for n in ("paper", "cpu", "smoke"))
    for field in ("d_model", "seq_len"):
        assert getattr(paper, field) > getattr(cpu, field) >= getattr(smoke, field), field
    assert paper.steps > cpu.steps > smoke.steps


@pytest.mark.parametrize("name", list(PRESETS))
def test_transformer_task_is_not_solved_by_guessing(name):
    sizes = PRESETS[name].transformer
    assert sizes.d_model % sizes.n_heads == 0 and sizes.seq_len % 2 == 0
    # the target is far above chance (1 / n_symbols per answer token), so a loop that does not
    # learn misses it
    assert sizes.accuracy_target >= 5 / sizes.n_symbols
    assert sizes.warmup < sizes.steps
