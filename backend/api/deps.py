"""FastAPI dependencies as named aliases (SessionDep, SettingsDep, ...); tests override them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status
from sqlalchemy.orm import Session

from backend.config import Settings, get_settings
from backend.db import get_sessionmaker
from backend.services.tokens import TokenError, check_token

SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    """One session per request; routes commit explicitly, anything left is rolled back."""
    session = get_sessionmaker(settings.sqlalchemy_url)()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def local_mode(request: Request) -> bool:
    """Whether this request is served in local mode, as the security middleware decided it from the
    real bind (`backend.api.bind`); False when no middleware decided (fail closed)."""
    return bool(getattr(request.state, "local_mode", False))


LocalModeDep = Annotated[bool, Depends(local_mode)]


def bearer_token(authorization: Annotated[str | None, Header()] = None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def require_scope(scope: str, *, local_mode_allows: bool = False) -> Callable[..., None]:
    """A dependency that demands a token with `scope` (waived in local mode where allowed)."""

    def dependency(session: SessionDep, local: LocalModeDep, token: Annotated[str | None, Depends(bearer_token)]) -> None:
        if local_mode_allows and local and token is None:
            return
        try:
            check_token(session=session, token=token, scope=scope)
        except TokenError as exc:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail=str(exc), headers={"WWW-Authenticate": "Bearer"}) from None

    return dependency


CanSubmit = Depends(require_scope("submit", local_mode_allows=True))
CanUpload = Depends(require_scope("upload"))
