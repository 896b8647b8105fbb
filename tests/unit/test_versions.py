"""amp_tutorial.versions: one supported torch range, stated where pip, PDM and the image read it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import tomllib

from amp_tutorial import versions
from tests.support import ROOT


def locked(name: str) -> str:
    lock = tomllib.loads((ROOT / "pdm.lock").read_text())
    return next(p["version"] for p in lock["package"] if p["name"] == name)


def test_pyproject_states_the_range_versions_holds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_requirement = next(d for d in project["dependencies"] if re.match(r"torch\W", d))
    assert torch_requirement == f"torch{versions.SUPPORTED_RANGE}"


def test_the_lock_is_the_newest_tested_release_with_its_torchao() -> None:
    assert locked("torch") == versions.LOCKED_TORCH
    assert locked("torchao") == versions.torchao_for(versions.LOCKED_TORCH)


@pytest.mark.parametrize("version", versions.TESTED_TORCHES)
def test_every_tested_release_is_in_the_range(version: str) -> None:
    assert versions.is_supported(version)


@pytest.mark.parametrize(("version", "supported"), [
    ("2.8.0", False), ("2.9.0+cu128", True), ("2.9.1+rocm7.1", True), ("2.14.1", True),
    ("2.15.0", False), ("2.10.0.dev20251001", True),
])
def test_the_range_edges(version: str, supported: bool) -> None:
    assert versions.is_supported(version) is supported


def test_pip_install_brings_no_torchao_and_pdm_sync_brings_the_locks() -> None:
    # a torchao release imports on one torch: as a package dependency, `pip install .` on torch
    # 2.9 got 0.18.0, which does not import there (issue 46); PDM installs its own group, and CI
    # syncs it so lesson 16 trains in FP8 on the lock's torch
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not [d for d in pyproject["project"]["dependencies"] if d.startswith("torchao")]
    wanted = versions.torchao_for(versions.LOCKED_TORCH)
    assert pyproject["dependency-groups"]["fp8"] == [f"torchao=={wanted}"]
    lock = tomllib.loads((ROOT / "pdm.lock").read_text())
    assert next(p for p in lock["package"] if p["name"] == "torchao")["groups"] == ["fp8"]
    assert re.search(r"^pdm sync .*-G fp8", (ROOT / ".ci/run").read_text(), re.MULTILINE)


def test_torchao_0_18_is_not_offered_to_torch_2_9() -> None:
    # 0.18.0 imports `ScalingType` from torch.nn.functional, which torch 2.9 lacks; torchao's own
    # table builds 0.14.1 against torch 2.9.0 and 0.15.0 against 2.9.1
    assert versions.torchao_for("2.9.0") == "0.14.1"
    assert versions.torchao_for("2.9.1+rocm7.1") == "0.15.0"
    assert versions.torchao_for("2.8.0") is None


def test_check_refuses_a_torch_outside_the_range_in_one_line() -> None:
    # the image's build runs this file on its own (no package): --check on this torch passes
    script = ROOT / "src/amp_tutorial/versions.py"
    ok = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    outside = subprocess.run(
        [sys.executable, "-c", "import runpy, sys, torch; torch.__version__ = '2.8.0'; "
         f"sys.argv = ['versions', '--check']; runpy.run_path({str(script)!r}, "
         "run_name='__main__')"], capture_output=True, text=True)
    assert outside.returncode == 1
    lines = outside.stderr.strip().splitlines()
    assert len(lines) == 1 and "2.8.0" in lines[0] and versions.SUPPORTED_RANGE in lines[0], lines


def test_the_docker_defaults_torch_runs_every_lesson() -> None:
    # the default variant's base is rocm/pytorch ..._release_2.9.1 (torchao 0.15.0): issue 46
    dockerfile = (ROOT / "Dockerfile").read_text()
    default_base = re.search(r"ARG BASE_IMAGE=rocm/pytorch:\S*release_(\d+\.\d+\.\d+)", dockerfile)
    assert default_base is not None, "the Dockerfile's default base is no rocm/pytorch release"
    assert default_base.group(1) in versions.OTHER_TORCHES


@pytest.mark.parametrize(("version", "tested"), [
    ("2.9.0+cu128", True), ("2.9.1+rocm7.1", True), ("2.9.2", False), ("2.10.0", False),
    ("2.11.0", True), ("2.11.1", True), ("2.12.0", False), ("2.13.0", False), ("2.14.0", True),
])
def test_untested_releases_are_named(version: str, tested: bool) -> None:
    assert versions.is_tested(version) is tested
    assert (versions.parse(version)[:2] in versions.UNTESTED_RELEASES) is (
        not tested and versions.parse(version)[:2] != (2, 9))


def test_the_image_checks_its_base_and_picks_torchao_by_torch() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "amp-tutorial-versions.py --check" in dockerfile
    assert "amp-tutorial-versions.py --torchao" in dockerfile
    assert re.search(r"skip = /\^\(torch\|torchao\|", dockerfile)  # the lock's torchao dropped


def test_torchao_is_imported_without_torchs_pytree_log_line() -> None:
    # torch 2.14 logs a deprecation on stderr when torchao 0.18 registers an Enum as a pytree
    # constant; in a lesson that is a red box about nothing the learner did (issue 42 item 5)
    def stderr_of(code: str) -> str:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stderr

    plain = stderr_of("import torch, torchao, torchao.float8")
    quiet = stderr_of("import logging; from amp_tutorial.versions import import_torchao; "
                      "import_torchao(); "
                      "assert logging.getLogger('torch.utils._pytree').level == logging.NOTSET")
    assert "_pytree.py" not in quiet, quiet
    if versions.parse(__import__("torch").__version__)[:2] >= (2, 14):
        assert "_pytree.py" in plain, "torch no longer logs it: import_torchao can go"
