"""The class's progress, a JupyterHub service (`amp-progress`): learners' servers post their
exercise attempts, the instructor reads who is stuck (docs/workshop.md, "The class's progress").

Modules, one job each:
  access   who may do what: the hub's scopes and roles, and the checks on a token's owner
  course   the course's exercises and mistake keys, from course.json (course_tools writes it)
  records  what a post may hold, checked before anything is stored
  limits   how much one learner may send: rows kept and posts per minute
  store    the attempts in SQLite; an unreadable file is set aside, never fatal
  view     the instructor's page, from the stored attempts
  service  the tornado handlers and the process the hub starts (`python -m amp_progress`)
The hub image copies this package to /etc/jupyterhub; the tests import it from docker/hub.
"""
