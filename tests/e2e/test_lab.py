"""`pdm run lab` and the seed's `pdm run jupyter-lab` both serve the course with the lab settings.

These start a real JupyterLab server on a free loopback port and ask its REST API.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from course_tools import catalogue, lab
from tests.support import ROOT, read_only
from tests.support.lab_server import start_lab


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
    monkeypatch.setenv(catalogue.NOTEBOOKS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="no course folder"):
        lab.lab_command([])


def test_settings_are_installed_into_the_environment():
    """Wheel data puts them in sys.prefix/etc/jupyter, on every Jupyter's config path."""
    overrides = Path(sys.prefix, "etc/jupyter/labconfig/default_setting_overrides.json")
    settings = json.loads(overrides.read_text())
    viewers = settings["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers["python"] == "Jupytext Notebook"


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


def _plain_jupyter_lab(extra: list[str]) -> list[str]:
    """The seed's spelling, `pdm run jupyter-lab`, from the project root: no course launcher."""
    root_flag = ["--allow-root"] if os.geteuid() == 0 else []
    return [str(Path(sys.executable).with_name("jupyter-lab")), *extra, *root_flag]


@pytest.fixture(params=["pdm run lab", "pdm run jupyter-lab"])
def server(request, tmp_path):
    """The server as each documented command starts it (random token, free loopback port)."""
    command = lab.lab_command if request.param == "pdm run lab" else _plain_jupyter_lab
    lab_server = start_lab(ROOT / "notebooks", tmp_path, {}, command=command, cwd=ROOT)
    yield lab_server, request.param
    lab_server.stop()


def test_server_serves_the_course_with_the_lab_settings(server):
    lab_server, how = server
    port = int(lab_server.url.rsplit(":", 1)[1])
    if Path("/proc/net/tcp").exists():
        # 127.0.0.1 in /proc/net/tcp's little-endian hex; never 0.0.0.0 on the host
        assert _listening_addresses(port) == {"0100007F"}
    assert lab_server.api("/api/status", token=None)[0] == 403, "no token must mean no access"
    status, body = lab_server.api("/api/status")
    assert status == 200 and "started" in body

    _, body = lab_server.api("/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    viewers = body["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers == {"python": "Jupytext Notebook"}, f"{how}: .py files would open as text"

    _, body = lab_server.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")
    notification = body["schema"]["properties"]
    assert notification["fetchNews"]["default"] == "false"
    assert notification["checkForUpdates"]["default"] is False

    prefix = "" if how == "pdm run lab" else "notebooks/"  # jupyter-lab is rooted at its cwd
    _, notebook = lab_server.api(f"/api/contents/{prefix}03_amp_training.py?type=notebook")
    assert notebook["type"] == "notebook"  # jupytext serves the .py file as a notebook
    assert any("torch.autocast" in "".join(c["source"]) for c in notebook["content"]["cells"])


# --- pairing: what the browser's open and save requests do, asked through the REST API ---------
LESSON = "01_autocast_basics.py"


def _course_copy(tmp_path: Path) -> Path:
    """A checkout's notebooks/ folder in miniature: one lesson and the pairing config."""
    course = tmp_path / "checkout" / "notebooks"
    course.mkdir(parents=True)
    for name in (LESSON, "jupytext.toml"):
        shutil.copy(ROOT / "notebooks" / name, course / name)
    return course


def _save_with_output(lab_server, path: str, text: str) -> tuple[int, dict]:
    _, model = lab_server.send(f"/api/contents/{path}?type=notebook&content=1", "GET")
    cell = next(c for c in model["content"]["cells"] if c["cell_type"] == "code")
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": text}]
    return lab_server.send(f"/api/contents/{path}", "PUT",
                           {"type": "notebook", "format": "json", "content": model["content"]})


@pytest.mark.parametrize("how", ["pdm run lab", "pdm run jupyter-lab"])
def test_a_saved_lessons_outputs_come_back_and_its_text_is_unchanged(how, tmp_path):
    course = _course_copy(tmp_path)
    command = lab.lab_command if how == "pdm run lab" else _plain_jupyter_lab
    lab_server = start_lab(course, tmp_path, {}, command=command, cwd=course.parent)
    try:
        path = LESSON if how == "pdm run lab" else f"notebooks/{LESSON}"
        before = (course / LESSON).read_bytes()
        status, _ = _save_with_output(lab_server, path, "a table\n")
        assert status == 200, lab_server.log_tail()
        assert (course / LESSON).read_bytes() == before, f"{how}: saving rewrote the lesson"
        assert (course / "01_autocast_basics.ipynb").exists(), f"{how}: no paired .ipynb"
        _, model = lab_server.send(f"/api/contents/{path}?type=notebook&content=1", "GET")
        cell = next(c for c in model["content"]["cells"] if c["cell_type"] == "code")
        assert [o["text"] for o in cell["outputs"]] == ["a table\n"], f"{how}: outputs lost"
    finally:
        lab_server.stop()


def test_a_save_to_a_read_only_folder_says_why_and_leaves_the_lesson_whole(tmp_path):
    course = _course_copy(tmp_path)
    lab_server = start_lab(course, tmp_path, {})
    undo = read_only(course)
    try:
        before = (course / LESSON).read_bytes()
        status, body = _save_with_output(lab_server, LESSON, "a table\n")
        assert status in (403, 500)
        assert "read-only" in body["message"] or "permissions" in body["message"], body
        assert "File > Download" in body["message"]
        assert (course / LESSON).read_bytes() == before, "the failed save truncated the lesson"
        assert not (course / "01_autocast_basics.ipynb").exists()
    finally:
        undo()
        lab_server.stop()
