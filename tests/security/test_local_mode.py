"""Local mode against a hostile page: DNS rebinding (Host), cross-site forms (Origin/Referer),
the placeholder secret, and the security headers every response carries.

The app is served as a loopback server would see it: requests arrive on 127.0.0.1:8000.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.models import Run

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

LOOPBACK = "http://127.0.0.1:8000"
SPEC = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}}


@pytest.fixture
def local(settings: Settings):
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app, base_url=LOOPBACK) as client:
        yield client


def queued_run(client: TestClient) -> str:
    response = client.post("/api/v1/runs", json=SPEC)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def status_of(settings: Settings, run_id: str) -> str:
    with session_scope(settings.sqlalchemy_url) as session:
        return session.get(Run, run_id).status


# ---- DNS rebinding ----


@pytest.mark.parametrize("host", ["evil.example:8000", "evil.example", "127.0.0.1.nip.io:8000", "10.0.0.5:8000", "127.0.0.1:9999"])
def test_a_host_that_is_not_this_loopback_server_is_refused(local, host) -> None:
    response = local.get("/api/v1/runs", headers={"host": host})
    assert response.status_code == 421
    assert "Host" in response.json()["detail"]
    assert local.post("/api/v1/runs", json=SPEC, headers={"host": host}).status_code == 421


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000", "[::1]:8000"])
def test_the_loopback_names_are_served(local, host) -> None:
    assert local.get("/api/v1/runs", headers={"host": host}).status_code == 200


def test_outside_local_mode_any_host_is_served(local, settings) -> None:
    """A lab sits behind its own names and proxies; it has accounts instead."""
    settings.server.host, settings.security.secret_key = "0.0.0.0", "a-real-secret"
    answer = local.get("/api/v1/runs", headers={"host": "parallab.lab.example"})
    assert answer.status_code == 401, "served (no 421 for the name): accounts decide, and anonymous readers must log in"


@pytest.mark.parametrize(("host", "secure"), [("127.0.0.1", False), ("0.0.0.0", True)])
def test_the_csrf_cookie_is_secure_off_loopback_like_the_session_cookie(local, settings, host, secure) -> None:
    settings.server.host, settings.security.secret_key = host, "a-real-secret"
    cookie = local.get("/login").headers.get("set-cookie", "")
    assert "csrf" in cookie.lower() and ("secure" in cookie.lower()) == secure, cookie


# ---- cross-site requests ----


def test_a_cross_site_text_plain_post_does_not_cancel_a_run(local, settings) -> None:
    """The attack: <form method=post action=http://127.0.0.1:8000/api/v1/runs/ID/cancel enctype=text/plain>."""
    run_id = queued_run(local)
    for headers in (
        {"origin": "http://evil.example", "content-type": "text/plain"},
        {"origin": "null", "content-type": "text/plain"},
        {"referer": "http://evil.example/page.html", "content-type": "text/plain"},
        {"origin": "http://localhost:8000", "content-type": "application/x-www-form-urlencoded"},  # another origin
        {"origin": "http://127.0.0.1:3000"},
    ):
        response = local.post(f"/api/v1/runs/{run_id}/cancel", content=b"x=1", headers=headers)
        assert response.status_code == 403, headers
        assert "cross-site" in response.json()["detail"]
    assert status_of(settings, run_id) == "queued"


def test_a_cross_site_form_cannot_submit_a_run_either(local, settings) -> None:
    response = local.post("/runs/new", data={"strategy": "ddp", "world_size": "2"}, headers={"origin": "http://evil.example"})
    assert response.status_code == 403
    body = '{"workload": {"model": "tiny"}, "strategy": {"name": "ddp", "world_size": 2}}'
    response = local.post("/api/v1/runs", content=body, headers={"origin": "http://evil.example", "content-type": "text/plain"})
    assert response.status_code == 403
    with session_scope(settings.sqlalchemy_url) as session:
        assert session.query(Run).count() == 0


def test_same_origin_and_non_browser_requests_still_work(local, settings) -> None:
    first, second, third = queued_run(local), queued_run(local), queued_run(local)
    assert local.post(f"/api/v1/runs/{first}/cancel", headers={"origin": LOOPBACK}).status_code == 200
    assert local.post(f"/api/v1/runs/{second}/cancel", headers={"referer": f"{LOOPBACK}/runs/{second}"}).status_code == 200
    assert local.post(f"/api/v1/runs/{third}/cancel").status_code == 200  # curl: neither header
    assert {status_of(settings, i) for i in (first, second, third)} == {"cancelled"}


def test_a_bearer_token_is_not_a_cross_site_request(local, settings) -> None:
    """A page elsewhere cannot set Authorization without a CORS preflight, which is never granted;
    so the token alone decides (an invalid one is 401, not a cross-site refusal)."""
    run_id = queued_run(local)
    response = local.post(f"/api/v1/runs/{run_id}/cancel", headers={"origin": "http://evil.example", "authorization": "Bearer plb_x"})
    assert response.status_code == 401
    assert status_of(settings, run_id) == "queued"


def test_reads_need_no_origin(local) -> None:
    assert local.get("/api/v1/runs", headers={"origin": "http://evil.example"}).status_code == 200


# ---- the placeholder secret ----


def test_the_placeholder_secret_fails_start_up_when_configured_for_the_network(settings) -> None:
    settings.server.host = "0.0.0.0"
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with pytest.raises(RuntimeError, match="PARALLAB_SECRET_KEY still holds its placeholder"), TestClient(app):
        pass


def test_the_placeholder_secret_is_refused_for_every_request_off_loopback(local, settings) -> None:
    settings.server.host = "0.0.0.0"
    for response in (local.get("/api/v1/runs"), local.get("/"), local.get("/healthz"), local.post("/api/v1/runs", json=SPEC)):
        assert response.status_code == 503
        assert "PARALLAB_SECRET_KEY" in response.json()["detail"]


# ---- headers ----


@pytest.mark.parametrize("path", ["/", "/runs/new", "/leaderboard", "/api/v1/runs", "/static/app.css", "/vendor/plotly.min.js", "/nope"])
def test_every_response_carries_the_security_headers(local, path) -> None:
    response = local.get(path)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "same-origin"
    assert response.headers["x-frame-options"] == "DENY"


def test_refusals_carry_the_headers_too(local) -> None:
    response = local.get("/api/v1/runs", headers={"host": "evil.example"})
    assert response.status_code == 421 and "frame-ancestors 'none'" in response.headers["content-security-policy"]


def test_the_pages_have_no_inline_script_for_the_policy_to_block(local) -> None:
    import re

    for path in ("/", "/runs/new", "/leaderboard", "/scaling", "/compare"):
        html = local.get(path).text
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag or 'type="application/json"' in tag, (path, tag)
        assert not re.search(r"\son[a-z]+=", html), path  # no inline event handlers


def test_the_api_docs_allow_exactly_their_own_inline_script(local) -> None:
    from backend.api.security import inline_script_hashes

    response = local.get("/docs")
    csp = response.headers["content-security-policy"]
    hashes = inline_script_hashes(response.text)
    assert hashes and all(h in csp for h in hashes)
    assert "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
