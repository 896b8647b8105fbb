"""The other torch releases the course supports, as test environments: the lock's packages with
only torch (and the torchao that matches it) changed.

Learners run the Docker bases' torch (2.9), the lent GPU machine's (2.11) or the lock's. Each
release in OTHER_TORCHES gets an *overlay*: a venv outside the checkout holding that torch, its
own CUDA libraries and triton, and the torchao that imports on it (or none); a ``.pth`` file then
appends the locked environment's site-packages (named by LOCKED_SITE_ENV when the interpreter
starts), so everything else (numpy, ipykernel, the course's own packages) is the lock's. The root
``conftest.py`` runs every lesson's kernel in each overlay.

Building one is provisioning, not a test: ``.ci/run`` runs

    python -m tests.support.torch_envs

before the tests (a no-op for an overlay that is there), and the overlays are kept under
``$XDG_CACHE_HOME/amp-tutorial/torch-envs`` between runs and clones, as the Docker test base is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from amp_tutorial.versions import OTHER_TORCHES, torchao_for

LOCKED_SITE_ENV = "AMP_TUTORIAL_LOCKED_SITE"
RECIPE = "r1"  # the cache key: change it when build_overlay changes
CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "amp-tutorial" / "torch-envs"
)

# One line, run by `site` when the overlay's interpreter starts: the locked site-packages after
# the overlay's own, with their .pth files (the editable install of the course's packages).
PTH = ("import os, site; list(map(site.addsitedir, filter(None, "
       f"os.environ.get({LOCKED_SITE_ENV!r}, '').split(os.pathsep))))\n")


def overlay_dir(torch_version: str) -> Path:
    return (
        CACHE
        / f"torch-{torch_version}-py{sys.version_info.major}.{sys.version_info.minor}-{RECIPE}"
    )


def overlay_python(torch_version: str) -> Path | None:
    """The overlay's interpreter, or None when it is not built (or half built)."""
    path = overlay_dir(torch_version)
    python = path / "bin" / "python"
    return python if (path / "READY").is_file() and python.is_file() else None


def locked_site() -> str:
    """This interpreter's site-packages: the locked environment the overlays lean on."""
    return sysconfig.get_paths()["purelib"]


def overlay_environ(torch_version: str) -> dict[str, str]:
    """What a process started with the overlay's interpreter needs in its environment."""
    return {LOCKED_SITE_ENV: locked_site()}


def build_overlay(torch_version: str) -> Path:
    """Make the overlay for ``torch_version`` (pip, from PyPI; about 7 GB with CUDA libraries)."""
    path = overlay_dir(torch_version)
    CACHE.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(CACHE).free / 2**30
    if free_gb < 10:
        raise SystemExit(f"only {free_gb:.0f} GB free in {CACHE}; the torch {torch_version} test "
                         "environment needs about 7 GB (and the tests some more)")
    if path.exists():
        subprocess.run(["rm", "-rf", str(path)], check=True)
    venv.EnvBuilder(with_pip=True).create(path)
    python = path / "bin" / "python"
    packages = [f"torch=={torch_version}"]
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
        check=True,
    )
    torchao = torchao_for(torch_version)
    if torchao is not None:
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                f"torchao=={torchao}",
            ],
            check=True,
        )
    write_pth(path)
    (path / "READY").write_text(f"torch {torch_version}, torchao {torchao}\n")
    return path


def write_pth(path: Path) -> None:
    """(Re)write the line that appends the locked site-packages, so a fix to PTH reaches an
    overlay that is already built."""
    site_packages = next(path.glob("lib/python3*/site-packages"))
    (site_packages / "zz_amp_tutorial_locked.pth").write_text(PTH)


def check_overlay(torch_version: str) -> str:
    """Start the overlay as a kernel would; report its torch and whether torchao is there."""
    python = overlay_python(torch_version)
    assert python is not None, torch_version
    probe = (
        "import torch, amp_tutorial, ipykernel; "
        "import importlib.util as u; "
        "print(torch.__version__, 'torchao' if u.find_spec('torchao') else 'no torchao')"
    )
    result = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **overlay_environ(torch_version)},
    )
    if result.returncode != 0:
        raise SystemExit(
            f"the torch {torch_version} overlay does not start:\n{result.stderr[-2000:]}"
        )
    return result.stdout.strip()


def stale_overlays() -> list[Path]:
    """Overlays in the cache that no release in OTHER_TORCHES (at this RECIPE) uses: a release
    the tests dropped, or an older recipe. About 7 GB each."""
    wanted = {overlay_dir(version) for version in OTHER_TORCHES}
    return sorted(path for path in CACHE.glob("torch-*") if path.is_dir() and path not in wanted)


def main() -> None:
    for path in stale_overlays():
        print(f"removing {path.name}: no test runs it any more", flush=True)
        shutil.rmtree(path, ignore_errors=True)
    for version in OTHER_TORCHES:
        if overlay_python(version) is None:
            print(
                f"building the torch {version} test environment in {overlay_dir(version)} "
                "(pip, about 7 GB; a few minutes)",
                flush=True,
            )
            build_overlay(version)
        write_pth(overlay_dir(version))
        print(f"torch {version} test environment: {check_overlay(version)}", flush=True)


if __name__ == "__main__":
    main()
