"""The Docker plumbing the docker-marked tests share (test_docker, test_hub), and the test base.

No registry is reachable in CI, so the base image every test image builds on is made here: a
Debian bookworm rootfs (debootstrap, so root is needed) with Python and a CPU torch wheel, imported
with `docker import` under BASE_TAG. Building it is provisioning, not a test: `.ci/run` runs

    python -m tests.support.docker_env

before the tests (a no-op when the image is there), and the `base_image` fixture only looks it up.
On it, one thin layer each makes stand-ins for the real bases' layouts (LAYOUTS: rocm/pytorch's
and pytorch/pytorch's), kept between runs too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

import pytest

from amp_tutorial import versions
from tests.support import ROOT, missing_tool

# The stand-in runs the CUDA variant's base torch (versions.DOCKER_TEST_TORCH, 2.9.0; every lesson
# runs on the ROCm default's 2.9.1 in an overlay):
# PyPI's wheel (a CUDA build: it runs on a CPU, and brings its CUDA libraries, about 4 GB).
# AMP_TUTORIAL_TEST_TORCH_WHEEL names a local wheel instead (a CPU build from another index).
TORCH_WHEEL = os.environ.get("AMP_TUTORIAL_TEST_TORCH_WHEEL")
TORCH_VERSION = (Path(TORCH_WHEEL).name.split("-")[1] if TORCH_WHEEL
                 else versions.DOCKER_TEST_TORCH)  # the CUDA variant's base
# The cache key: change the recipe version when build_base_image changes.
BASE_TAG = "amp-tutorial-test-base:bookworm-r2-torch-" + TORCH_VERSION.replace("+", "-")
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def missing(reason: str) -> NoReturn:
    """Skip for a tool this machine lacks; under CI=true the tool must be there, so fail."""
    missing_tool(reason, "see the README's 'How the course is tested' for what these tests need")


def run(args: list[str], *, timeout: float = 120, check: bool = True,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; on failure the message carries that output."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {result.returncode}\n"
                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def host_ca_bundle() -> str | None:
    """The CA bundle this machine trusts: builds behind a TLS-inspecting proxy need it."""
    candidates = [os.environ.get(v) for v in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")]
    candidates += [ssl.get_default_verify_paths().cafile, "/etc/ssl/certs/ca-certificates.crt"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def build_base_image(tag: str) -> None:
    """Debian bookworm + Python + torch TORCH_VERSION in /opt/venv, imported as `tag`."""
    ca_bundle = host_ca_bundle()
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="amp-tutorial-base-") as work:
        rootfs = Path(work) / "rootfs"
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm",
             rootfs, DEBIAN_MIRROR], timeout=900)
        torch_spec = f"torch=={TORCH_VERSION}"
        if TORCH_WHEEL:
            shutil.copy(TORCH_WHEEL, rootfs / "tmp")
            torch_spec = f"/tmp/{Path(TORCH_WHEEL).name}"
        pip_cert = []
        if ca_bundle:  # for pip inside the chroot; deleted before the import
            shutil.copy(ca_bundle, rootfs / "tmp/ca.pem")
            pip_cert = ["--cert", "/tmp/ca.pem"]
        clean_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        run(["chroot", rootfs, "python3", "-m", "venv", "/opt/venv"], env=clean_env)
        run(["chroot", rootfs, "/opt/venv/bin/pip", "install", "--quiet", "--no-cache-dir",
             "--disable-pip-version-check", *pip_cert, torch_spec], env=clean_env, timeout=1800)
        for leftover in [rootfs / "tmp/ca.pem", *(rootfs / "tmp").glob("*.whl"),
                         *(rootfs / "var/cache/apt/archives").glob("*.deb"),
                         *(rootfs / "var/lib/apt/lists").glob("*_*")]:
            leftover.unlink(missing_ok=True)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", rootfs, "-c", "."],
                               stdout=subprocess.PIPE)
        path = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        run(["docker", "import", "--change", f"ENV PATH={path}", "--change", 'CMD ["python"]',
             "-", tag], stdin=tar.stdout, timeout=600)
        assert tar.wait() == 0, "tar of the base rootfs failed"


def base_image_problem() -> str | None:
    """Why the test base cannot be built here, or None."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        return f"building the test base image {BASE_TAG} needs root and debootstrap"
    if TORCH_WHEEL and not Path(TORCH_WHEEL).is_file():
        return f"no torch wheel at {TORCH_WHEEL} (AMP_TUTORIAL_TEST_TORCH_WHEEL)"
    return None


def image_exists(tag: str) -> bool:
    return run(["docker", "image", "inspect", tag], check=False).returncode == 0


# The base images' layouts, each one thin layer on the test base (which already has Python and
# torch in a venv at /opt/venv, and Debian's video group, GID 44).
ROCM_LAYOUT_RECIPE = """
# rocm/pytorch: Ubuntu's user `ubuntu` (UID and GID 1000), a `render` group with the image's own
# number, and Python with torch in a venv at /opt/venv, whose torchrun runs that venv's Python.
RUN groupadd --system --gid 109 render \
 && groupadd --gid 1000 ubuntu \
 && useradd --create-home --uid 1000 --gid 1000 --shell /bin/bash ubuntu
"""
CONDA_LAYOUT_RECIPE = """
# pytorch/pytorch: Python is a prefix install under /opt/conda (not a venv) with torch in its own
# packages folder, torchrun runs /opt/conda/bin/python, and there is no other Python. Stand-in
# details: the interpreter is the base's Debian Python copied there (so its folder is called
# dist-packages), and that folder links to the base's torch rather than copying 900 MB.
RUN mkdir -p /opt/conda/bin /opt/conda/lib \
 && cp -a /usr/lib/python3.11 /opt/conda/lib/python3.11 \
 && cp /usr/bin/python3.11 /opt/conda/bin/python3.11 \
 && ln -s python3.11 /opt/conda/bin/python3 \
 && ln -s python3 /opt/conda/bin/python \
 && ln -s /opt/venv/lib/python3.11/site-packages /opt/conda/lib/python3.11/dist-packages \
 && sed '1s|.*|#!/opt/conda/bin/python|' /opt/venv/bin/torchrun > /opt/conda/bin/torchrun \
 && chmod 755 /opt/conda/bin/torchrun \
 && rm -rf /opt/venv/bin /opt/venv/pyvenv.cfg /usr/bin/python3* /usr/lib/python3.11 \
 && python=/opt/conda/bin/python \
 && $python -c "import sys, torch; assert sys.prefix == sys.base_prefix == '/opt/conda'"
ENV PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""


@dataclasses.dataclass(frozen=True)
class Layout:
    """A stand-in for a real base image's layout, built as one thin layer on the test base."""

    stands_in_for: str
    recipe: str  # Dockerfile lines after FROM <the test base>
    root_uid: int  # the host UID/GID the test takes when it runs as root (the lab never is root)


LAYOUTS = {
    "rocm": Layout("rocm/pytorch", ROCM_LAYOUT_RECIPE, 1000),  # the UID of the image's `ubuntu`
    "conda": Layout("pytorch/pytorch", CONDA_LAYOUT_RECIPE, 1001),  # not the default NB_UID
}
IMAGE_RENDER_GID = 109  # the rocm layout's own `render` group
HOST_RENDER_GID = 4242  # the render group of the stand-in host device files: another number


def layout_image(base_image: str, layout: Layout) -> str:
    """The base image with the layout's layer, built once per host and recipe (kept, like the
    base, under a tag that changes with the recipe)."""
    recipe_hash = hashlib.sha256(f"{base_image}\n{layout.recipe}".encode()).hexdigest()[:12]
    tag = f"amp-tutorial-test-layout:{layout.stands_in_for.replace('/', '-')}-{recipe_hash}"
    if not image_exists(tag):
        run(["docker", "build", "--quiet", "--tag", tag, "-"], timeout=600,
            input=f"FROM {base_image}\n{layout.recipe}")
    return tag

# --- compose, as a user runs it, with the settings a test gives and no others ---------------------

COMPOSE_FILE = ROOT / "docker-compose.yml"
VARIANT_FILES = {path.stem: path for path in sorted((ROOT / "docker").glob("*.yml"))}
# Variables the compose file reads: the tests set them explicitly, never inherit the caller's.
COMPOSE_SETTINGS = {
    "AMP_TUTORIAL_VARIANT", "BASE_IMAGE", "JUPYTER_TOKEN", "AMP_TUTORIAL_PORT", "AMP_TUTORIAL_BIND",
    "NB_UID", "NB_GID", "AMP_TUTORIAL_NOTEBOOKS", "AMP_TUTORIAL_CA_BUNDLE", "AMP_TUTORIAL_IMAGE",
    "VIDEO_GID", "RENDER_GID", "COMPOSE_FILE", "COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME",
}


def compose_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_SETTINGS}
    return env | settings


def compose_command(project: str) -> list[str]:
    # --env-file: a developer's own .env in the checkout must not change what is tested.
    return ["docker", "compose", "--project-name", project, "--project-directory", ROOT,
            "--file", COMPOSE_FILE, "--env-file", os.devnull]


# --- the workshop hub's compose file --------------------------------------------------------------

HUB_COMPOSE = ROOT / "docker-compose.hub.yml"
HUB_DIR = ROOT / "docker/hub"


def hub_compose_command(project: str) -> list[str]:
    return ["docker", "compose", "--project-name", project, "--project-directory", ROOT,
            "--file", HUB_COMPOSE, "--env-file", os.devnull]


def clean_env(**settings: str) -> dict[str, str]:
    """The caller's environment without compose settings, plus these."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("AMP_", "COMPOSE_")) and k not in {"BASE_IMAGE", "NB_UID",
                                                                   "NB_GID", "RENDER_GID",
                                                                   "VIDEO_GID"}}
    return keep | settings


def main() -> None:
    """Build the test base image unless it is there (CI provisioning; needs root and Docker)."""
    if image_exists(BASE_TAG):
        print(f"test base image {BASE_TAG}: present")
        return
    if problem := base_image_problem():
        sys.exit(f"error: {problem}")
    print(f"building the test base image {BASE_TAG} (debootstrap; a few minutes)", flush=True)
    build_base_image(BASE_TAG)
    print(f"test base image {BASE_TAG}: built")


if __name__ == "__main__":
    main()
