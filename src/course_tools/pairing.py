"""The course's contents manager: Jupytext pairing (each lesson's ``.py`` with an ``.ipynb`` that
keeps the outputs) that never locks a learner out of a lesson and says why a save failed.

- Pairing is ``formats = "ipynb,py:percent"``, from ``notebooks/jupytext.toml`` or, in a folder
  without one, this class's default.
- A paired ``.ipynb`` that cannot be read (truncated, hand-edited) is renamed
  ``NAME.ipynb.broken-<UTC time>``, never deleted, and the lesson opens from its ``.py`` with a
  note cell at the top saying so. The note is removed again on save: the ``.py`` never holds it.
- A save that the disk refuses (read-only volume, full disk, no permission) answers with a plain
  reason; the files are written atomically, so the ``.py`` on disk stays whole.
Selected with ``--ServerApp.contents_manager_class=course_tools.pairing.CourseContentsManager``
(``pdm run lab``, the image's start scripts) or the installed ``jupyter_server_config.d`` file.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any

import nbformat
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class
from tornado.web import HTTPError

PAIRING = "ipynb,py:percent"
NOTE_KEY = "course_note"  # cell metadata marking the note cell, dropped on save

_JupytextManager = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)

SAVE_FAILURES = {
    errno.EROFS: "the folder is read-only (a read-only volume or mount)",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "your disk quota is used up",
    errno.EACCES: "the server may not write this folder (file permissions)",
    errno.EPERM: "the server may not write this folder (file permissions)",
}


def unreadable(os_path: str) -> str | None:
    """Why the notebook file at ``os_path`` cannot be read, or None if it reads."""
    try:
        nbformat.read(os_path, as_version=4)
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - any failure to parse is the answer
        return f"{type(err).__name__}: {str(err)[:200]}"
    return None


def note_cell(text: str) -> dict[str, Any]:
    """A markdown cell shown at the top of a lesson, never saved."""
    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata[NOTE_KEY] = True
    return cell


class CourseContentsManager(_JupytextManager):
    """Jupytext's contents manager with the course's pairing and the two safeguards above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.formats:
            self.formats = PAIRING

    async def get(self, path: str, content: bool = True, type: str | None = None,
                  format: str | None = None, **kwargs: Any) -> dict[str, Any]:
        try:
            return await super().get(path, content=content, type=type, format=format, **kwargs)
        except HTTPError:
            twin = path[: -len(".py")] + ".ipynb" if path.endswith(".py") else None
            reason = twin and content and unreadable(self._get_os_path(twin))
            if not reason:
                raise
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        kept = f"{twin}.broken-{stamp}"
        os.rename(self._get_os_path(twin), self._get_os_path(kept))
        self.log.warning("unreadable %s (%s) renamed %s; %s opened from its text", twin, reason,
                         kept, path)
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        name, kept_name = twin.rsplit("/", 1)[-1], kept.rsplit("/", 1)[-1]
        model["content"].cells.insert(0, note_cell(
            f"**Note: the saved outputs of this lesson could not be read**, so it opened from its "
            f"text `{path.rsplit('/', 1)[-1]}`, without outputs. The unreadable file `{name}` "
            f"({reason}) is kept as `{kept_name}`; nothing was deleted. Saving writes a new "
            f"`{name}`. This note is not saved."))
        return model

    async def save(self, model: dict[str, Any], path: str = "") -> dict[str, Any]:
        if model.get("type") == "notebook" and model.get("content"):
            cells = model["content"].get("cells", [])
            model["content"]["cells"] = [c for c in cells
                                         if not c.get("metadata", {}).get(NOTE_KEY)]
        try:
            return await super().save(model, path)
        except HTTPError as err:
            raise self._plain(err, path) from err
        except OSError as err:
            raise self._plain(err, path) from err

    def _plain(self, err: Exception, path: str) -> HTTPError:
        """The save's failure in words: which errno, what it means, that the old file is intact."""
        found = getattr(err, "errno", None) or getattr(err.__context__, "errno", None)
        text = str(err)
        for number, meaning in SAVE_FAILURES.items():
            if found == number or f"[Errno {number}]" in text or (
                    number == errno.EACCES and "Permission denied" in text):
                return HTTPError(
                    getattr(err, "status_code", 500),
                    f"Could not save {path}: {meaning}. The copy on disk is unchanged; to keep "
                    f"this version, use File > Download. ({os.strerror(number)})")
        if isinstance(err, HTTPError):
            return err
        return HTTPError(500, f"Could not save {path}: {err}")
