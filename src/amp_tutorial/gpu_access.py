"""Why an AMD GPU is there but not usable: its device files are closed to this user.

ROCm reaches the GPU through ``/dev/kfd`` and ``/dev/dri/renderD*``, which belong to the host's
``render`` (or ``video``) group. A user outside that group gets "Permission denied" on them, and
torch then simply reports no GPU, so every lesson runs on the CPU without saying why. In Docker
this happens when compose's ``group_add: render`` names the image's render group, whose number
differs from the host's. Used by lesson 01's device line (``device.describe_device``) and by the
container's entry point (``docker/start-lab.py``), which logs the fix at start.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

# The kfd file first, then the render nodes; these exist only where a ROCm driver does (or where
# compose passed them into the container).
ROCM_DEVICE_FILES = ("/dev/kfd", "/dev/dri/renderD*")
# Set in the course's Docker image: the fix is then a compose setting, not a host group.
IN_CONTAINER_ENV = "AMP_TUTORIAL_IN_CONTAINER"
# docker/rocm.yml's group_add takes the host's group numbers from these two settings.
COMPOSE_GID_SETTINGS = ("RENDER_GID", "VIDEO_GID")


@dataclass(frozen=True)
class ClosedDeviceFile:
    """A GPU device file this process may not open for reading and writing, and its group.

    Used in every lesson (01-13) through `describe_device`, and by the Docker start script.
    """

    path: str
    gid: int


def closed_device_files(patterns: tuple[str, ...] = ROCM_DEVICE_FILES) -> list[ClosedDeviceFile]:
    """The GPU device files present here that this process may not open read-write.

    ``os.access`` asks the kernel the open() permission question for the real user and its
    groups, without opening the file (opening /dev/kfd would create a GPU context).

    Used in every lesson (01-13) through `describe_device`, and by the Docker start script.
    """
    closed = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if not os.access(path, os.R_OK | os.W_OK):
                closed.append(ClosedDeviceFile(path, os.stat(path).st_gid))
    return closed


def gpu_access_problem(closed: list[ClosedDeviceFile] | None = None) -> str | None:
    """One sentence saying which GPU device files this user cannot open, and the exact fix;
    None when there is nothing to fix (all present device files open, or none present).

    Used in every lesson (01-13) through `describe_device`, and by the Docker start script.
    """
    closed = closed_device_files() if closed is None else closed
    if not closed:
        return None
    # The render nodes' group first: it is the one compose's RENDER_GID is for.
    gids = list(dict.fromkeys(f.gid for f in sorted(closed, key=lambda f: f.path == "/dev/kfd")))
    files = ", ".join(f"{f.path} (group {f.gid})" for f in closed)
    groups = ", ".join(str(g) for g in sorted(set(os.getgroups()) | {os.getgid()}))
    problem = (f"the GPU device files {files} are closed to this user (uid {os.getuid()}, "
               f"groups {groups})")
    if os.environ.get(IN_CONTAINER_ENV):
        named = zip(COMPOSE_GID_SETTINGS, gids, strict=False)  # a third group: see below
        settings = " and ".join(f"{name}={gid}" for name, gid in named)
        fix = (f"put {settings} in the .env file next to docker-compose.yml (the host's group "
               f"numbers of these files), then run `docker compose up -d`")
        if len(gids) > len(COMPOSE_GID_SETTINGS):
            others = ", ".join(map(str, gids[len(COMPOSE_GID_SETTINGS):]))
            fix += f", and add group(s) {others} to group_add in docker/rocm.yml"
    else:
        names = [_group_name(g) for g in gids]
        fix = (f"add yourself to group(s) {', '.join(names)} (`sudo usermod -aG "
               f"{','.join(names)} $USER`), then log out and in again")
    return f"{problem}; fix: {fix}"


def _group_name(gid: int) -> str:
    import grp  # POSIX only, like the device files themselves

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
