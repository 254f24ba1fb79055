"""CSRF protection for the HTML forms: a double-submit cookie whose value the form carries signed,
bound to the login session.

The cookie holds a random nonce (HttpOnly, SameSite=Strict); each form carries the nonce and a
digest of the login session's cookie, signed with `settings.security.secret_key` (itsdangerous,
timestamped). A POST is accepted only when the signed field verifies, is fresh, names the nonce in
this browser's cookie and the login session the request carries — a page on another origin can
neither read the cookie nor forge the signature, and a token taken from one session (another
user's page, a session since ended) is refused in any other. A form shown before logging in is
bound to no session: it works until the browser logs in, then the page is reloaded with a new token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException, Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

COOKIE = "parallab_csrf"
FIELD = "csrf_token"
MAX_AGE_S = 12 * 3600
SESSION_COOKIE = "parallab_session"
"""The login session's cookie (deps.SESSION_COOKIE names the same)."""


class CSRFError(Exception):
    """The form did not carry a valid token for this browser."""


def _serializer(secret_key: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret_key, salt="parallab-form-csrf")


def session_binding(request: Request) -> str:
    """A digest of the login session this request carries ("" when none): what a token is bound to."""
    session = request.cookies.get(SESSION_COOKIE)
    return hashlib.sha256(session.encode()).hexdigest()[:32] if session else ""


def issue(request: Request, secret_key: str) -> tuple[str, str]:
    """(nonce for the cookie, signed token for the form) — re-using this browser's nonce if it has
    one; the token is bound to the request's login session."""
    nonce = request.cookies.get(COOKIE) or secrets.token_urlsafe(24)
    return nonce, _serializer(secret_key).dumps({"n": nonce, "s": session_binding(request)})


def set_cookie(response: Response, nonce: str, *, secure: bool = False) -> None:
    response.set_cookie(COOKIE, nonce, httponly=True, samesite="strict", secure=secure, max_age=MAX_AGE_S, path="/")


def verify(request: Request, token: str | None, secret_key: str) -> None:
    """Raise CSRFError unless `token` is a fresh signature of this browser's cookie nonce and of the
    login session this request carries."""
    nonce = request.cookies.get(COOKIE)
    if not nonce or not token:
        raise CSRFError("missing CSRF token or cookie; reload the form and submit again")
    try:
        signed = _serializer(secret_key).loads(token, max_age=MAX_AGE_S)
    except BadSignature:
        raise CSRFError("invalid or expired CSRF token; reload the form and submit again") from None
    if not isinstance(signed, dict) or not hmac.compare_digest(str(signed.get("n")), nonce):
        raise CSRFError("CSRF token does not match this browser; reload the form and submit again")
    if not hmac.compare_digest(str(signed.get("s")), session_binding(request)):
        raise CSRFError("CSRF token belongs to another login session; reload the form and submit again")


def require_form_token(request: Request, form: Mapping[str, Any], secret_key: str) -> None:
    """A form POST's check for the routes that answer a bad token with a bare 403 (those that
    re-render their own page with the message call `verify` themselves)."""
    token = form.get(FIELD)
    try:
        verify(request, token if isinstance(token, str) else None, secret_key)
    except CSRFError as exc:
        raise HTTPException(403, detail=str(exc)) from None
