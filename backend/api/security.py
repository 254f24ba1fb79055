"""What every request passes before it is routed, and what every response carries.

One pure ASGI middleware, in this order:

1. **Local mode** is decided for the request from the real bind (`bind.request_is_local`) and
   left in `scope["state"]["local_mode"]` for `deps.LocalModeDep`; nothing else decides it.
2. **The placeholder secret** is refused off loopback: every request gets 503 until
   `PARALLAB_SECRET_KEY` is set (start-up also fails, see `lifespan`).
3. **NUL bytes** in the path, the query string or a header are refused (422): Postgres can store
   none, and every value reaches a query somewhere.
4. **DNS rebinding**: in local mode the `Host` header must name a loopback address (or the very
   address the connection arrived on) with the bound port. A page that rebinds its own name to
   127.0.0.1 sends its own name, and is refused (421).
5. **Cross-site requests**: in local mode a state-changing request without a Bearer token must
   be same-origin. A browser sends `Origin` with every POST (and `Referer` unless told not to);
   either must name this very origin, and `Origin: null` never does. A request with neither is
   not a browser page's (curl, scripts), so it cannot be a forgery; the pages' own forms carry a
   CSRF token too (`csrf`). JSON bodies need no special case: a cross-site page can't send one
   without a CORS preflight, which this app never grants.
6. **Headers** on every response: a CSP without inline scripts (figures travel as
   `<script type="application/json">`, which a CSP does not execute), `frame-ancestors 'none'`,
   `X-Content-Type-Options: nosniff`, `Referrer-Policy: same-origin`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from backend.api.bind import LOOPBACK_NAMES, request_is_local
from backend.config import PLACEHOLDER_SECRET, Settings, get_settings

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The pages' policy. Styles may be inline: plotly.js sets SVG `style` attributes as it draws."""

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


def settings_for(scope: Scope) -> Settings:
    """The app's settings, honouring a test's `dependency_overrides` as the routes do."""
    app = scope.get("app")
    overrides = getattr(app, "dependency_overrides", {}) if app is not None else {}
    return overrides.get(get_settings, get_settings)()


def inline_script_hashes(html: str) -> list[str]:
    """CSP source expressions ('sha256-…') for each inline <script> in `html`."""
    out = []
    for body in re.findall(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", html, flags=re.S):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        out.append(f"'sha256-{digest}'")
    return out


def docs_csp(html: str) -> str:
    """The policy of the /docs and /redoc pages: their assets from this host (routes.docs serves
    them), and exactly the inline scripts this very page carries (by hash), nothing else inline.
    Images from this host only: ReDoc's bundle links its "powered by" logo from its CDN, which the
    browser then never asks for (the docs make no request off the host)."""
    hashes = " ".join(inline_script_hashes(html))
    return (
        f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; font-src 'self' data:; "
        "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    )


def _refusal(status: int, message: str, *, loc: list[str] | None = None) -> tuple[int, bytes]:
    detail: Any = [{"loc": loc, "msg": message, "type": "value_error"}] if loc is not None else message
    return status, json.dumps({"detail": detail}).encode()


def _host_port(value: str, default_port: int) -> tuple[str, int] | None:
    """('127.0.0.1', 8000) from '127.0.0.1:8000'; None when it does not parse."""
    try:
        parts = urlsplit(f"//{value}")
        return (parts.hostname or "").lower(), parts.port or default_port
    except ValueError:
        return None


def host_problem(host: str | None, scope: Scope) -> str | None:
    """Why this Host header is refused in local mode, or None."""
    if not host:
        return "a Host header is required"
    default_port = 443 if scope.get("scheme") in ("https", "wss") else 80
    parsed = _host_port(host, default_port)
    server = scope.get("server") or (None, None)
    allowed = LOOPBACK_NAMES | ({server[0].lower()} if isinstance(server[0], str) else set())
    if parsed is None or parsed[0] not in allowed:
        return f"Host {host!r} is not this server's loopback address; local mode serves only {', '.join(sorted(LOOPBACK_NAMES))}"
    if isinstance(server[1], int) and parsed[1] != server[1]:
        return f"Host {host!r} names port {parsed[1]}, but this server listens on {server[1]}"
    return None


def _origin_of(url: str) -> tuple[str, str] | None:
    """(scheme, host:port) of a URL, ports made explicit; None for 'null' or junk."""
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return parts.scheme, f"{parts.hostname.lower()}:{port}"


def cross_site_problem(headers: dict[str, str], scope: Scope) -> str | None:
    """Why a state-changing request is refused as cross-site in local mode, or None."""
    if headers.get("authorization", "").lower().startswith("bearer "):
        return None  # a page on another origin cannot set this header without a preflight
    default_port = 443 if scope.get("scheme") == "https" else 80
    parsed = _host_port(headers.get("host", ""), default_port)
    own = f"{parsed[0]}:{parsed[1]}" if parsed else None
    for header in ("origin", "referer"):
        value = headers.get(header)
        if value is None:
            continue
        origin = _origin_of(value)
        if origin is None or origin[1] != own:
            return f"cross-site request refused: {header.title()} {value[:200]!r} is not this server's origin"
        return None
    return None


def nul_problem(scope: Scope) -> tuple[list[str], str] | None:
    """(loc, message) of a NUL byte in the path, the query string or a header; None when clean."""
    if "\x00" in scope.get("path", ""):
        return ["path"], "the path must not contain a NUL byte"
    query = scope.get("query_string", b"")
    if b"%00" in query or b"\x00" in query:
        for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                return ["query", name.replace("\x00", "\\x00")], "must not contain a NUL byte"
    for name, value in scope.get("headers", ()):
        if b"\x00" in value:
            return ["header", name.decode("latin-1")], "must not contain a NUL byte"
    return None


class SecurityMiddleware:
    """See the module docstring. `docs_paths` (FastAPI's /docs, /redoc) carry inline scripts of
    their own; their policy allows exactly those, hashed from the page as it is sent."""

    def __init__(self, app: ASGIApp, *, docs_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.docs_paths = frozenset(docs_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = settings_for(scope)
        local = request_is_local(scope, settings)
        scope.setdefault("state", {})["local_mode"] = local
        if scope.get("path") in self.docs_paths:
            send = _with_docs_policy(send)
        else:
            send = _with_headers(send, ((b"content-security-policy", PAGE_CSP.encode()),))
        send = _with_headers(send, SECURITY_HEADERS)

        refusal = self.refusal(scope, settings, local)
        if refusal is not None:
            status, body = refusal
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    @staticmethod
    def refusal(scope: Scope, settings: Settings, local: bool) -> tuple[int, bytes] | None:
        """(status, JSON body) when the request must not reach the app."""
        if not local and settings.security.secret_key == PLACEHOLDER_SECRET:
            return _refusal(
                503, "PARALLAB_SECRET_KEY still holds its placeholder; this server refuses to serve beyond loopback until it is set"
            )
        nul = nul_problem(scope)
        if nul is not None:
            return _refusal(422, nul[1], loc=nul[0])
        if not local:
            return None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        problem = host_problem(headers.get("host"), scope)
        if problem is not None:
            return _refusal(421, problem)
        if scope.get("method", "GET") not in SAFE_METHODS:
            problem = cross_site_problem(headers, scope)
            if problem is not None:
                return _refusal(403, problem)
        return None


def _with_headers(send: Send, headers: tuple[tuple[bytes, bytes], ...]) -> Send:
    """`send`, adding each header the response does not set itself."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {k.lower() for k, _ in message.get("headers", ())}
            message["headers"] = [*message.get("headers", ()), *((k, v) for k, v in headers if k not in present)]
        await send(message)

    return wrapped


def _with_docs_policy(send: Send) -> Send:
    """`send` for a docs page: the body is held (a few KB) until its inline scripts are hashed."""
    start: Message | None = None
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
            return
        if message["type"] == "http.response.body" and start is not None:
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            policy = docs_csp(body.decode("utf-8", "replace"))
            start["headers"] = [*start.get("headers", ()), (b"content-security-policy", policy.encode())]
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return wrapped
