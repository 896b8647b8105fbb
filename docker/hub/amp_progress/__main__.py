"""`python -m amp_progress`: the service process the hub starts (jupyterhub_config.py)."""

from amp_progress.service import main

main()
