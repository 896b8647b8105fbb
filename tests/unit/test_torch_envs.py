"""tests.support.torch_envs: the overlays CI keeps between runs, and the ones it removes."""

from __future__ import annotations

from pathlib import Path

import pytest

from amp_tutorial import versions
from tests.support import torch_envs


def test_only_overlays_no_test_runs_are_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.setattr(torch_envs, "CACHE", tmp_path)
    kept = [torch_envs.overlay_dir(version) for version in versions.OTHER_TORCHES]
    dropped = tmp_path / "torch-2.8.0-py3.11-r1"  # a release the tests no longer run
    old_recipe = tmp_path / kept[0].name.replace(torch_envs.RECIPE, "r0")
    for path in (*kept, dropped, old_recipe):
        path.mkdir()
    (tmp_path / "notes.txt").write_text("not an overlay")
    assert torch_envs.stale_overlays() == sorted([dropped, old_recipe])

