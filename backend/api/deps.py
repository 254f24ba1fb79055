"""FastAPI dependencies as named aliases (SessionDep, SettingsDep, CurrentUser, ...); tests override them.

Who a request acts as: a Bearer token's user, else a login session's user, else —
in local mode only — the one local user, else nobody. `gate` runs before every route (the app
installs it globally), so a new route is closed to anonymous callers outside local mode unless
it is named in `PUBLIC_PATHS`; routes that need more than reading say so with `require(action)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from backend.api import csrf
from backend.config import Settings, get_settings
from backend.db import get_sessionmaker
from backend.services import auth
from backend.services.auth import ANONYMOUS, LOCAL, Forbidden, Principal
from backend.services.tokens import TokenError, token_principal
from parallab.core.bounds import INT32_MAX

SettingsDep = Annotated[Settings, Depends(get_settings)]
SESSION_COOKIE = csrf.SESSION_COOKIE
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_PATHS = frozenset({"/login", "/logout", "/healthz", "/vendor/plotly.min.js", "/api/v1/results/schema"})
"""Routes anyone may call, logged in or not (the static files are a mount, outside the routes)."""


def get_session(settings: SettingsDep) -> Iterator[Session]:
    """One session per request; routes commit explicitly, anything left is rolled back."""
    session = get_sessionmaker(settings.sqlalchemy_url)()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]
RowId = Annotated[int, Path(ge=1, le=INT32_MAX, description="A row's integer id (32-bit).")]
"""An integer id in a URL path: bounded to its column, so 2**80 is a 422, never a database error."""


BEARER = HTTPBearer(auto_error=False, description="An API token (`parallab token create`, or the Tokens page).")


def local_mode(request: Request) -> bool:
    """Whether this request is served in local mode, as the security middleware decided it from the
    real bind (`backend.api.bind`) and the settings; False when no middleware decided (fail closed)."""
    return bool(getattr(request.state, "local_mode", False))


LocalModeDep = Annotated[bool, Depends(local_mode)]


def bearer_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> str | None:
    """The Bearer token, if the request sent one (a security scheme, so OpenAPI lists it once, not per route)."""
    return credentials.credentials.strip() if credentials else None


class LoginRequired(Exception):
    """A page was asked for without a login outside local mode: the handler redirects to /login."""

    def __init__(self, next_url: str):
        self.next_url = next_url
        super().__init__(next_url)


API_LIKE_PATHS = frozenset({"/metrics", "/openapi.json"})
"""Outside /api/ but read by programs (Prometheus, API clients): refused with 401, never a redirect to /login."""

DOCS_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""The API's documentation (routes.docs): open to anyone only where `docs_public` says so."""


def is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/") or request.url.path in API_LIKE_PATHS


def current_principal(
    request: Request, session: SessionDep, local: LocalModeDep, token: Annotated[str | None, Depends(bearer_token)]
) -> Principal:
    """Who this request acts as (a bad token is 401 at once, local mode or not); the local user only
    where the security middleware decided this request is served in local mode."""
    if token is not None:
        try:
            principal = token_principal(session=session, token=token)
        except TokenError as exc:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail=str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
    elif (cookie := request.cookies.get(SESSION_COOKIE)) and (found := auth.session_principal(session=session, cookie=cookie)):
        principal = found
    elif local:
        principal = LOCAL
    else:
        principal = ANONYMOUS
    request.state.principal = principal
    return principal


CurrentUser = Annotated[Principal, Depends(current_principal)]


def deny(request: Request, principal: Principal, reason: str) -> None:
    """Refuse: log in first (401, or a redirect for pages) when anonymous, else 403."""
    if not principal.authenticated:
        if is_api(request):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, detail="log in or send a Bearer token", headers={"WWW-Authenticate": "Bearer"}
            )
        raise LoginRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    raise Forbidden(reason)


def _settings(request: Request) -> Settings:
    """The app's settings, honouring a test's override (gate runs before any route's SettingsDep)."""
    settings: Settings = request.app.dependency_overrides.get(get_settings, get_settings)()
    return settings


def gate(request: Request, principal: CurrentUser) -> None:
    """Every route: reading needs a login outside local mode (public paths aside); an API write made
    with a login session, not a token, must carry the page's CSRF token in the X-CSRF-Token header."""
    if request.url.path in PUBLIC_PATHS:
        return
    if request.url.path in DOCS_PATHS and _settings(request).security.docs_public:
        return
    if not principal.may("read"):
        deny(request, principal, "this needs a login")
    if principal.via == "session" and is_api(request) and request.method not in SAFE_METHODS:
        try:
            csrf.verify(request, request.headers.get(CSRF_HEADER), _settings(request).security.secret_key)
        except csrf.CSRFError as exc:
            raise Forbidden(f"{CSRF_HEADER}: {exc}") from None


def require(action: str, *, token_only: bool = False) -> Callable[..., Principal]:
    """A dependency that lets through only principals who may do `action` (see services.auth.ACTIONS)."""

    def dependency(request: Request, principal: CurrentUser) -> Principal:
        if token_only and principal.via != "token":
            if principal.authenticated and principal.via != "local" or not is_api(request):
                raise Forbidden(f"{action} needs a Bearer token")
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="a Bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        try:
            auth.require(principal, action)
        except Forbidden as exc:
            deny(request, principal, str(exc))
        return principal

    return dependency


CanSubmit = Depends(require("submit"))
CanUpload = Depends(require("upload", token_only=True))
SubmitterDep = Annotated[Principal, Depends(require("submit"))]
CancellerDep = Annotated[Principal, Depends(require("cancel"))]
UploaderDep = Annotated[Principal, Depends(require("upload", token_only=True))]
SeriesEditorDep = Annotated[Principal, Depends(require("series"))]
TokenHolderDep = Annotated[Principal, Depends(require("tokens"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]
