"""`pdm run lab` and the seed's `pdm run jupyter-lab` both serve the course with the lab settings.

These start a real JupyterLab server on a free loopback port and ask its REST API.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from amp_tutorial import lab

ROOT = Path(__file__).resolve().parents[1]


def test_command_defaults_to_loopback_8888_rooted_at_notebooks():
    cmd = lab.lab_command([])
    assert cmd[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={ROOT / 'notebooks'}" in cmd
    assert "--ip=127.0.0.1" in cmd and "--port=8888" in cmd


def test_user_arguments_win_and_are_passed_through():
    cmd = lab.lab_command(["--port=9999", "--no-browser"])
    assert "--port=8888" not in cmd and cmd[-2:] == ["--port=9999", "--no-browser"]


def test_empty_token_is_refused():
    with pytest.raises(SystemExit, match="empty token"):
        lab.lab_command(["--IdentityProvider.token="])


def test_missing_course_folder_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(lab.NOTEBOOKS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="no course folder"):
        lab.lab_command([])


def test_settings_are_installed_into_the_environment():
    """Wheel data puts them in sys.prefix/etc/jupyter, on every Jupyter's config path."""
    overrides = Path(sys.prefix, "etc/jupyter/labconfig/default_setting_overrides.json")
    settings = json.loads(overrides.read_text())
    viewers = settings["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers["python"] == "Jupytext Notebook"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses listening on ``port``, read from /proc/net (Linux)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


def _start(cmd: list[str], port: int, cwd: Path):
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited early:\n{proc.stdout.read()}")
        try:
            if _get(f"http://127.0.0.1:{port}/api")[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("JupyterLab did not answer within 90 s")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(params=["pdm run lab", "pdm run jupyter-lab"])
def server(request):
    """The server as each documented command starts it (a token we choose, a free port)."""
    port, token = _free_port(), secrets.token_hex(16)
    extra = ["--no-browser", f"--port={port}", f"--IdentityProvider.token={token}"]
    if request.param == "pdm run lab":
        cmd = lab.lab_command(extra)
    else:  # the seed's spelling: plain jupyter-lab from the project root
        cmd = [str(Path(sys.executable).with_name("jupyter-lab")), *extra]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
    proc = _start(cmd, port, ROOT)
    yield f"http://127.0.0.1:{port}", token, request.param, port
    _stop(proc)


def test_server_serves_the_course_with_the_lab_settings(server):
    base, token, how, port = server
    if Path("/proc/net/tcp").exists():
        # 127.0.0.1 in /proc/net/tcp's little-endian hex; never 0.0.0.0 on the host
        assert _listening_addresses(port) == {"0100007F"}
    assert _get(f"{base}/api/status")[0] == 403, "the API must refuse requests without the token"
    status, body = _get(f"{base}/api/status?token={token}")
    assert status == 200 and "started" in json.loads(body)

    _, body = _get(f"{base}/lab/api/settings/@jupyterlab/docmanager-extension:plugin?token={token}")
    viewers = json.loads(body)["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers == {"python": "Jupytext Notebook"}, f"{how}: .py files would open as text"

    _, body = _get(f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification"
                   f"?token={token}")
    notification = json.loads(body)["schema"]["properties"]
    assert notification["fetchNews"]["default"] == "false"
    assert notification["checkForUpdates"]["default"] is False

    prefix = "" if how == "pdm run lab" else "notebooks/"
    _, body = _get(f"{base}/api/contents/{prefix}03_amp_training.py?token={token}&type=notebook")
    notebook = json.loads(body)
    assert notebook["type"] == "notebook"  # jupytext serves the .py file as a notebook
    assert any("torch.autocast" in "".join(c["source"]) for c in notebook["content"]["cells"])
