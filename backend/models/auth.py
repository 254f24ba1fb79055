"""Accounts: users with a role, and their login sessions.

Roles are ordered — `viewer` reads, `member` also submits, cancels its own runs and uploads with
its own tokens, `admin` does everything, user management included. Passwords are stored only as
argon2 hashes; a login session is stored only as the SHA-256 of its cookie value, so a leaked
database opens no session.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, utcnow

ROLES = ("viewer", "member", "admin")
"""Weakest first: a role can do everything the ones before it can."""


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    email: Mapped[str] = mapped_column(String(320), unique=True, doc="Lower-cased; the login name.")
    password_hash: Mapped[str] = mapped_column(String(255), doc="argon2id, with its parameters (argon2-cffi's encoded form).")
    role: Mapped[str] = mapped_column(String(16), doc="viewer, member or admin.")
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, doc="A disabled user can neither log in nor use its tokens.")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_login_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class LoginSession(Base):
    """One browser's login; the cookie holds a random value, the table only its SHA-256."""

    __tablename__ = "user_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
