"""`parallab token create|list|revoke`: API tokens, on the server's host (straight to its database).

A token belongs to a user and acts as that user within its scopes; it is printed once, and only
its hash is stored. Members can also make their own on the Tokens page.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.jobspec import fail

token_app = typer.Typer(help="Scoped API tokens (upload, submit, admin), each owned by a user.", no_args_is_help=True)
console = Console()


@token_app.command("create")
def create(
    user: Annotated[str, typer.Option("--user", help="The owner's email.")],
    scope: Annotated[list[str], typer.Option("--scope", help="upload, submit or admin; repeat for several.")],
    name: Annotated[str, typer.Option(help="What the token is for, e.g. 'ci'.")] = "token",
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import AccountError, find_user
    from backend.services.tokens import create_token

    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            token = create_token(session=session, name=name, scopes=scope, user=find_user(session=session, email=user))
    except AccountError as exc:
        fail(f"--user: {exc}")
    except ValueError as exc:
        fail(f"--scope: {exc}")
    typer.echo(token)


@token_app.command("list")
def list_(user: Annotated[str | None, typer.Option("--user", help="Only this user's tokens.")] = None) -> None:
    """Tokens (never the tokens themselves): owner, scopes, last use."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import AccountError, find_user
    from backend.services.tokens import list_tokens

    table = Table("id", "name", "starts with", "owner", "scopes", "created", "last used", "status")
    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            user_id = find_user(session=session, email=user).id if user else None
            for t in list_tokens(session=session, user_id=user_id):
                last = t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "never"
                table.add_row(
                    str(t.id),
                    t.name,
                    f"{t.prefix or ''}…",
                    t.owner or "—",
                    " ".join(t.scopes),
                    t.created_at.strftime("%Y-%m-%d %H:%M"),
                    last,
                    "revoked" if t.revoked else "active",
                )
    except AccountError as exc:
        fail(f"--user: {exc}")
    console.print(table)


@token_app.command("revoke")
def revoke(token_id: Annotated[int, typer.Argument(help="The token's id (`parallab token list`).")]) -> None:
    """Revoke a token: it stops working at once."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.auth import LOCAL
    from backend.services.tokens import revoke_token

    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            info = revoke_token(session=session, token_id=token_id, principal=LOCAL)
    except LookupError as exc:
        fail(str(exc))
    typer.echo(f"revoked token {info.id} ({info.name}, {info.owner or 'no owner'})")
