"""Accounts: users, passwords, login sessions, and who may do what.

- Passwords are hashed with argon2id (argon2-cffi) at OWASP's minimum cost (19 MiB, 2 passes,
  1 lane); a hash made with older parameters is upgraded at the next login.
- A login session is a random cookie value; only its SHA-256 is stored, so logout and
  disabling a user end it at once.
- `Principal` is who a request acts as: a user by session or token, the one user of local mode,
  or nobody. `ACTIONS` says which role, and which token scope, each action needs.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy.orm import Session

from backend.models import ROLES, User, utcnow
from backend.services.errors import DomainError, FieldError
from backend.store import accounts as store

HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
MIN_PASSWORD = 8
MAX_PASSWORD = 1024
ROLE_RANK = {role: i for i, role in enumerate(ROLES)}

ACTIONS: dict[str, tuple[str, str | None]] = {
    "read": ("viewer", None),
    "submit": ("member", "submit"),
    "cancel": ("member", "submit"),
    "upload": ("member", "upload"),
    "series": ("member", "upload"),
    "tokens": ("member", "admin"),  # a token minting tokens would escape its own scopes
    "admin": ("admin", "admin"),
}
"""action → (the weakest role allowed, the scope a token needs for it; None: any token)."""


class AccountError(FieldError):
    """A user could not be created or changed; the message names the field (422)."""


class LoginFailed(PermissionError):
    pass


class Forbidden(DomainError, PermissionError):
    """The principal is known but may not do this (403; a page route renders the error page)."""

    status_code = 403
    page_title = "Not allowed"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    via: str
    """anonymous, local, session or token."""
    role: str | None = None
    user_id: int | None = None
    email: str | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)
    """A token's scopes; sessions and local mode are not limited by scope."""

    @property
    def authenticated(self) -> bool:
        return self.role is not None

    @property
    def name(self) -> str:
        return self.email or ("local user" if self.via == "local" else "anonymous")

    def may(self, action: str) -> bool:
        """Whether this principal's role (and token scopes) allow `action`."""
        role, scope = ACTIONS[action]
        if self.role is None or ROLE_RANK[self.role] < ROLE_RANK[role]:
            return False
        return self.via != "token" or scope is None or scope in self.scopes or "admin" in self.scopes

    def owns(self, user_id: int | None) -> bool:
        """Whether this principal may act on something `user_id` made (admins and local mode on anything)."""
        return self.role == "admin" or self.via == "local" or (self.user_id is not None and self.user_id == user_id)


ANONYMOUS = Principal(via="anonymous")
LOCAL = Principal(via="local", role="admin")
"""Local mode's one user: everything, no login (as before accounts)."""


def require(principal: Principal, action: str) -> None:
    """Raise Forbidden unless `principal` may do `action`."""
    if principal.may(action):
        return
    role, scope = ACTIONS[action]
    if principal.role is not None and ROLE_RANK[principal.role] >= ROLE_RANK[role] and principal.via == "token":
        raise Forbidden(f"the token lacks the {scope!r} scope")
    raise Forbidden(f"this needs the {role} role; {principal.name} is {principal.role or 'not logged in'}")


# ---- users ----


def normalise_email(email: str) -> str:
    email = email.strip().lower()
    if len(email) > 320 or not EMAIL.match(email):
        raise AccountError("email", f"{email[:80]!r} is not an email address")
    return email


def check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise AccountError("password", f"must be at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise AccountError("password", f"must be at most {MAX_PASSWORD} characters")


def create_user(*, session: Session, email: str, password: str, role: str) -> User:
    """A new enabled user (caller commits); the email must be new, the password long enough."""
    email = normalise_email(email)
    if role not in ROLES:
        raise AccountError("role", f"must be one of {', '.join(ROLES)}; got {role!r}")
    check_password(password)
    if store.find_user(session, email) is not None:
        raise AccountError("email", f"{email} already has an account")
    return store.add_user(session, email=email, password_hash=HASHER.hash(password), role=role)


def list_users(*, session: Session) -> list[User]:
    return store.list_users(session)


def get_user(*, session: Session, user_id: int) -> User | None:
    return store.get_user(session, user_id)


def find_user(*, session: Session, email: str) -> User:
    user = store.find_user(session, email.strip().lower())
    if user is None:
        raise AccountError("email", f"no user {email!r}")
    return user


def user_filter(*, session: Session, email: str | None) -> int | None:
    """A list filter's user id from an email (None: no filter; an unknown email matches nobody)."""
    if not email or not email.strip():
        return None
    user = store.find_user(session, email.strip().lower())
    return user.id if user else -1


def set_disabled(*, session: Session, user: User, disabled: bool) -> User:
    """Disable (or enable) a user; disabling ends its sessions, and its tokens stop working (caller commits)."""
    user.disabled = disabled
    if disabled:
        store.delete_user_sessions(session, user.id)
    return user


def seed_admin(*, session: Session, email: str, password: str) -> User | None:
    """The env-seeded admin of a compose deployment: created once, when no user has `email` (caller commits)."""
    if store.find_user(session, normalise_email(email)) is not None:
        return None
    return create_user(session=session, email=email, password=password, role="admin")


# ---- login ----

_DUMMY_HASH = HASHER.hash("not a real password")


def authenticate(*, session: Session, email: str, password: str) -> User:
    """The enabled user with these credentials (caller commits: the login time and any rehash are written)."""
    user = store.find_user(session, email.strip().lower())
    try:
        HASHER.verify(user.password_hash if user else _DUMMY_HASH, password)  # the same work for unknown emails
    except (VerificationError, InvalidHashError):
        user = None
    if user is None or user.disabled:
        raise LoginFailed("wrong email or password, or the account is disabled")
    if HASHER.check_needs_rehash(user.password_hash):
        user.password_hash = HASHER.hash(password)
    user.last_login_at = utcnow()
    return user


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def start_session(*, session: Session, user: User, max_age_s: int) -> str:
    """A new login session for `user`; returns the cookie value (only its hash is stored; caller commits)."""
    now = utcnow()
    store.delete_expired_sessions(session, now)
    cookie = secrets.token_urlsafe(32)
    store.add_login_session(session, id_hash=_hash(cookie), user_id=user.id, expires_at=now + timedelta(seconds=max_age_s))
    return cookie


def end_session(*, session: Session, cookie: str) -> None:
    store.delete_login_session(session, _hash(cookie))


def session_principal(*, session: Session, cookie: str, now: datetime | None = None) -> Principal | None:
    """The principal of a live login session (None for an unknown, expired or disabled one)."""
    found = store.find_login_session(session, _hash(cookie), now or utcnow())
    if found is None:
        return None
    _, user = found
    return Principal(via="session", role=user.role, user_id=user.id, email=user.email)
