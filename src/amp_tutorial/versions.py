"""Which torch releases the course supports, and which torchao goes with each.

One place for the range: ``pyproject.toml`` states it for pip and PDM, the image's build stops on
a base outside it (``python -m amp_tutorial.versions --check``), and the tests run every lesson on
each release in TESTED_TORCHES (the lock's, and OTHER_TORCHES in overlays). The Docker tests'
stand-in image runs DOCKER_TEST_TORCH (the CUDA variant's base) with its torchao. Releases inside
the range that no test runs (UNTESTED_RELEASES) are allowed, and ``--check`` says they are untested.
"""

from __future__ import annotations

import argparse
import re
import sys

# The floor is what the Docker variants' bases ship (rocm/pytorch ...release_2.9.1,
# pytorch/pytorch:2.9.0-...); the ceiling is the newest release the course was run on.
MIN_TORCH = (2, 9)
MAX_TORCH = (2, 14)  # inclusive: 2.14.x
SUPPORTED_RANGE = ">=2.9,<2.15"

LOCKED_TORCH = "2.14.1"
# Every lesson runs on these in CI: the Docker default's base (rocm/pytorch ..._release_2.9.1, with
# torchao 0.15.0) and the lent GPU machine's (2.11.0, torchao 0.18.0), beside the lock's.
OTHER_TORCHES = ("2.9.1", "2.11.0")
TESTED_TORCHES = (*OTHER_TORCHES, LOCKED_TORCH)
# The CUDA variant's base (pytorch/pytorch:2.9.0-...): the Docker tests' image runs it, with
# torchao 0.14.1 (built, started, one lesson run and torchao imported), not every lesson.
DOCKER_TEST_TORCH = "2.9.0"
UNTESTED_RELEASES = ((2, 10), (2, 12), (2, 13))  # inside the range; no test runs them

# torchao's binary extensions are built against one torch: its own __init__ lists the pairs
# (0.14.1: torch 2.9.0; 0.15.0: 2.9.1; 0.16.0: 2.10.0; 0.18.0: torch >= 2.11). 0.18.0 does not
# import on 2.9 (`ScalingType` is missing from torch.nn.functional there). None: no torchao.
_TORCHAO = {
    (2, 9, 0): "0.14.1",
    (2, 9): "0.15.0",
    (2, 10): "0.16.0",
    (2, 11): "0.18.0",
    (2, 12): "0.18.0",
    (2, 13): "0.18.0",
    (2, 14): "0.18.0",
}


def parse(version: str) -> tuple[int, int, int]:
    """``"2.9.1+cu128"`` -> ``(2, 9, 1)``; a pre-release counts as its release."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def is_supported(version: str) -> bool:
    """True when ``version`` lies in SUPPORTED_RANGE."""
    return MIN_TORCH <= parse(version)[:2] <= MAX_TORCH


def is_tested(version: str) -> bool:
    """True when CI runs this release: every lesson (TESTED_TORCHES) or the Docker tests' image
    (DOCKER_TEST_TORCH). A patch release counts as tested where CI runs another patch of it,
    except 2.9.0 against 2.9.1, whose torchao differs."""
    release = parse(version)
    tested = [parse(v) for v in (*TESTED_TORCHES, DOCKER_TEST_TORCH)]
    if release[:2] == (2, 9):
        return release in tested
    return release[:2] in [t[:2] for t in tested]


def torchao_for(version: str) -> str | None:
    """The torchao release that imports on torch ``version``, or None."""
    release = parse(version)
    return _TORCHAO.get(release, _TORCHAO.get(release[:2]))


def import_torchao():
    """``torchao`` with its float8 training imported, without the log line torch 2.14 writes when
    torchao 0.18 registers an Enum as a pytree constant (``W... torch/utils/_pytree.py:630] ...
    register_constant() on Enum subclasses is deprecated``): torchao's business, not the
    learner's, and a red box in a lesson. Raises what the import raises."""
    import logging

    import torch  # noqa: F401  (torch's logging set up first)

    log = logging.getLogger("torch.utils._pytree")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torchao
        import torchao.float8  # noqa: F401
    finally:
        log.setLevel(level)
    return torchao


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 with one line when this interpreter's torch is outside the range; one "
        "line on stdout when it is inside but no test runs it",
    )
    parser.add_argument(
        "--torchao",
        action="store_true",
        help="print the torchao release for this interpreter's torch (empty: none)",
    )
    args = parser.parse_args(argv)
    import torch

    if args.check and not is_supported(torch.__version__):
        print(
            f"torch {torch.__version__} is outside the course's supported range "
            f"torch{SUPPORTED_RANGE}: pick a base image with torch 2.9 to 2.14 "
            "(BASE_IMAGE, docs/docker.md)",
            file=sys.stderr,
        )
        return 1
    if args.check and not is_tested(torch.__version__):
        print(f"torch {torch.__version__} lies in the supported range, but the course's tests "
              f"do not run it (they run {', '.join((DOCKER_TEST_TORCH, *TESTED_TORCHES))})")
    if args.torchao:
        print(torchao_for(torch.__version__) or "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
