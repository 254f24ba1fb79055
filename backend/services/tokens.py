"""Scoped API tokens. Only a SHA-256 of each token is stored; the plain token is shown once."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy.orm import Session

from backend.store import runs as store

SCOPES = ("upload", "submit", "admin")
TOKEN_PREFIX = "plb_"


class TokenError(PermissionError):
    pass


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(*, session: Session, name: str, scopes: list[str]) -> str:
    """A new token with `scopes`; returns the plain token (never stored)."""
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(scopes) or 'none'}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    store.add_token(session, name=name, token_hash=hash_token(token), scopes=" ".join(sorted(set(scopes))))
    return token


def check_token(*, session: Session, token: str | None, scope: str) -> None:
    """Raise TokenError unless `token` is valid and carries `scope` (admin carries every scope)."""
    if not token:
        raise TokenError("a Bearer token is required")
    row = store.find_token(session, hash_token(token))
    if row is None:
        raise TokenError("the token is not valid")
    scopes = set(row.scopes.split())
    if scope not in scopes and "admin" not in scopes:
        raise TokenError(f"the token lacks the {scope!r} scope")
