"""CSRF protection for the HTML forms: a double-submit cookie whose value the form carries signed.

The cookie holds a random nonce (HttpOnly, SameSite=Strict); each form carries the nonce signed
with `settings.secret_key` (itsdangerous, timestamped). A POST is accepted only when the signed
field verifies, is fresh, and names the nonce in this browser's cookie — a page on another origin
can neither read the cookie nor forge the signature.
"""

from __future__ import annotations

import hmac
import secrets

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

COOKIE = "parallab_csrf"
FIELD = "csrf_token"
MAX_AGE_S = 12 * 3600


class CSRFError(Exception):
    """The form did not carry a valid token for this browser."""


def _serializer(secret_key: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret_key, salt="parallab-form-csrf")


def issue(request: Request, secret_key: str) -> tuple[str, str]:
    """(nonce for the cookie, signed token for the form) — re-using this browser's nonce if it has one."""
    nonce = request.cookies.get(COOKIE) or secrets.token_urlsafe(24)
    return nonce, _serializer(secret_key).dumps(nonce)


def set_cookie(response: Response, nonce: str, *, secure: bool = False) -> None:
    response.set_cookie(COOKIE, nonce, httponly=True, samesite="strict", secure=secure, max_age=MAX_AGE_S, path="/")


def verify(request: Request, token: str | None, secret_key: str) -> None:
    """Raise CSRFError unless `token` is a fresh signature of this browser's cookie nonce."""
    nonce = request.cookies.get(COOKIE)
    if not nonce or not token:
        raise CSRFError("missing CSRF token or cookie; reload the form and submit again")
    try:
        signed = _serializer(secret_key).loads(token, max_age=MAX_AGE_S)
    except BadSignature:
        raise CSRFError("invalid or expired CSRF token; reload the form and submit again") from None
    if not hmac.compare_digest(str(signed), nonce):
        raise CSRFError("CSRF token does not match this browser; reload the form and submit again")
