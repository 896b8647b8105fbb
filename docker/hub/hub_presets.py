"""Which problem size the workshop hub gives every learner (read by jupyterhub_config.py).

The instructor names a preset with AMP_HUB_PRESET; the hub checks it when it starts and passes it
to every learner's server as AMP_TUTORIAL_PRESET, which every lesson reads (amp_tutorial.presets).
Unset, it depends on how the learners share the GPUs (AMP_HUB_GPUS, hub_gpus.py):
  all   SHARED_GPU_PRESET: the whole class is on the same GPUs, so each learner gets a size
        smaller than `paper`, and a class does not run a GPU out of memory by default
  each  `auto`: each learner has a GPU of their own (or shares it with a few, when there are more
        learners than GPUs), so `paper`, the size the course was written for
  none  `auto`: the size for the CPU that the learners' containers run on
"""

from __future__ import annotations

# amp_tutorial.presets.VALID_NAMES: the hub image does not have the course's package (it would
# bring torch), so the names are kept here too; tests/unit/test_hub_config.py keeps them equal.
NAMES = ("auto", "paper", "cpu", "small", "smoke")
# The default when learners share GPUs (AMP_HUB_GPUS=all): the course's mid size.
SHARED_GPU_PRESET = "cpu"


def default_preset(gpu_mode: str) -> str:
    """The learners' preset when AMP_HUB_PRESET is unset, for an AMP_HUB_GPUS mode."""
    return SHARED_GPU_PRESET if gpu_mode == "all" else "auto"


def learner_preset(setting: str | None, gpu_mode: str) -> str:
    """AMP_TUTORIAL_PRESET for every learner's server: AMP_HUB_PRESET when set, checked against
    the course's presets, else the default for the GPU mode."""
    name = (setting or "").strip().lower()
    if not name:
        return default_preset(gpu_mode)
    if name not in NAMES:
        raise ValueError(f"AMP_HUB_PRESET={setting!r}: unknown preset; valid names: "
                         f"{', '.join(NAMES)}")
    return name
