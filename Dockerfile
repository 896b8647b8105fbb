# The AMP course in JupyterLab, for ROCm, CUDA or CPU: BASE_IMAGE picks the PyTorch build, and the
# base's own torch is used as it is. docker-compose.yml sets BASE_IMAGE per variant (docker/*.yml).
#
#   docker compose up                              # ROCm (default)
#   AMP_TUTORIAL_VARIANT=cuda docker compose up    # NVIDIA; `cpu` for no GPU
#
# Behind a TLS-inspecting proxy, pip needs the proxy's CA bundle: pass it as the build secret
# `ca-bundle` (compose: AMP_TUTORIAL_CA_BUNDLE=/path/to/bundle.pem). It is mounted only while pip
# runs and is never stored in a layer.
ARG BASE_IMAGE=rocm/pytorch:rocm7.1_ubuntu24.04_py3.13_pytorch_release_2.9.1

# ---- Stage 1: the course's locked dependencies, without torch and the CUDA stack PyPI adds ----
FROM ${BASE_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml pdm.lock ./
# pdm exports the default group of pdm.lock with hashes, and `workshop` (jupyterhub-singleuser, for
# the workshop hub's learner servers); awk then drops each entry (its line and
# its indented --hash lines) for torch, triton, nvidia-* and cuda-*, which the base provides, and
# torchao, whose release must match the base's torch (stage 2 picks it).
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python -m venv /opt/pdm \
 && /opt/pdm/bin/pip install --no-cache-dir --quiet "pdm[locked]==2.29.3" \
 && PDM_CHECK_UPDATE=false /opt/pdm/bin/pdm export --prod -G workshop --output locked.txt \
 && awk '/^[^ ]/ { skip = /^(torch|torchao|triton|nvidia-[^=]*|cuda-[^=]*)==/ } !skip' locked.txt \
      > requirements.txt

# ---- Stage 2: the image ----
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Fail here, with one line, if the base has no PyTorch or one outside the course's supported range
# (amp_tutorial/versions.py holds the range; pyproject.toml states it for pip and PDM).
COPY src/amp_tutorial/versions.py /usr/local/lib/amp-tutorial-versions.py
RUN python -c "import torch; print(f'PyTorch {torch.__version__} from the base image')" \
 && python /usr/local/lib/amp-tutorial-versions.py --check

# The course's packages go into their own venv, /opt/course, so the base's environment stays
# untouched. A .pth file appends the base's site-packages to the venv's path: torch (and anything
# else the lock does not pin) comes from the base. This also works when the base's Python is
# itself a venv (rocm/pytorch), where `venv --system-site-packages` would miss it.
COPY --from=requirements /src/requirements.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python -m venv /opt/course \
 && python -c 'import site; print("\n".join(f"import site; site.addsitedir({p!r})" for p in site.getsitepackages()))' \
      > "$(/opt/course/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/base_image.pth" \
 && /opt/course/bin/pip install --no-cache-dir --quiet --no-deps --require-hashes -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt \
 && torchao="$(python /usr/local/lib/amp-tutorial-versions.py --torchao)" \
 && if [ -n "${torchao}" ]; then \
        /opt/course/bin/pip install --no-cache-dir --quiet --no-deps "torchao==${torchao}"; \
    else echo "no torchao release for this torch: lesson 16 skips FP8 training and says why"; fi
# `torchrun` first on the PATH runs torch.distributed.run with the course's Python (the base's
# torchrun would start workers that cannot import amp_tutorial).
COPY docker/torchrun /opt/course/bin/torchrun
# SHELL: JupyterLab's terminals start $SHELL (else sh); bash gives learners history and completion.
# AMP_TUTORIAL_IN_CONTAINER: a GPU that is there but closed to the lab user is then reported with
# the compose setting that fixes it (amp_tutorial.device.gpu_access_problem).
# KINETO_LOG_LEVEL: the profiler's C++ logger off in every kernel, lessons or not, so that its
# lines (`USDT ... profiler_start`, `gpuGetDeviceCount failed`) never show as error boxes
# (amp_tutorial.profiler_logs says why this is the control and the value).
ENV PATH=/opt/course/bin:$PATH \
    VIRTUAL_ENV=/opt/course \
    SHELL=/bin/bash \
    AMP_TUTORIAL_IN_CONTAINER=1 \
    KINETO_LOG_LEVEL=99

# The amp_tutorial package, and its wheel data: the lab settings land in /opt/course/etc/jupyter.
COPY pyproject.toml README.md /tmp/course/
COPY jupyter-config /tmp/course/jupyter-config
COPY src /tmp/course/src
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && pip install --no-cache-dir --quiet --no-deps /tmp/course \
 && rm -rf /tmp/course

# A non-root user whose UID/GID match the host user's, so files written to the bind-mounted
# notebooks/ belong to that user. Ubuntu bases already have a user 1000 (`ubuntu`): it makes way.
# `render` must exist for compose's group_add in the ROCm variant; most base images lack it.
ARG NB_UID=1000
ARG NB_GID=1000
RUN if [ "${NB_UID}" = 0 ] || [ "${NB_GID}" = 0 ]; then \
        echo "NB_UID/NB_GID must not be 0: the lab runs as a non-root user" >&2; exit 1; \
    fi \
 && if getent passwd "${NB_UID}" >/dev/null; then userdel --remove "$(getent passwd "${NB_UID}" | cut -d: -f1)"; fi \
 && if ! getent group "${NB_GID}" >/dev/null; then groupadd --gid "${NB_GID}" learner; fi \
 && useradd --uid "${NB_UID}" --gid "${NB_GID}" --create-home --shell /bin/bash learner \
 && if ! getent group render >/dev/null; then groupadd --system render; fi

COPY docker/start-lab.py /usr/local/bin/start-lab
# Under the workshop hub (docker-compose.hub.yml) a learner's server starts with start-singleuser
# instead, on their own volume mounted at /home/learner/work: created here so that a new volume
# takes this folder's owner, the learner.
COPY docker/start-singleuser.py /usr/local/bin/start-singleuser
RUN install -d -o "${NB_UID}" -g "${NB_GID}" /home/learner/work
# The lessons, so the image works on its own; compose bind-mounts the checkout's notebooks/ here.
COPY --chown=${NB_UID}:${NB_GID} notebooks /home/learner/notebooks
# The programs the lessons run (the DDP training script), beside the lessons: a lesson finds them
# at ../scripts, in the image's notebooks/ and in a learner's work/ under the hub alike.
COPY scripts /home/learner/scripts

USER ${NB_UID}:${NB_GID}
WORKDIR /home/learner/notebooks
ENV AMP_TUTORIAL_NOTEBOOKS=/home/learner/notebooks
EXPOSE 8888
# Under the hub the server lives below JUPYTERHUB_SERVICE_PREFIX (/user/<name>/). A failed probe
# in the start period does not count and the first answer makes it healthy at once: on a busy
# 2-core machine the server took over 45 s to answer, and was marked unhealthy at 30 s.
HEALTHCHECK --interval=5s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:8888' + os.environ.get('JUPYTERHUB_SERVICE_PREFIX', '/') + 'api', timeout=2)"]
CMD ["start-lab"]
