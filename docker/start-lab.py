#!/usr/bin/env python
"""Container entry point: JupyterLab on the course, on all the container's interfaces, with a token.

The token is $JUPYTER_TOKEN if set, otherwise a random one, printed with the URL. An empty token is
refused: it would let anyone who reaches the port run code. Compose publishes the port on
127.0.0.1 only; AMP_TUTORIAL_PORT is the host port, used here only to print the right URL.

Before that it checks that the lab user may open the GPU device files compose passed (ROCm:
/dev/kfd, /dev/dri/renderD*). If not, torch would quietly see no GPU; the log says so, with the fix.
"""

from __future__ import annotations

import os
import secrets
import sys

from amp_tutorial.device import gpu_access_problem
from course_tools.lab import lab_command


def main() -> None:
    token = os.environ.get("JUPYTER_TOKEN")
    url = f"http://localhost:{os.environ.get('AMP_TUTORIAL_PORT', '8888')}/lab"
    if token == "":
        sys.exit("error: JUPYTER_TOKEN is set but empty; an empty token would let anyone who "
                 "reaches the port run code. Unset it to get a random token, or set a real one.")
    if problem := gpu_access_problem():
        print(f"\nwarning: the lessons will run on the CPU: {problem}\n", file=sys.stderr,
              flush=True)
    if token is None:
        os.environ["JUPYTER_TOKEN"] = token = secrets.token_hex(24)
        print(f"\n    The course is at {url}?token={token}\n", flush=True)
    else:
        print(f"\n    The course is at {url} (token: your JUPYTER_TOKEN)\n", flush=True)
    command = lab_command(["--ip=0.0.0.0", "--no-browser", *sys.argv[1:]])
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
