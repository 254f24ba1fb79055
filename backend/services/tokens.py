"""Scoped API tokens. Only a SHA-256 of each token is stored; the plain token is shown once.

Since accounts a token belongs to a user and acts as that user, within its scopes:
a scope the owner's role does not allow cannot be granted, a disabled owner's tokens stop
working, and each use is recorded (to the minute). Tokens made before accounts have no owner
and keep working on their scopes alone (an `admin` scope acts as an admin, others as a member).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from backend.models import ApiToken, User, utcnow
from backend.services.auth import ROLE_RANK, Principal
from backend.store import accounts as store

SCOPES = ("upload", "submit", "admin")
TOKEN_PREFIX = "plb_"
SCOPE_ROLE = {"upload": "member", "submit": "member", "admin": "admin"}
"""The weakest role that may hold each scope: the role its actions need (services.auth.ACTIONS)."""
TOUCH_EVERY = timedelta(seconds=60)


class TokenError(PermissionError):
    pass


@dataclass(frozen=True)
class TokenInfo:
    """A token as lists show it (never the token itself)."""

    id: int
    name: str
    prefix: str | None
    scopes: list[str]
    owner: str | None
    user_id: int | None
    created_at: datetime
    last_used_at: datetime | None
    revoked: bool


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(*, session: Session, name: str, scopes: list[str], user: User | None = None) -> str:
    """A new token for `user` with `scopes`; returns the plain token (never stored; caller commits).

    `user` None makes an ownerless token, as before accounts (tests and scripts of that time). A
    scope named twice is held once."""
    scopes = list(dict.fromkeys(scopes))
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(scopes) or 'none'}")
    name = name.strip()[:200] or "token"
    if user is not None:
        if user.disabled:
            raise ValueError(f"{user.email} is disabled")
        beyond = [s for s in scopes if ROLE_RANK[user.role] < ROLE_RANK[SCOPE_ROLE[s]]]
        if beyond:
            raise ValueError(f"a {user.role} cannot hold the {', '.join(beyond)} scope")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    store.add_token(
        session,
        name=name,
        token_hash=hash_token(token),
        scopes=" ".join(sorted(set(scopes))),
        user_id=user.id if user else None,
        prefix=token[:10],
    )
    return token


def token_principal(*, session: Session, token: str, now: datetime | None = None) -> Principal:
    """Who a Bearer token acts as; raises TokenError for an unknown, revoked or disabled one.

    Records the use (at most once a minute, in its own commit: reads roll their session back)."""
    found = store.find_token(session, hash_token(token))
    if found is None:
        raise TokenError("the token is not valid")
    row, user = found
    if user is not None and user.disabled:
        raise TokenError("the token's owner is disabled")
    now = now or utcnow()
    last = row.last_used_at
    if last is not None and last.tzinfo is None:  # SQLite hands back naive datetimes
        last = last.replace(tzinfo=now.tzinfo)
    if last is None or now - last >= TOUCH_EVERY:
        store.touch_token(session, row.id, now)
        session.commit()
    scopes = frozenset(row.scopes.split())
    if user is None:
        return Principal(via="token", role="admin" if "admin" in scopes else "member", scopes=scopes, email=f"token {row.name}")
    return Principal(via="token", role=user.role, user_id=user.id, email=user.email, scopes=scopes)


def check_token(*, session: Session, token: str | None, scope: str) -> Principal:
    """The token's principal; raises TokenError unless it is valid and carries `scope` (admin carries every scope)."""
    if not token:
        raise TokenError("a Bearer token is required")
    principal = token_principal(session=session, token=token)
    if scope not in principal.scopes and "admin" not in principal.scopes:
        raise TokenError(f"the token lacks the {scope!r} scope")
    return principal


def _info(row: ApiToken, owner: User | None) -> TokenInfo:
    return TokenInfo(
        row.id,
        row.name,
        row.prefix,
        row.scopes.split(),
        owner.email if owner else None,
        row.user_id,
        row.created_at,
        row.last_used_at,
        row.revoked,
    )


def list_tokens(*, session: Session, user_id: int | None = None) -> list[TokenInfo]:
    """One user's tokens (or everyone's), newest first."""
    return [_info(t, u) for t, u in store.list_tokens(session, user_id=user_id)]


def revoke_token(*, session: Session, token_id: int, principal: Principal) -> TokenInfo:
    """Revoke a token its owner (or an admin) names (caller commits). Another member's token is
    "not found", as a missing one is: a member sees only their own tokens, so a refusal must not
    tell which ids are someone else's."""
    row = store.get_token(session, token_id)
    if row is None or not principal.owns(row.user_id):
        raise LookupError(f"no token {token_id} of yours")
    row.revoked = True
    owner = store.get_user(session, row.user_id) if row.user_id is not None else None
    return _info(row, owner)
