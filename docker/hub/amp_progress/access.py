"""Who may do what with the class's progress: the scopes the hub grants, and the service's checks.

The hub (jupyterhub_config.py) defines two custom scopes and hands them out:
  POST_SCOPE  every learner holds it (the `user` role) and it is the only scope added to their
              server's token ($JUPYTERHUB_API_TOKEN): their kernels can post their attempts and
              nothing else new
  READ_SCOPE  only the instructor's role (INSTRUCTOR_ROLE, the hub's admin by AMP_HUB_ADMIN), and
              the service's OAuth tokens may carry it, so the page is theirs alone
The service asks the hub who a token or a browser belongs to (jupyterhub.services.auth) and then
decides here: the user is the token's, never a name sent in the request.
"""

from __future__ import annotations

from typing import Any

SERVICE = "amp-progress"  # reached at /services/amp-progress/
PORT = 10101  # the service listens on the hub container's loopback; the proxy routes to it
POST_SCOPE = f"custom:{SERVICE}:post"
READ_SCOPE = f"custom:{SERVICE}:read"
INSTRUCTOR_ROLE = f"{SERVICE}-instructor"
# The hub's default `server` role, which a server's token gets when server_token_scopes is unset.
SERVER_SCOPES = ["users:activity!user", "access:servers!server"]


def custom_scopes() -> dict[str, dict[str, str]]:
    return {
        POST_SCOPE: {"description": "Send your own exercise attempts to the class's progress."},
        READ_SCOPE: {"description": "See every learner's exercise attempts; export, clear."},
    }


def roles(instructors: list[str]) -> list[dict[str, Any]]:
    """The hub's roles: learners may post (their own, the service checks); instructors read."""
    return [
        {
            "name": "user",
            "description": "A learner: their own things, and posting attempts",
            "scopes": ["self", POST_SCOPE],
        },
        {
            "name": INSTRUCTOR_ROLE,
            "description": "Sees the class's progress page",
            "scopes": [READ_SCOPE, f"access:services!service={SERVICE}"],
            "users": instructors,
        },
    ]


def learner_of(model: dict[str, Any] | None) -> str | None:
    """The user a post is from: a user (not a service) whose token holds POST_SCOPE."""
    if not model or model.get("kind", "user") != "user":
        return None
    return model["name"] if POST_SCOPE in model.get("scopes", ()) else None


def may_read(model: dict[str, Any] | None) -> bool:
    """Whether a signed-in browser may see the page, export and clear: READ_SCOPE only."""
    return bool(
        model and model.get("kind", "user") == "user" and READ_SCOPE in model.get("scopes", ())
    )
