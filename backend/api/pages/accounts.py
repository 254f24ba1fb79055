"""Pages of accounts: log in and out, one's API tokens, and (admins) the users.

Every form carries the CSRF token; the login cookie is HttpOnly, SameSite=Lax (a link from
elsewhere still arrives logged in; a cross-site POST never carries it) and Secure off loopback.
"""

from __future__ import annotations

import math

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from backend.api import csrf
from backend.api.deps import SESSION_COOKIE, AdminDep, CurrentUser, RowId, SessionDep, SettingsDep, TokenHolderDep
from backend.api.pages.forms import CheckedFormDep, FormDep
from backend.api.pages.rendering import render, secure_cookies
from backend.config import Settings
from backend.models import ROLES, User
from backend.services import auth as auth_service
from backend.services import login_guard
from backend.services import tokens as token_service
from backend.services.auth import AccountError, Forbidden, LoginFailed, Principal

router = APIRouter(include_in_schema=False)


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this site only (never `//host` or a URL)."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


# ---- login, logout ----


def login_page(
    request: Request, settings: Settings, *, next_url: str, error: str | None = None, email: str = "", status_code: int = 200
) -> HTMLResponse:
    return render(request, "login.html", {"next": next_url, "error": error, "email": email}, settings=settings, status_code=status_code)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, settings: SettingsDep, principal: CurrentUser, next: str | None = None) -> Response:  # noqa: A002
    if principal.via == "session":
        return RedirectResponse(safe_next(next), status_code=303)
    return login_page(request, settings, next_url=safe_next(next))


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, form: FormDep, session: SessionDep, settings: SettingsDep) -> Response:
    """Log in. Failed tries are slowed, then locked out for a while (429 with Retry-After, the
    password not even looked at), per account, per address and per known device (login_guard)."""
    email, password = str(form.get("email") or ""), str(form.get("password") or "")
    next_url = safe_next(str(form.get("next") or "/"))
    try:
        csrf.verify(request, form.get(csrf.FIELD), settings.security.secret_key)  # type: ignore[arg-type]
    except csrf.CSRFError as exc:
        return login_page(request, settings, next_url=next_url, error=str(exc), email=email, status_code=403)
    guard = login_guard.login_guard(settings)
    device = login_guard.device_of(settings.security.secret_key, request.cookies.get(login_guard.DEVICE_COOKIE), email)
    attempt = login_guard.Attempt(email=email, ip=request.client.host if request.client else "?", device=device)
    ticket = guard.admit(attempt)  # its place in the counts, taken before the password is looked at
    if ticket.wait_s > 0:
        return throttled(request, settings, next_url=next_url, email=email, wait_s=ticket.wait_s)
    try:
        user = auth_service.authenticate(session=session, email=email, password=password)
    except LoginFailed as exc:
        guard.failed(ticket)
        return login_page(request, settings, next_url=next_url, error=str(exc), email=email, status_code=401)
    guard.succeeded(ticket)
    if old := request.cookies.get(SESSION_COOKIE):  # a new login never keeps a session someone else may have set
        auth_service.end_session(session=session, cookie=old)
    cookie = auth_service.start_session(session=session, user=user, max_age_s=settings.security.session_max_age_s)
    session.commit()
    response = RedirectResponse(next_url, status_code=303)
    secure = secure_cookies(request, settings)
    response.set_cookie(
        SESSION_COOKIE, cookie, max_age=settings.security.session_max_age_s, httponly=True, samesite="lax", secure=secure, path="/"
    )
    response.set_cookie(
        login_guard.DEVICE_COOKIE,
        login_guard.issue_device(settings.security.secret_key, user.email, device),
        max_age=login_guard.DEVICE_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=secure,
        path="/login",
    )
    return response


def throttled(request: Request, settings: Settings, *, next_url: str, email: str, wait_s: float) -> HTMLResponse:
    """429: too many failed logins for this account or address; try again in `wait_s`."""
    seconds = max(1, math.ceil(wait_s))
    response = login_page(
        request,
        settings,
        next_url=next_url,
        error=f"too many failed logins; try again in {seconds} s (an admin can lift a lockout)",
        email=email,
        status_code=429,
    )
    response.headers["Retry-After"] = str(seconds)
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, settings: SettingsDep, form: CheckedFormDep) -> RedirectResponse:
    if cookie := request.cookies.get(SESSION_COOKIE):
        auth_service.end_session(session=session, cookie=cookie)
        session.commit()
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=secure_cookies(request, settings))
    return response


# ---- tokens ----


def tokens_page(
    request: Request,
    session: SessionDep,
    settings: Settings,
    principal: Principal,
    *,
    new_token: str | None = None,
    error: str | None = None,
) -> HTMLResponse:
    everyone = principal.may("admin")
    tokens = token_service.list_tokens(session=session, user_id=None if everyone else principal.user_id)
    allowed = [
        s
        for s in token_service.SCOPES
        if auth_service.ROLE_RANK[principal.role or "viewer"] >= auth_service.ROLE_RANK[token_service.SCOPE_ROLE[s]]
    ]
    return render(
        request,
        "tokens.html",
        {"tokens": tokens, "new_token": new_token, "error": error, "scopes": allowed, "everyone": everyone},
        settings=settings,
        status_code=422 if error else 200,
    )


@router.get("/tokens", response_class=HTMLResponse)
def tokens(request: Request, session: SessionDep, settings: SettingsDep, principal: TokenHolderDep) -> HTMLResponse:
    return tokens_page(request, session, settings, principal)


@router.post("/tokens", response_class=HTMLResponse)
def create_token(
    request: Request, session: SessionDep, settings: SettingsDep, principal: TokenHolderDep, form: CheckedFormDep
) -> HTMLResponse:
    """Create a token for oneself; the page shows it once (it is not kept: only its hash is)."""
    if principal.user_id is None:
        return tokens_page(request, session, settings, principal, error="local mode has no user to own a token: `parallab user create` one")
    user = auth_service.get_user(session=session, user_id=principal.user_id)
    try:
        token = token_service.create_token(session=session, name=str(form.get("name") or "token"), scopes=form.getlist("scope"), user=user)  # type: ignore[arg-type]
    except ValueError as exc:
        return tokens_page(request, session, settings, principal, error=f"scope: {exc}")
    session.commit()
    return tokens_page(request, session, settings, principal, new_token=token)


@router.post("/tokens/{token_id}/revoke")
def revoke_token(
    request: Request, token_id: RowId, session: SessionDep, settings: SettingsDep, principal: TokenHolderDep, form: CheckedFormDep
) -> RedirectResponse:
    try:
        token_service.revoke_token(session=session, token_id=token_id, principal=principal)
    except LookupError as exc:
        raise HTTPException(404, detail=str(exc)) from None
    session.commit()
    return RedirectResponse("/tokens", status_code=303)


# ---- users (admins) ----


def users_page(
    request: Request, session: SessionDep, settings: Settings, *, error: str | None = None, created: str | None = None
) -> HTMLResponse:
    return render(
        request,
        "users.html",
        {"users": auth_service.list_users(session=session), "roles": ROLES, "error": error, "created": created},
        settings=settings,
        status_code=422 if error else 200,
    )


@router.get("/users", response_class=HTMLResponse)
def users(request: Request, session: SessionDep, settings: SettingsDep, _: AdminDep) -> HTMLResponse:
    return users_page(request, session, settings)


@router.post("/users", response_class=HTMLResponse)
def create_user(request: Request, session: SessionDep, settings: SettingsDep, _: AdminDep, form: CheckedFormDep) -> HTMLResponse:
    try:
        user = auth_service.create_user(
            session=session,
            email=str(form.get("email") or ""),
            password=str(form.get("password") or ""),
            role=str(form.get("role") or "member"),
        )
    except AccountError as exc:
        return users_page(request, session, settings, error=str(exc))
    session.commit()
    return users_page(request, session, settings, created=user.email)


def user_or_404(session: Session, user_id: int) -> User:
    """The user an admin's form acts on, or a 404 naming the id."""
    user = auth_service.get_user(session=session, user_id=user_id)
    if user is None:
        raise HTTPException(404, detail=f"no user {user_id}")
    return user


@router.post("/users/{user_id}/unlock")
def unlock_user(
    request: Request, user_id: RowId, session: SessionDep, settings: SettingsDep, _: AdminDep, form: CheckedFormDep
) -> RedirectResponse:
    """Lift a user's login lockout now (and forget its failed logins)."""
    user = user_or_404(session, user_id)
    login_guard.login_guard(settings).unlock(email=user.email)
    return RedirectResponse("/users", status_code=303)


@router.post("/users/{user_id}/disable")
def disable_user(
    request: Request, user_id: RowId, session: SessionDep, settings: SettingsDep, principal: AdminDep, form: CheckedFormDep
) -> RedirectResponse:
    """Disable (or, with enable=1, enable again) a user; an admin cannot disable itself."""
    user = user_or_404(session, user_id)
    if user.id == principal.user_id:
        raise Forbidden("you cannot disable yourself")
    auth_service.set_disabled(session=session, user=user, disabled=form.get("enable") != "1")
    session.commit()
    return RedirectResponse("/users", status_code=303)
