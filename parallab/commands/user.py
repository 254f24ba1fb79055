"""`parallab user create|list|disable`: accounts, on the server's host (straight to its database).

The first admin of a lab: `parallab user create you@lab.org --admin` (or, in compose, the
env-seeded admin: PARALLAB_ADMIN_EMAIL and PARALLAB_ADMIN_PASSWORD, read once at start-up).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.jobspec import fail

user_app = typer.Typer(help="Accounts: viewer (reads), member (runs, uploads), admin (everything).", no_args_is_help=True)
console = Console()


@user_app.command("create")
def create(
    email: Annotated[str, typer.Argument(help="The login name.")],
    role: Annotated[str, typer.Option(help="viewer, member or admin.")] = "member",
    admin: Annotated[bool, typer.Option("--admin", help="Make an admin (the first one of a lab: this).")] = False,
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="Read the password from standard input (scripts).")] = False,
) -> None:
    """Create a user; asks for the password twice unless --password-stdin."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import AccountError, create_user

    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            user = create_user(session=session, email=email, password=password, role="admin" if admin else role)
            summary = f"created {user.email} ({user.role})"
    except AccountError as exc:
        fail(str(exc))
    typer.echo(summary)


@user_app.command("list")
def list_() -> None:
    """Every user, with role and status."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import list_users

    table = Table("id", "email", "role", "status", "created", "last login")
    with session_scope(get_settings().sqlalchemy_url) as session:
        for u in list_users(session=session):
            last = u.last_login_at.strftime("%Y-%m-%d %H:%M") if u.last_login_at else "never"
            table.add_row(str(u.id), u.email, u.role, "disabled" if u.disabled else "active", u.created_at.strftime("%Y-%m-%d %H:%M"), last)
    console.print(table)


@user_app.command("disable")
def disable(
    email: Annotated[str, typer.Argument(help="Whom to disable.")],
    enable: Annotated[bool, typer.Option("--enable", help="Enable again instead.")] = False,
) -> None:
    """Disable a user: its sessions end and its tokens stop working (--enable undoes it)."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import AccountError, find_user, set_disabled

    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            user = set_disabled(session=session, user=find_user(session=session, email=email), disabled=not enable)
            summary = f"{user.email} {'enabled' if enable else 'disabled'}"
    except AccountError as exc:
        fail(str(exc))
    typer.echo(summary)


@user_app.command("unlock")
def unlock(
    email: Annotated[str, typer.Argument(help="Whose login lockout to lift.")],
    ip: Annotated[str | None, typer.Option("--ip", help="Also lift the lockout of this client address.")] = None,
) -> None:
    """Lift a login lockout (after too many failed logins) now, for every API process sharing the
    broker's Redis; without Redis, each API process keeps its own count (lift it on the Users page)."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import AccountError, find_user
    from backend.services.login_guard import login_guard

    settings = get_settings()
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            user = find_user(session=session, email=email)
            login_guard(settings).unlock(email=user.email, ip=ip)
    except AccountError as exc:
        fail(str(exc))
    typer.echo(f"{user.email}: login unlocked" + (f" (and address {ip})" if ip else ""))
