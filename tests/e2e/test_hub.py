"""The workshop hub (docker-compose.hub.yml) end to end: a real hub with real learners (its settings
are checked without Docker in tests/unit/test_hub_config.py).

It builds the course image (cpu variant, on the rocm/pytorch stand-in layout) and
the hub image (on the test base) through the hub's compose file, as an instructor's
`docker compose -f docker-compose.hub.yml up --build` does, and starts it under a unique project
name, port, network and container prefix. Two learners sign up and are admitted by the admin, a
third is not; the tests then check what each may reach, that edits persist, that a lesson runs in
a learner's container at the preset the hub sets (AMP_HUB_PRESET) and that an idle server is
culled. Learners' containers and volumes, the
hub's volume and the images are removed afterwards, also when a test fails.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import secrets
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
import requests

from tests.support import ROOT, SOLUTIONS, load_program, runnable_lesson
from tests.support.docker_env import (
    LAYOUTS,
    clean_env,
    host_ca_bundle,
    hub_compose_command,
    layout_image,
    run,
)
from tests.support.lab_server import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.docker

LESSON = "01_autocast_basics.py"  # the one the edit tests change
RUN_LESSON = runnable_lesson().name  # one without an exercise stub, run as a learner has it
PASSWORD = "course-" + secrets.token_hex(8)  # NativeAuthenticator wants 8+ uncommon characters


# ---------------------------------------------------------------------------------------------
# End to end: a hub, an admin, two admitted learners and one who is not
# ---------------------------------------------------------------------------------------------

def hidden_xsrf(html: str) -> str:
    found = re.search(r'name="_xsrf"\s+value="([^"]+)"', html)
    assert found, "the page has no _xsrf field"
    return found.group(1)


@dataclasses.dataclass
class Hub:
    project: str
    env: dict[str, str]
    port: int

    @property
    def prefix(self) -> str:
        return self.env["AMP_HUB_PREFIX"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def compose(self, *args: str, timeout: float = 300, check: bool = True,
                ) -> Any:
        return run([*hub_compose_command(self.project), *args], env=self.env, timeout=timeout,
                   check=check)

    def up(self, **settings: str) -> None:
        """Start (or re-create, with changed settings) the hub and wait until it is healthy."""
        self.env |= settings
        result = self.compose("up", "--detach", "--wait", "--wait-timeout", "180", "hub",
                              timeout=400, check=False)
        if result.returncode != 0:
            logs = self.compose("logs", check=False).stdout
            pytest.fail(f"the hub did not start:\n{result.stderr[-2000:]}\n{logs[-4000:]}")

    def session(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False  # no proxy between the test and the loopback port
        return session

    def sign_up(self, name: str) -> None:
        session = self.session()
        form = session.get(f"{self.url}/hub/signup", timeout=30)
        assert form.status_code == 200
        reply = session.post(f"{self.url}/hub/signup", timeout=30, data={
            "username": name, "signup_password": PASSWORD,
            "signup_password_confirmation": PASSWORD, "_xsrf": hidden_xsrf(form.text)})
        # The admin is admitted at once; anyone else waits for the admin.
        expected = "signup was successful" if name == self.env["AMP_HUB_ADMIN"] else (
            "sent to the admin")
        assert reply.status_code == 200 and expected in reply.text, reply.text[-800:]

    def log_in(self, name: str) -> requests.Session | None:
        """A signed-in session, or None when the hub refuses the sign-in."""
        session, reply = self.sign_in_reply(name)
        return session if reply.status_code == 302 else None

    def sign_in_reply(self, name: str) -> tuple[requests.Session, requests.Response]:
        session = self.session()
        form = session.get(f"{self.url}/hub/login", timeout=30)
        assert 'href="/hub/signup"' in form.text  # NativeAuthenticator's login page
        reply = session.post(f"{self.url}/hub/login", allow_redirects=False, timeout=30, data={
            "username": name, "password": PASSWORD, "_xsrf": hidden_xsrf(form.text)})
        return session, reply

    def api_token(self, name: str) -> str:
        """A token of `name`'s own, made through their signed-in session (as the hub's token page
        does)."""
        session = self.log_in(name)
        assert session is not None, f"{name} cannot sign in"
        reply = session.post(f"{self.url}/hub/api/users/{name}/tokens", timeout=30,
                             headers={"X-XSRFToken": session.cookies["_xsrf"]},
                             json={"note": "test_hub"})
        assert reply.status_code == 201, reply.text
        return reply.json()["token"]

    def api(self, method: str, path: str, token: str, **kwargs: Any) -> requests.Response:
        return self.session().request(method, f"{self.url}{path}", timeout=60,
                                      headers={"Authorization": f"token {token}"}, **kwargs)

    def server_running(self, name: str, token: str) -> bool:
        user = self.api("GET", f"/hub/api/users/{name}", token).json()
        server = user.get("servers", {}).get("")
        return bool(server and server.get("ready"))

    def start_server(self, name: str, token: str) -> None:
        reply = self.api("POST", f"/hub/api/users/{name}/server", token)
        assert reply.status_code in (201, 202, 400), reply.text  # 400: running already
        wait_for(lambda: self.server_running(name, token), 240, f"{name}'s server to start")

    def stop_server(self, name: str, token: str) -> None:
        reply = self.api("DELETE", f"/hub/api/users/{name}/server", token)
        assert reply.status_code in (202, 204), reply.text
        wait_for(lambda: not self.container_exists(name), 120, f"{name}'s container to go")

    def container(self, name: str) -> dict[str, Any]:
        return json.loads(run(["docker", "inspect", f"{self.prefix}-{name}"]).stdout)[0]

    def container_exists(self, name: str) -> bool:
        return run(["docker", "container", "inspect", f"{self.prefix}-{name}"],
                   check=False).returncode == 0

    def remove_all(self) -> None:
        """Learners' containers and volumes (the hub did not start them under compose), then
        the compose project with its volume, network and images."""
        for kind in ("container", "volume"):  # containers first: a volume in use stays
            if listed := self.leftovers(kind):
                run(["docker", kind, "rm", "--force", *listed], check=False)
        self.compose("down", "--volumes", "--rmi", "all", "--remove-orphans", check=False)
        left = self.leftovers("container") + self.leftovers("volume")
        assert not left, f"the hub test left these behind: {left}"

    def leftovers(self, kind: str) -> list[str]:
        """This test's learner containers or volumes that still exist."""
        field = "{{.Names}}" if kind == "container" else "{{.Name}}"  # docker's names differ
        listed = run(["docker", kind, "ls", *(["--all"] if kind == "container" else []),
                      "--filter", f"name={self.prefix}-", "--format", field])
        return listed.stdout.split()


def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}")


@dataclasses.dataclass
class Class:
    """The running hub and its people: learner tokens by name."""

    hub: Hub
    tokens: dict[str, str]
    build_seconds: float


@pytest.fixture(scope="module")
def workshop(base_image: str) -> Iterator[Class]:
    project = f"amp-hub-test-{secrets.token_hex(4)}"
    settings = {
        "AMP_TUTORIAL_VARIANT": "cpu", "AMP_TUTORIAL_IMAGE": project,
        "BASE_IMAGE": layout_image(base_image, LAYOUTS["rocm"]),
        "AMP_HUB_BASE_IMAGE": base_image, "AMP_HUB_ADMIN": "teacher",
        "AMP_HUB_PORT": str(free_port()), "AMP_HUB_PREFIX": project,
        "AMP_HUB_NETWORK": project, "AMP_HUB_CPU_LIMIT": "1", "AMP_HUB_MEM_LIMIT": "3G",
        "AMP_HUB_PRESET": "smoke",  # every learner's AMP_TUTORIAL_PRESET, as an instructor sets it
        "NB_UID": "1000", "NB_GID": "1000",
    }
    if ca_bundle := host_ca_bundle():
        settings["AMP_TUTORIAL_CA_BUNDLE"] = ca_bundle
    hub = Hub(project, clean_env(**settings), int(settings["AMP_HUB_PORT"]))
    try:
        began = time.monotonic()
        hub.compose("build", timeout=1800)
        built = time.monotonic() - began
        hub.up()
        hub.sign_up("teacher")  # the admin: admitted by being named in AMP_HUB_ADMIN
        for learner in ("ada", "bob", "eve"):
            hub.sign_up(learner)
        admin = hub.log_in("teacher")
        assert admin is not None, "the admin cannot sign in"
        for learner in ("ada", "bob"):  # eve is never admitted
            reply = admin.get(f"{hub.url}/hub/authorize/{learner}", timeout=30)
            assert reply.status_code == 200, reply.text[-500:]
        tokens = {name: hub.api_token(name) for name in ("teacher", "ada", "bob")}
        for learner in ("ada", "bob"):
            hub.start_server(learner, tokens[learner])
        yield Class(hub, tokens, built)
    finally:
        hub.remove_all()


def test_each_learner_gets_their_own_container_of_the_course_image(workshop: Class) -> None:
    hub = workshop.hub
    ada, bob = hub.container("ada"), hub.container("bob")
    assert ada["Id"] != bob["Id"]
    for name, container in (("ada", ada), ("bob", bob)):
        assert container["Config"]["Image"] == hub.env["AMP_TUTORIAL_IMAGE"] + ":cpu"
        volumes = [(m["Type"], m["Name"], m["Destination"]) for m in container["Mounts"]]
        assert volumes == [("volume", f"{hub.prefix}-{name}", "/home/learner/work")]
        assert container["Config"]["User"] not in ("", "0", "root")
        assert container["HostConfig"]["Memory"] == 3 * 2**30
        # DockerSpawner sets cpu_quota = cpu_limit * cpu_period (100 ms by default)
        assert container["HostConfig"]["CpuQuota"] == 100_000
        assert "OMP_NUM_THREADS=1" in container["Config"]["Env"]  # torch's threads: the limit's
    print(f"\nhub and course images built in {workshop.build_seconds:.0f} s")


def test_a_learner_cannot_open_or_read_another_learners_server(workshop: Class) -> None:
    hub, tokens = workshop.hub, workshop.tokens
    marker = f"bob's secret {secrets.token_hex(4)}"
    put = hub.api("PUT", "/user/bob/api/contents/notes.txt", tokens["bob"],
                  json={"type": "file", "format": "text", "content": marker})
    assert put.status_code in (200, 201), put.text
    assert hub.api("GET", "/user/ada/api/contents", tokens["ada"]).status_code == 200
    # Ada's token, on Bob's server: refused by Bob's server.
    assert hub.api("GET", "/user/bob/api/contents/notes.txt", tokens["ada"]).status_code == 403
    # Ada's browser session, on Bob's lab: the hub refuses to authorize her for it.
    ada = hub.log_in("ada")
    assert ada is not None
    assert ada.get(f"{hub.url}/user/bob/lab", timeout=60).status_code == 403
    # And Bob's files are nowhere in Ada's container.
    found = run(["docker", "exec", f"{hub.prefix}-ada", "grep", "-rl", marker, "/home", "/tmp"],
                check=False)
    assert found.returncode == 1 and found.stdout == "", found.stdout


def test_an_unadmitted_user_gets_no_server(workshop: Class) -> None:
    hub = workshop.hub
    session, reply = hub.sign_in_reply("eve")
    assert reply.status_code == 200 and "has not been authorized" in reply.text
    assert "jupyterhub-session-id" not in session.cookies or not any(
        c.name == "jupyterhub-hub-login" for c in session.cookies)
    # Whatever her failed sign-in left in her browser does not start a server either.
    refused = session.post(f"{hub.url}/hub/api/users/eve/server", timeout=30,
                           headers={"X-XSRFToken": session.cookies.get("_xsrf", "")})
    assert refused.status_code == 403
    # The admin's view: eve never became a hub user, and has no container.
    assert hub.api("GET", "/hub/api/users/eve", workshop.tokens["teacher"]).status_code == 404
    assert not hub.container_exists("eve")


def test_the_hubs_secrets_are_kept_and_never_logged(workshop: Class) -> None:
    hub = workshop.hub
    secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"
    mode = hub.compose("exec", "-T", "hub", "stat", "-c", "%a", secret_file).stdout.strip()
    assert mode == "600"
    cookie_secret = hub.compose("exec", "-T", "hub", "cat", secret_file).stdout.strip()
    proxy_token = hub.compose("exec", "-T", "hub", "python", "-c", (
        "import pathlib\n"
        "for p in pathlib.Path('/proc').glob('[0-9]*'):\n"
        "    env = (p / 'environ').read_bytes().split(b'\\0')\n"
        "    for v in env:\n"
        "        if v.startswith(b'CONFIGPROXY_AUTH_TOKEN='):\n"
        "            print(v.split(b'=', 1)[1].decode()); raise SystemExit\n")).stdout.strip()
    assert len(cookie_secret) >= 64 and len(proxy_token) >= 32
    logs = hub.compose("logs", "hub").stdout
    assert cookie_secret not in logs and proxy_token not in logs
    tracked = run(["git", "-C", ROOT, "grep", "-l", cookie_secret[:16]], check=False)
    assert tracked.stdout == ""


def lesson_text(hub: Hub, token: str) -> str:
    reply = hub.api("GET", f"/user/ada/api/contents/{LESSON}?type=file&format=text", token)
    assert reply.status_code == 200, reply.text
    return reply.json()["content"]


def test_a_learners_edit_survives_a_server_restart_and_a_hub_restart(workshop: Class) -> None:
    hub, token = workshop.hub, workshop.tokens["ada"]
    original = lesson_text(hub, token)
    assert original == (ROOT / "notebooks" / LESSON).read_text()  # copied in on first start
    edited = original + f"\n# %%\n# ada was here {secrets.token_hex(4)}\n"
    put = hub.api("PUT", f"/user/ada/api/contents/{LESSON}", token,
                  json={"type": "file", "format": "text", "content": edited})
    assert put.status_code == 200, put.text
    hub.stop_server("ada", token)
    hub.start_server("ada", token)
    assert lesson_text(hub, token) == edited  # kept, not overwritten by the course's copy
    hub.compose("restart", "hub", timeout=180)
    hub.up()
    assert hub.log_in("ada") is not None  # her admission is kept too
    hub.stop_server("ada", token)
    hub.start_server("ada", token)
    assert lesson_text(hub, token) == edited



# --- pairing (issue 29): outputs live in the learner's volume, in the lesson's paired .ipynb ---
PAIRED_LESSON = "02_gradient_scaling.py"  # not the lesson the edit test changes


def first_output(hub: Hub, token: str) -> list[str]:
    reply = hub.api("GET", f"/user/ada/api/contents/{PAIRED_LESSON}?type=notebook&content=1",
                    token)
    assert reply.status_code == 200, reply.text
    cell = next(c for c in reply.json()["content"]["cells"] if c["cell_type"] == "code")
    return [output.get("text") for output in cell["outputs"]]


def test_a_learners_outputs_survive_a_server_restart_and_a_hub_restart(workshop: Class) -> None:
    hub, token = workshop.hub, workshop.tokens["ada"]
    path = f"/user/ada/api/contents/{PAIRED_LESSON}"
    model = hub.api("GET", f"{path}?type=notebook&content=1", token).json()
    cell = next(c for c in model["content"]["cells"] if c["cell_type"] == "code")
    text = f"a table {secrets.token_hex(4)}\n"
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": text}]
    put = hub.api("PUT", path, token,
                  json={"type": "notebook", "format": "json", "content": model["content"]})
    assert put.status_code == 200, put.text
    listing = hub.api("GET", "/user/ada/api/contents", token).json()["content"]
    assert PAIRED_LESSON.replace(".py", ".ipynb") in {item["name"] for item in listing}
    hub.stop_server("ada", token)
    hub.start_server("ada", token)
    assert first_output(hub, token) == [text]
    hub.compose("restart", "hub", timeout=180)
    hub.up()
    hub.stop_server("ada", token)
    hub.start_server("ada", token)
    assert first_output(hub, token) == [text]
    lesson = hub.api("GET", f"{path}?type=file&format=text", token).json()["content"]
    assert lesson == (ROOT / "notebooks" / PAIRED_LESSON).read_text(), "saving changed the .py"

# Prints, as JSON, the environment of another process in the container whose command line holds
# argv[1]: what a learner's Jupyter server, or a kernel it started, really got.
PROCESS_ENV = (
    "import json, os, pathlib, sys\n"
    "for p in pathlib.Path('/proc').glob('[0-9]*'):\n"
    "    try:\n"
    "        command, env = (p / 'cmdline').read_bytes(), (p / 'environ').read_bytes()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if p.name != str(os.getpid()) and sys.argv[1].encode() in command:\n"
    "        pairs = [v.decode().split('=', 1) for v in env.split(b'\\0') if b'=' in v]\n"
    "        print(json.dumps(dict(pairs)))\n"
    "        break\n")


def process_env(hub: Hub, learner: str, marker: str) -> dict[str, str] | None:
    found = run(["docker", "exec", f"{hub.prefix}-{learner}", "python", "-c", PROCESS_ENV,
                 marker]).stdout
    return json.loads(found) if found.strip() else None


def test_a_lesson_runs_in_a_learners_container_at_the_hubs_preset(workshop: Class) -> None:
    """AMP_HUB_PRESET=smoke reaches the learner's server and the kernels it starts, and a lesson
    run as the learner has it (no preset of its own) runs at that size."""
    hub, token = workshop.hub, workshop.tokens["bob"]
    server = process_env(hub, "bob", "jupyterhub-singleuser")
    assert server is not None, "no jupyterhub-singleuser process in bob's container"
    assert server.get("AMP_TUTORIAL_PRESET") == "smoke"
    started = hub.api("POST", "/user/bob/api/kernels", token, json={"name": "python3"})
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]  # in the kernel's command line: its connection file
    try:
        deadline = time.monotonic() + 60
        while (kernel := process_env(hub, "bob", kernel_id)) is None:
            assert time.monotonic() < deadline, "no process of the kernel bob's server started"
            time.sleep(2)
        assert kernel.get("AMP_TUTORIAL_PRESET") == "smoke"
    finally:
        hub.api("DELETE", f"/user/bob/api/kernels/{kernel_id}", token)
    run(["docker", "exec", "--workdir", "/home/learner/work", f"{hub.prefix}-bob", "jupytext",
         "--execute", "--to", "ipynb", "--output", "/tmp/executed.ipynb", RUN_LESSON],
        timeout=600)
    executed = json.loads(run(["docker", "exec", f"{hub.prefix}-bob", "cat",
                               "/tmp/executed.ipynb"]).stdout)
    code_cells = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code_cells and all(c["execution_count"] for c in code_cells)
    assert not [o for c in code_cells for o in c["outputs"] if o["output_type"] == "error"]


# ---------------------------------------------------------------------------------------------
# The class's progress: the amp-progress service (docker/hub/amp_progress)
# ---------------------------------------------------------------------------------------------

PROGRESS = "/services/amp-progress/"
PAGE_SCREENSHOT = Path("/tmp/amp-progress-page.png")
WRONG_ANSWER = (  # a named mistake: autocast's device type hard-coded
    "import torch\n"
    "def autocast_settings(device):\n"
    "    return 'cuda', torch.float16, True\n")
# Runs lesson 01's checker on the answer above it in a learner's container, as the lesson's
# checker cell does (the workspace is the learner's folder), then sends what is pending; prints
# the checker's verdict and the attempt as recorded.
CHECK_AND_SEND = """
import json
from amp_tutorial import class_sync
from amp_tutorial.exercises.autocast_settings import check_autocast_settings
from amp_tutorial.progress import attempts_path, read_attempts
result = check_autocast_settings(autocast_settings)  # records the attempt and starts its send
path = attempts_path()
sent = class_sync.send_pending(path)  # the checker's own send runs in the background: wait here
print(json.dumps({"passed": result.passed, "keys": sorted(result.keys), "sent": sent,
                  "record": read_attempts(path)[-1], "pending": len(class_sync.pending(path))}))
"""


def check_exercise(hub: Hub, learner: str, answer: str) -> dict[str, Any]:
    found = run(["docker", "exec", "--workdir", "/home/learner/work", f"{hub.prefix}-{learner}",
                 "python", "-c", answer + CHECK_AND_SEND], timeout=120)
    return json.loads(found.stdout.strip().splitlines()[-1])


def server_token(hub: Hub, learner: str) -> str:
    """The learner's server's own token, as its kernels get it."""
    return run(["docker", "exec", f"{hub.prefix}-{learner}", "printenv",
                "JUPYTERHUB_API_TOKEN"]).stdout.strip()


def class_csv(hub: Hub, admin_token: str) -> list[dict[str, str]]:
    reply = hub.api("GET", PROGRESS + "attempts.csv", admin_token)
    assert reply.status_code == 200, reply.text[-500:]
    return list(csv.DictReader(io.StringIO(reply.text)))


def post_attempts(hub: Hub, token: str | None, body: bytes) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return hub.session().post(f"{hub.url}{PROGRESS}api/attempts", data=body, headers=headers,
                              timeout=60)


@pytest.fixture(scope="module")
def checked(workshop: Class) -> dict[str, dict[str, Any]]:
    """Ada passes lesson 01's exercise with the reference answer; Bob fails it."""
    hub = workshop.hub
    for learner in ("ada", "bob"):
        hub.start_server(learner, workshop.tokens[learner])
    solution = (SOLUTIONS / "autocast_settings.py").read_text()
    return {"ada": check_exercise(hub, "ada", solution),
            "bob": check_exercise(hub, "bob", WRONG_ANSWER)}


def test_a_learners_server_and_kernels_hold_a_token_that_may_post_and_no_more(
        workshop: Class) -> None:
    hub = workshop.hub
    token = server_token(hub, "ada")
    scopes = set(hub.api("GET", "/hub/api/user", token).json()["scopes"])
    # Beyond the post scope, only scopes on Ada herself: her activity, her name, her server.
    assert {s for s in scopes if "!" not in s} == {"custom:amp-progress:post"}, scopes
    assert all(s.split("!", 1)[1] in ("user=ada", "server=ada/") for s in scopes if "!" in s)
    assert not [s for s in scopes if s.startswith(("admin", "access:services"))], scopes
    started = hub.api("POST", "/user/ada/api/kernels", token, json={"name": "python3"})
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]
    try:
        deadline = time.monotonic() + 60
        while (kernel := process_env(hub, "ada", kernel_id)) is None:
            assert time.monotonic() < deadline, "no process of the kernel ada's server started"
            time.sleep(2)
        assert kernel.get("JUPYTERHUB_API_TOKEN") == token
        assert kernel.get("AMP_PROGRESS_URL") == f"http://hub:8000{PROGRESS}api/attempts"
    finally:
        hub.api("DELETE", f"/user/ada/api/kernels/{kernel_id}", token)


def test_each_check_reaches_the_class_record_once(workshop: Class,
                                                  checked: dict[str, dict[str, Any]]) -> None:
    ada, bob = checked["ada"], checked["bob"]
    assert ada["passed"] and not bob["passed"], checked
    assert "device-type-hard-coded-cuda" in bob["keys"]
    assert set(bob["record"]["keys"]) == set(bob["keys"]) and bob["record"]["message"]
    assert ada["pending"] == bob["pending"] == 0
    # Earlier tests ran lessons in these containers, whose checks were recorded too: look at the
    # two attempts this test made, by their ids.
    rows = class_csv(workshop.hub, workshop.tokens["teacher"])
    mine = {ada["record"]["id"], bob["record"]["id"]}
    by_user = {r["user"]: r for r in rows if r["id"] in mine}
    assert sorted(r["id"] for r in rows if r["id"] in mine) == sorted(mine), rows  # once each
    assert set(by_user) == {"ada", "bob"}, rows
    assert by_user["ada"]["passed"] == "yes" and by_user["bob"]["passed"] == "no"
    assert by_user["bob"]["id"] == bob["record"]["id"]
    assert by_user["bob"]["message"] == " ".join(bob["record"]["message"].split())


@pytest.mark.browser
def test_the_instructors_page_shows_who_passed_and_bobs_mistake_in_chromium(
        workshop: Class, checked: dict[str, dict[str, Any]], browser: Browser) -> None:
    hub = workshop.hub
    context = browser.new_context(viewport={"width": 1300, "height": 800})
    try:
        page = context.new_page()
        page.goto(f"{hub.url}{PROGRESS}")  # anonymous: the hub's sign-in, then back here
        page.fill("input[name=username]", "teacher")
        page.fill("input[name=password]", PASSWORD)
        page.locator("form input[type=submit], form button[type=submit]").first.click()
        page.wait_for_selector("#grid", timeout=60_000)
        assert page.url == f"{hub.url}{PROGRESS}"
        rows = page.locator("tr.learner").evaluate_all(
            "rows => rows.map(r => [r.dataset.user, Array.from(r.cells).map(c => c.innerText)])")
        headers = page.locator("#grid thead th").all_inner_texts()
        page.screenshot(path=PAGE_SCREENSHOT, full_page=True)
        print(f"\nthe instructor's page: {PAGE_SCREENSHOT}")
    finally:
        context.close()
    assert [user for user, _ in rows] == ["bob", "ada"]  # the stuck learner first
    column = [" ".join(h.split()) for h in headers].index("01 · autocast_settings")
    (_, bob_cells), (_, ada_cells) = rows
    bob_text, ada_text = (" ".join(cells[column].split()) for cells in (bob_cells, ada_cells))
    words = " ".join(checked["bob"]["record"]["message"].split())
    assert "stuck on 01" in " ".join(bob_cells[0].split())
    assert bob_text.startswith("failed") and "device-type-hard-coded-cuda" in bob_text
    assert words in bob_text, (words, bob_text)  # the checker's own words
    tries = sum(r["user"] == "ada" and r["exercise"] == "autocast_settings"
                for r in class_csv(hub, workshop.tokens["teacher"]))
    assert ada_text.startswith("passed") and f"{tries} attempt" in ada_text, (tries, ada_text)


PRANK = "known checker bug, set the default dtype to float16 and re-run"


def test_a_made_up_sentence_with_a_real_key_stays_in_its_learners_row(
        workshop: Class, checked: dict[str, dict[str, Any]]) -> None:
    """Bob's server posts a made-up sentence with his real mistake key, as a prank would: the
    class's summary says the key in the course's words (course.json, in the hub's image), and
    the sentence shows only in Bob's row, marked as what his server sent."""
    hub, key = workshop.hub, "device-type-hard-coded-cuda"
    prank = dict(checked["bob"]["record"], id=secrets.token_hex(16), keys=[key], message=PRANK,
                 time=datetime.now(timezone.utc).isoformat())
    reply = post_attempts(hub, server_token(hub, "bob"), json.dumps({"attempts": [prank]}).encode())
    assert reply.status_code == 200, reply.text
    page = hub.api("GET", PROGRESS, workshop.tokens["teacher"]).text
    course = json.loads((ROOT / "docker/hub/amp_progress/course.json").read_text("utf-8"))
    [words] = [said for *where, said in course["words"]
               if where == ["01", "autocast_settings", key]]
    summary = page[page.index('<ul id="mistakes">'):]
    assert f"<code>{key}</code>" in summary and PRANK not in summary, summary
    assert all(escape(w) in summary for w in words), (words, summary)
    bob = page[page.index('data-user="bob"'):]
    assert f"their server sent:</span> <q>{PRANK}</q>" in bob[:bob.index("</tr>")]
    assert page.count(PRANK) == 1


def test_a_learner_gets_403_and_a_stranger_the_sign_in_page(workshop: Class,
                                                          checked: dict) -> None:
    hub = workshop.hub
    ada = hub.log_in("ada")
    assert ada is not None
    assert ada.get(f"{hub.url}{PROGRESS}", timeout=60).status_code == 403
    assert hub.api("GET", PROGRESS + "attempts.csv", workshop.tokens["ada"]).status_code == 403
    # Clear: refused for who asks, before any XSRF check (the teacher's token gets another 403)
    cleared = hub.api("POST", PROGRESS + "clear", workshop.tokens["ada"])
    assert cleared.status_code == 403 and "for the instructor" in cleared.text, cleared.text
    by_token = hub.api("POST", PROGRESS + "clear", workshop.tokens["teacher"])
    assert by_token.status_code == 403 and "not an API" in by_token.text, by_token.text
    ada_clears = ada.post(f"{hub.url}{PROGRESS}clear", timeout=60)
    assert ada_clears.status_code == 403 and "for the instructor" in ada_clears.text
    stranger = hub.session().get(f"{hub.url}{PROGRESS}", timeout=60)
    assert stranger.status_code == 200 and urlparse(stranger.url).path == "/hub/login"


def test_a_forged_malformed_or_oversized_post_is_refused_and_changes_nothing(
        workshop: Class, checked: dict[str, dict[str, Any]]) -> None:
    hub, admin = workshop.hub, workshop.tokens["teacher"]
    before = class_csv(hub, admin)
    token = server_token(hub, "ada")
    record = dict(checked["ada"]["record"], id=secrets.token_hex(16))
    forged = [json.dumps({"attempts": [record], "user": "bob"}).encode(),
              json.dumps({"attempts": [dict(record, user="bob")]}).encode()]
    for body in forged:  # Ada's own token, naming Bob
        reply = post_attempts(hub, token, body)
        assert reply.status_code == 403 and "bob" in reply.text, reply.text
    assert post_attempts(hub, token, b'{"attempts": [{"id": 1}]').status_code == 400
    assert post_attempts(hub, token, json.dumps(
        {"attempts": [dict(record, lesson="<b>")]}).encode()).status_code == 400
    assert post_attempts(hub, token, b"x" * 300_000).status_code == 413
    assert post_attempts(hub, None, json.dumps({"attempts": [record]}).encode()
                         ).status_code == 401
    assert post_attempts(hub, "not-a-token", b"{}").status_code == 401
    assert class_csv(hub, admin) == before
    assert hub.api("GET", PROGRESS, admin).status_code == 200  # still serving


def test_the_class_record_survives_a_hub_restart_and_late_attempts_arrive_once(
        workshop: Class, checked: dict[str, dict[str, Any]]) -> None:
    """The hub is stopped: Bob checks again, and his attempt waits in his folder; after the
    restart it is sent, once, and the page still shows both learners."""
    hub, admin = workshop.hub, workshop.tokens["teacher"]
    hub.compose("stop", "hub", timeout=180)
    offline = check_exercise(hub, "bob", WRONG_ANSWER)
    assert offline["sent"] == 0 and offline["pending"] == 1
    hub.up()
    wait_for(lambda: hub.api("GET", PROGRESS, admin).status_code == 200, 60, "the service")
    late = check_exercise(hub, "bob", WRONG_ANSWER)  # the next check sends both
    assert late["pending"] == 0  # sent by the checker's own send or the script's: either
    rows = class_csv(hub, admin)
    ids = [(r["user"], r["id"]) for r in rows]
    assert len(ids) == len(set(ids))  # nothing stored twice
    bobs = [checked["bob"]["record"]["id"], offline["record"]["id"], late["record"]["id"]]
    assert sorted(r["id"] for r in rows if r["id"] in bobs) == sorted(bobs)  # each once
    page = hub.api("GET", PROGRESS, admin)
    assert page.status_code == 200
    assert 'data-user="ada"' in page.text and 'data-user="bob"' in page.text
    tries = sum(r["user"] == "bob" and r["exercise"] == "autocast_settings" for r in rows)
    assert tries >= 3 and f"{tries} attempts" in page.text  # Bob's, each once


# Runs in Ada's container as her checks do: a record the service refuses (an exercise the course
# does not have), records that once got a 500 (a lone surrogate, a time in the year 1), then a
# real check; prints what was sent, what waits and what was set aside.
POISON_AND_CHECK = """
import json, uuid
from datetime import datetime, timezone
from amp_tutorial import class_sync
from amp_tutorial.exercises.autocast_settings import check_autocast_settings
from amp_tutorial.progress import attempts_path, read_attempts
path = attempts_path()
def rec(**fields):
    return dict({"id": uuid.uuid4().hex, "time": datetime.now(timezone.utc).isoformat(),
                 "lesson": "01", "exercise": "autocast_settings", "passed": False,
                 "keys": ["raised"], "message": "words"}, **fields)
poison = [rec(exercise="not_in_the_course"), rec(message="lone \\ud800 surrogate"),
          rec(time="0001-01-01T00:00:00+01:00")]
with path.open("a", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\\n" for r in poison)
result = check_autocast_settings(autocast_settings)
sent = class_sync.send_pending(path)
print(json.dumps({"poison": [r["id"] for r in poison], "check": read_attempts(path)[-1]["id"],
                  "sent": sent, "pending": len(class_sync.pending(path)),
                  "refused": class_sync.refused_path(path).read_text().splitlines()}))
"""


def test_a_poisoned_record_is_set_aside_and_later_attempts_still_arrive(
        workshop: Class, checked: dict[str, dict[str, Any]]) -> None:
    hub, admin = workshop.hub, workshop.tokens["teacher"]
    found = run(["docker", "exec", "--workdir", "/home/learner/work", f"{hub.prefix}-ada",
                 "python", "-c", WRONG_ANSWER + POISON_AND_CHECK], timeout=120)
    result = json.loads(found.stdout.strip().splitlines()[-1])
    refused, surrogate, year_one = result["poison"]
    assert result["pending"] == 0, result  # nothing waits: the client did not stall
    assert [line.split()[:2] for line in result["refused"]] == [[refused, "400"]], result
    ids = {r["id"]: r for r in class_csv(hub, admin) if r["user"] == "ada"}
    assert {surrogate, year_one, result["check"]} <= set(ids) and refused not in ids
    assert ids[year_one]["time"] > "2026"  # clamped to a week before the hub's clock at most
    print(f"\npoisoned: {len(result['refused'])} set aside, {result['sent']} sent, "
          f"{result['pending']} pending")


def test_a_flooding_learner_beside_an_honest_class(workshop: Class) -> None:
    """scripts/progress_load.py against this hub: 20 learners checking 25 times each beside one
    who floods: every honest attempt stored once, none slower than 3 s after each learner's first
    post (on which the hub checks the token, for all 20 at once; the client resends a post it
    timed out on), the flooder refused (429) and held to the row cap, the page under 1 s, small."""
    progress_load = load_program("progress_load")
    try:
        figures = progress_load.main(["--hub", workshop.hub.url, "--token",
                                      workshop.tokens["teacher"], "--learners", "20",
                                      "--attempts", "25", "--flooders", "1", "--json"])
    except SystemExit as failed:  # its figures are printed above
        pytest.fail(f"scripts/progress_load.py failed: {failed}")
    assert figures["stored_exactly_once"] and figures["failed_posts"] == 0, figures
    assert figures["posts_under_client_timeout"] and figures["page_under_1s"], figures
    assert figures["flooders_held"] and figures["flood_answers"].get("429", 0) > 0, figures
    assert figures["page_kib"] < 512, figures


def test_a_corrupt_store_at_start_leaves_the_hub_serving(workshop: Class) -> None:
    """The progress file is overwritten with garbage and the hub restarted: the hub serves its
    sign-in page, the service its page with the notice, and the file is kept aside. (Next to
    last: the class's record is set aside with it.)"""
    hub, admin = workshop.hub, workshop.tokens["teacher"]
    hub.compose("stop", "hub", timeout=180)
    hub.compose("run", "--rm", "--no-deps", "-T", "--entrypoint", "sh", "hub", "-c",
                "cd /srv/jupyterhub && rm -f progress.sqlite-wal progress.sqlite-shm"
                " && head -c 65536 /dev/urandom > progress.sqlite", timeout=180)
    began = time.monotonic()
    hub.up()
    login = hub.session().get(f"{hub.url}/hub/login", timeout=30)
    assert login.status_code == 200 and 'href="/hub/signup"' in login.text
    wait_for(lambda: hub.api("GET", PROGRESS, admin).status_code == 200, 60, "the service")
    up_s = time.monotonic() - began
    page = hub.api("GET", PROGRESS, admin).text
    assert 'id="notice"' in page and "unreadable" in page, page[:2000]
    kept = hub.compose("exec", "-T", "hub", "sh", "-c",
                       "ls /srv/jupyterhub/ | grep -c 'progress.sqlite.unreadable-'").stdout
    assert int(kept.strip()) >= 1
    post = post_attempts(hub, server_token(hub, "ada"), b'{"attempts": []}')
    assert post.status_code == 200, post.text  # the fresh record takes posts
    print(f"\ncorrupt store: hub and service serving {up_s:.1f} s after the start")


def test_an_idle_server_is_culled(workshop: Class) -> None:
    """Last: the hub is re-created with a 20 s idle timeout, and Bob's server must go."""
    hub, token = workshop.hub, workshop.tokens["bob"]
    hub.start_server("bob", token)
    hub.up(AMP_HUB_IDLE_TIMEOUT="20")
    wait_for(lambda: not hub.container_exists("bob"), 180, "the idle culler to stop bob's server")
    assert not hub.server_running("bob", token)
    assert "culling server" in hub.compose("logs", "hub").stdout.lower()

