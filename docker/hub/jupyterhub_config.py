"""The workshop hub: one JupyterLab container per learner, from the course image.

Started by `docker compose -f docker-compose.hub.yml up` (see the README, "Running a workshop");
every setting comes from that file's environment:
  AMP_HUB_ADMIN          the instructor's user name (required): they sign up under it first and
                         then admit learners at /hub/authorize
  AMP_TUTORIAL_VARIANT   rocm, cuda or cpu: which course image learners get, and the GPU vendor
  AMP_HUB_IMAGE          that image (amp-tutorial:<variant>, built by the same compose file)
  AMP_HUB_GPUS, AMP_HUB_GPU_IDS   how learners share the GPUs (hub_gpus.py)
  AMP_HUB_PRESET         the learners' problem size, AMP_TUTORIAL_PRESET in their servers;
                         unset, it follows AMP_HUB_GPUS (hub_presets.py)
  AMP_HUB_CPU_LIMIT, AMP_HUB_MEM_LIMIT   per learner (cores, bytes with a unit suffix)
  AMP_HUB_IDLE_TIMEOUT   seconds without activity before a learner's server is stopped
  AMP_HUB_PREFIX         names of the learners' containers and volumes: <prefix>-<user>
  AMP_HUB_NETWORK        the Docker network the hub and the learners' containers share
  RENDER_GID, VIDEO_GID  rocm: the host's groups of the GPU device files (docker/setup-env)
The hub's database and cookie secret live in its working folder, the volume at /srv/jupyterhub:
JupyterHub creates the secret there on first start (mode 600) and never logs it. The proxy's token
is made afresh at each start, since the proxy runs inside this container with the hub.
"""

import os
import sys
from pathlib import Path

import hub_gpus
import hub_presets
import nativeauthenticator
from amp_progress import access as progress_access

c = get_config()  # noqa: F821 -- provided by JupyterHub when it loads this file


def setting(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        sys.exit(f"jupyterhub_config.py: set {name} (see docker-compose.hub.yml)")
    return value


PREFIX = setting("AMP_HUB_PREFIX", "amp-hub")
ADMIN = setting("AMP_HUB_ADMIN")
WORK = "/home/learner/work"  # the learner's volume; the course image creates it for them
VENDOR = hub_gpus.vendor_of(setting("AMP_TUTORIAL_VARIANT", "rocm"))
GPU_MODE = hub_gpus.parse_mode(os.environ.get("AMP_HUB_GPUS"), VENDOR)
GPU_IDS = [g.strip() for g in os.environ.get("AMP_HUB_GPU_IDS", "").split(",") if g.strip()]
GROUP_IDS = [os.environ.get("VIDEO_GID") or "video", os.environ.get("RENDER_GID") or "render"]
if GPU_MODE == "each":
    hub_gpus.least_used(GPU_IDS, [])  # fails now, with the fix, when no GPU is listed
# Checked now: an unknown name stops the hub here, not every learner's first lesson.
PRESET = hub_presets.learner_preset(os.environ.get("AMP_HUB_PRESET"), GPU_MODE)

# --- The hub, reached through its proxy on port 8000; learners' servers reach it as `hub` ---
c.JupyterHub.bind_url = "http://0.0.0.0:8000"  # inside the container; compose publishes it
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = "hub"  # the compose service name, on AMP_HUB_NETWORK
c.JupyterHub.cleanup_servers = False  # a hub restart leaves running lessons alone
c.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"

# --- Sign-in: learners sign up, and get nothing until the admin admits them ---
c.JupyterHub.authenticator_class = "nativeauthenticator.NativeAuthenticator"
# NativeAuthenticator's own pages first: its login page links to the sign-up page.
c.JupyterHub.template_paths = [str(Path(nativeauthenticator.__file__).parent / "templates")]
c.Authenticator.admin_users = {ADMIN}
# NativeAuthenticator lets nobody in who has not been admitted (or is the admin), so every user
# it authenticates may use the hub; JupyterHub >= 5 wants that said.
c.Authenticator.allow_all = True
c.NativeAuthenticator.open_signup = False
c.NativeAuthenticator.minimum_password_length = 8
c.NativeAuthenticator.check_common_password = True

# --- One container per learner, from the course image, with their own volume ---
c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
c.DockerSpawner.image = setting("AMP_HUB_IMAGE")
c.DockerSpawner.pull_policy = "never"  # built locally by docker-compose.hub.yml
c.DockerSpawner.network_name = setting("AMP_HUB_NETWORK")
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.name_template = PREFIX + "-{username}"
c.DockerSpawner.volumes = {PREFIX + "-{username}": WORK}
c.DockerSpawner.remove = True  # the container goes when the server stops; the volume stays
c.DockerSpawner.cmd = ["start-singleuser"]  # copies the course into the volume, keeps edits
c.DockerSpawner.notebook_dir = WORK
c.DockerSpawner.environment = {
    "AMP_TUTORIAL_WORK": WORK, "AMP_TUTORIAL_PRESET": PRESET,
    # one record of the learner's attempts (amp_tutorial.progress), in their volume, wherever a
    # lesson runs from
    "AMP_TUTORIAL_WORKSPACE": WORK,
    # where amp_tutorial.class_sync sends the learner's attempts: the progress service, through
    # the proxy (the compose service `hub`, port 8000), with the server's own token
    "AMP_PROGRESS_URL": f"http://hub:8000/services/{progress_access.SERVICE}/api/attempts",
}
c.DockerSpawner.cpu_limit = float(setting("AMP_HUB_CPU_LIMIT", "4"))
# torch starts a thread per core of the host, not per core of the learner's limit: 64 threads
# under a 4-core quota spend most of each step throttled (a step's threads then wait for a CPU,
# and the lessons' timing rule states no ratio from it). One thread per core the learner has.
c.DockerSpawner.environment["OMP_NUM_THREADS"] = str(max(1, int(c.DockerSpawner.cpu_limit)))
c.DockerSpawner.mem_limit = setting("AMP_HUB_MEM_LIMIT", "8G")
c.DockerSpawner.start_timeout = 180
# After its container starts, a learner's server must answer within this: JupyterHub's 30 s
# default was seen to run out on a loaded 2-core machine (2026-11-26), which stops the server.
c.Spawner.http_timeout = 120
c.Spawner.default_url = "/lab"

# user -> GPU, in `each` mode, for the servers this hub started. It lives in memory: after a hub
# restart, servers still running from before are not counted (the README says so).
gpu_of: dict[str, str] = {}


def give_gpus(spawner) -> None:
    """pre_spawn_hook: the learner's devices, per AMP_HUB_GPUS."""
    gpu = None
    if GPU_MODE == "each":
        others = [g for user, g in gpu_of.items() if user != spawner.user.name]
        gpu = gpu_of[spawner.user.name] = hub_gpus.least_used(GPU_IDS, others)
        spawner.log.info("GPU %s for %s", gpu, spawner.user.name)
    if GPU_MODE != "none":
        spawner.extra_host_config = hub_gpus.host_config(VENDOR, gpu, GROUP_IDS)


def release_gpu(spawner) -> None:
    gpu_of.pop(spawner.user.name, None)


c.Spawner.pre_spawn_hook = give_gpus
c.Spawner.post_stop_hook = release_gpu

# --- Idle servers are stopped by jupyterhub-idle-culler, a service of the hub ---
# --- The class's exercise attempts: the amp-progress service (amp_progress/, docs/workshop.md) ---
# Learners hold a custom scope to post their own attempts, and their servers' tokens get it on top
# of the default `server` scopes, nothing more; only the admin's role reads the page.
c.JupyterHub.custom_scopes = progress_access.custom_scopes()
c.Spawner.server_token_scopes = [*progress_access.SERVER_SCOPES, progress_access.POST_SCOPE]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}, *progress_access.roles([ADMIN])]
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                f"--timeout={int(setting('AMP_HUB_IDLE_TIMEOUT', '3600'))}"],
}, {
    "name": progress_access.SERVICE,
    "url": f"http://127.0.0.1:{progress_access.PORT}",
    # the package the Dockerfile copies to /etc/jupyterhub (on the service's PYTHONPATH); its
    # store is on the hub's volume, beside the hub's database: kept across restarts. A store it
    # cannot read is set aside and a fresh one started: the service never stops the hub.
    "command": [sys.executable, "-m", "amp_progress"],
    "environment": {"AMP_PROGRESS_DB": "/srv/jupyterhub/progress.sqlite",
                    "PYTHONPATH": "/etc/jupyterhub"},
    "oauth_client_allowed_scopes": [progress_access.READ_SCOPE],
    "oauth_no_confirm": True,
}]
