"""Which torch releases the course supports, and which torchao goes with each.

One place for the range: ``pyproject.toml`` states it for pip and PDM, the image's build stops on
a base outside it (``python -m amp_tutorial.versions --check``), and the tests run every lesson on
each release in TESTED_TORCHES (the lock's, and OTHER_TORCHES in overlays).
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
OTHER_TORCHES = ("2.9.0", "2.11.0")  # the Docker bases' floor, the lent GPU machine's
TESTED_TORCHES = (*OTHER_TORCHES, LOCKED_TORCH)

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


def torchao_for(version: str) -> str | None:
    """The torchao release that imports on torch ``version``, or None."""
    release = parse(version)
    return _TORCHAO.get(release, _TORCHAO.get(release[:2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 with one line when this interpreter's torch is outside the range",
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
    if args.torchao:
        print(torchao_for(torch.__version__) or "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
