"""What a viewer may read of a failed run's error and log: the worker's tracebacks and log tails
name the server's directories (the checkout, the virtual environment, the run directories, a home),
which tell a member where and how the lab is installed. Members and viewers see each absolute path
shortened — a path inside a Python package from the package on (`torch/distributed/run.py`), one in
this checkout relative to it (`workers/harness/main.py`), any other as `…/` and its last name — and
an admin (or the local user) sees the text as the worker wrote it. The stored text is never
changed: this is a view.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from backend.services.auth import Principal

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("site-packages", "dist-packages")
_PATH = re.compile(r"(?<![\w.~:/-])(/(?:[^\s/\"'`:,;()\[\]<>{}|]+/)+)([^\s/\"'`:,;()\[\]<>{}|]*)")
"""An absolute path: a '/' not inside a word, URL or relative path, its directories, then its last name."""


def _short(match: re.Match[str]) -> str:
    directories, name = match.group(1).strip("/").split("/"), match.group(2)
    for marker in PACKAGE_DIRS:
        if marker in directories:
            return "/".join([*directories[directories.index(marker) + 1 :], name])
    repo = REPO.parts[1:]
    if tuple(directories[: len(repo)]) == repo:
        return "/".join([*directories[len(repo) :], name])
    return f"…/{name}"


def strip_paths(text: str) -> str:
    """`text` with every absolute path shortened (see the module's docstring)."""
    return _PATH.sub(_short, text)


def sees_raw(viewer: Principal) -> bool:
    """Whether `viewer` reads a run's error as written: an admin, or the local user (the host's owner)."""
    return viewer.may("admin")


def error_for(viewer: Principal, text: str | None) -> str | None:
    """A run's error (or log tail) as `viewer` may read it."""
    return text if text is None or sees_raw(viewer) else strip_paths(text)


def progress_for(viewer: Principal, progress: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's progress with its log tail as `viewer` may read it."""
    if not progress or not isinstance(progress.get("log"), str) or sees_raw(viewer):
        return progress
    return {**progress, "log": strip_paths(progress["log"])}
