"""All SQL for users, login sessions and API tokens. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from backend.models import ApiToken, LoginSession, User

# ---- users ----


def add_user(session: Session, *, email: str, password_hash: str, role: str) -> User:
    user = User(email=email, password_hash=password_hash, role=role, disabled=False)
    session.add(user)
    session.flush()
    return user


def get_user(session: Session, user_id: int) -> User | None:
    return session.get(User, user_id)


def lock_user(session: Session, user_id: int) -> User | None:
    """The user's row, locked until the transaction ends (one user's submissions, one at a time)."""
    return session.execute(select(User).where(User.id == user_id).with_for_update()).scalar_one_or_none()


def find_user(session: Session, email: str) -> User | None:
    return session.execute(select(User).where(User.email == email)).scalar_one_or_none()


def list_users(session: Session) -> list[User]:
    return list(session.execute(select(User).order_by(User.email)).scalars())


def count_users(session: Session) -> int:
    return session.execute(select(func.count()).select_from(User)).scalar_one()


def user_emails(session: Session, user_ids: Sequence[int]) -> dict[int, str]:
    """id → email for a few users (list pages label runs with them)."""
    ids = sorted({i for i in user_ids if i is not None})
    if not ids:
        return {}
    return dict(session.execute(select(User.id, User.email).where(User.id.in_(ids))).tuples().all())


# ---- login sessions ----


def add_login_session(session: Session, *, id_hash: str, user_id: int, expires_at: datetime) -> None:
    session.add(LoginSession(id_hash=id_hash, user_id=user_id, expires_at=expires_at))
    session.flush()


def find_login_session(session: Session, id_hash: str, now: datetime) -> tuple[LoginSession, User] | None:
    """The live session with this hash and its (enabled) user."""
    row = session.execute(
        select(LoginSession, User)
        .join(User, User.id == LoginSession.user_id)
        .where(LoginSession.id_hash == id_hash, LoginSession.expires_at > now, User.disabled.is_(False))
    ).first()
    return (row[0], row[1]) if row else None


def delete_login_session(session: Session, id_hash: str) -> None:
    session.execute(delete(LoginSession).where(LoginSession.id_hash == id_hash))


def delete_user_sessions(session: Session, user_id: int) -> None:
    session.execute(delete(LoginSession).where(LoginSession.user_id == user_id))


def delete_expired_sessions(session: Session, now: datetime) -> None:
    session.execute(delete(LoginSession).where(LoginSession.expires_at <= now))


# ---- tokens ----


def add_token(session: Session, *, name: str, token_hash: str, scopes: str, user_id: int | None, prefix: str) -> ApiToken:
    token = ApiToken(name=name, token_hash=token_hash, scopes=scopes, user_id=user_id, prefix=prefix, revoked=False)
    session.add(token)
    session.flush()
    return token


def find_token(session: Session, token_hash: str) -> tuple[ApiToken, User | None] | None:
    """A live token with this hash, and its owner (None for a token made before accounts)."""
    row = session.execute(
        select(ApiToken, User)
        .outerjoin(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == token_hash, ApiToken.revoked.is_(False))
    ).first()
    return (row[0], row[1]) if row else None


def get_token(session: Session, token_id: int) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_tokens(session: Session, *, user_id: int | None = None) -> list[tuple[ApiToken, User | None]]:
    """Tokens (one user's, or everyone's), newest first, with their owners."""
    query = select(ApiToken, User).outerjoin(User, User.id == ApiToken.user_id).order_by(ApiToken.created_at.desc(), ApiToken.id.desc())
    if user_id is not None:
        query = query.where(ApiToken.user_id == user_id)
    return [(t, u) for t, u in session.execute(query).tuples()]


def touch_token(session: Session, token_id: int, now: datetime) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))
