"""How the `parallab` command ends on an error: one line that says what to do, never a traceback
unless asked for with `--debug` (anywhere on the command line).

Usage errors (a bad flag, a bad value) are click's and typer's own, exit 2. A command that needs
the database on a fresh PARALLAB_HOME says which command creates it. Anything else unexpected is
one line naming the error and `--debug`, exit 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

DEBUG_FLAG = "--debug"
console = Console(stderr=True)


def _database_error(exc: BaseException) -> str | None:
    """The database driver's own words, lower-cased, when `exc` is a database error; else None."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    if not isinstance(exc, OperationalError | ProgrammingError):
        return None
    return str(exc.orig if exc.orig is not None else exc).lower()


def database_missing(exc: BaseException) -> bool:
    """Whether `exc` says there is no parallab database yet (none at all, or none migrated), as
    opposed to one that is down: the first needs a command run, the second only patience."""
    text = _database_error(exc)
    return text is not None and ("unable to open database file" in text or "no such table" in text or "does not exist" in text)


def database_hint(exc: BaseException) -> str | None:
    """What to run first when `exc` says the database is missing, unmigrated or down; else None."""
    text = _database_error(exc)
    if text is None:
        return None
    from backend.config import get_settings

    settings = get_settings()
    where = settings.sqlalchemy_url.split("@")[-1]
    if database_missing(exc):
        return (
            f"there is no parallab database at {where} yet (PARALLAB_HOME={settings.resolved_home}): "
            "run `parallab db upgrade` first (`parallab up` does it too)"
        )
    return f"cannot use the database at {where}: {text.splitlines()[0]} — is it running, and is PARALLAB_DATABASE_URL right?"


def run(app: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Run the typer `app` with `argv` (default sys.argv), ending errors as the module says."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args
    args = [a for a in args if a != DEBUG_FLAG]
    try:
        app(args=args, prog_name="parallab")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:  # noqa: BLE001 — the point: one line, or the traceback on request
        if debug:
            raise
        hint = database_hint(exc)
        if hint is not None:
            console.print(f"[red]parallab: {escape(hint)}[/red]")
        else:
            console.print(f"[red]parallab: {type(exc).__name__}: {escape(str(exc).splitlines()[0] if str(exc) else '')}[/red]")
            console.print(f"(run again with {DEBUG_FLAG} for the traceback)")
        raise SystemExit(1) from None
