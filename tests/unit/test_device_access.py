"""device.gpu_access_problem: GPU device files closed to the user are found, with their group,
and the fix named.

A stand-in device file is a plain file with the modes and group a ROCm host gives /dev/kfd
(0660, group render). Root may open anything, so as root the probe runs as `nobody` in a forked
child, with and without the file's group; as another user the file is closed by mode 000.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from amp_tutorial.device import (
    IN_CONTAINER_ENV,
    ClosedDeviceFile,
    closed_device_files,
    gpu_access_problem,
)

HOST_RENDER_GID = 4242  # a group number no image and no test user has
NOBODY = 65534

def _become_nobody(extra_groups: list[int]) -> None:
    os.setgroups(extra_groups)
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def probe(patterns: list[str], *, extra_groups: list[int] | None = None,
          in_container: bool = False) -> dict[str, Any]:
    """closed_device_files and gpu_access_problem, asked by a process that is not root: as root,
    a forked child that became nobody (os.access checks the real user and groups)."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(IN_CONTAINER_ENV, raising=False)
        if in_container:
            env.setenv(IN_CONTAINER_ENV, "1")
        initializer = _become_nobody if os.geteuid() == 0 else None
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"),
                                 initializer=initializer, initargs=(extra_groups or [],)) as pool:
            closed = pool.submit(closed_device_files, tuple(patterns)).result(timeout=60)
            problem = pool.submit(gpu_access_problem, closed).result(timeout=60)
    return {"closed": [[f.path, f.gid] for f in closed], "problem": problem}


@pytest.fixture
def device_files() -> Iterator[list[Path]]:
    """A kfd and a render node stand-in, closed to the probe: group HOST_RENDER_GID and 0660 as
    root (the probe runs as nobody), mode 000 otherwise. Not under pytest's tmp_path, whose
    parent only root may enter."""
    with tempfile.TemporaryDirectory(prefix="amp-tutorial-gpu-access-") as folder:
        Path(folder).chmod(0o755)
        files = [Path(folder, "kfd"), Path(folder, "renderD128")]
        for path in files:
            path.touch()
            if os.geteuid() == 0:
                os.chown(path, 0, HOST_RENDER_GID)
                path.chmod(0o660)
            else:
                path.chmod(0o000)
        yield files


def test_no_device_files_means_nothing_to_fix(tmp_path: Path) -> None:
    assert closed_device_files((str(tmp_path / "kfd"), str(tmp_path / "renderD*"))) == []
    assert gpu_access_problem([]) is None


def test_closed_files_are_found_with_their_group(device_files: list[Path]) -> None:
    kfd, render = device_files
    found = probe([str(kfd), str(render.parent / "renderD*")])
    expected_gid = HOST_RENDER_GID if os.geteuid() == 0 else os.getgid()
    assert found["closed"] == [[str(kfd), expected_gid], [str(render), expected_gid]]


def test_in_a_container_the_fix_is_the_compose_setting(device_files: list[Path]) -> None:
    kfd, render = device_files
    problem = probe([str(kfd), str(render)], in_container=True)["problem"]
    gid = HOST_RENDER_GID if os.geteuid() == 0 else os.getgid()
    assert f"{kfd} (group {gid})" in problem and f"{render} (group {gid})" in problem
    assert f"put RENDER_GID={gid} in the .env file" in problem
    assert "VIDEO_GID" not in problem  # one group owns both files: one setting


def test_on_a_host_the_fix_is_joining_the_group(device_files: list[Path]) -> None:
    problem = probe([str(p) for p in device_files])["problem"]
    assert "sudo usermod -aG" in problem and "RENDER_GID" not in problem


def test_a_member_of_the_group_may_open_them(device_files: list[Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("joining another group for the probe needs root")
    found = probe([str(p) for p in device_files], extra_groups=[HOST_RENDER_GID])
    assert found == {"closed": [], "problem": None}


def test_two_groups_give_both_compose_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IN_CONTAINER_ENV, "1")
    problem = gpu_access_problem([ClosedDeviceFile("/dev/kfd", 44),
                                  ClosedDeviceFile("/dev/dri/renderD128", 109)])
    assert problem is not None
    assert "put RENDER_GID=109 and VIDEO_GID=44 in the .env file" in problem  # render node first
