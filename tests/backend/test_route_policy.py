"""Every route of the app against every kind of caller (issue #11), outside local mode.

`POLICY` holds one decision per (method, path): what a caller must be allowed to do to get past
the route's checks. A route added to the app without a decision here fails
`test_every_route_has_a_decision`; each decision is then tried with each caller below, and the
answer must be a refusal (401, 403, or a redirect to the login page) exactly when the caller's
row in `ALLOWED` lacks the decision. `ALLOWED` is written out by hand, not derived from the code
under test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from starlette.routing import Mount

from backend.api import csrf
from backend.api.app import create_app
from backend.api.deps import CSRF_HEADER, SESSION_COOKIE
from backend.config import Settings, get_settings
from backend.db import get_sessionmaker, session_scope
from backend.migrate import upgrade
from backend.models import Sweep
from backend.services import auth, tokens
from backend.services import runs as run_service
from backend.services.uploads import upload_results
from parallab.core.result import ResultDocument
from parallab.core.spec import JobSpec
from tests.backend.ci_documents import document, slowed

POLICY: dict[tuple[str, str], str] = {
    # The API's documentation: behind the login in a lab unless docs_public (test_docs_public_opens_them).
    ("GET", "/openapi.json"): "read",
    ("GET", "/docs"): "read",
    ("GET", "/docs/oauth2-redirect"): "read",
    ("GET", "/redoc"): "read",
    ("GET", "/healthz"): "public",
    ("GET", "/vendor/plotly.min.js"): "public",
    ("GET", "/login"): "public",
    ("POST", "/login"): "public",
    ("POST", "/logout"): "public",
    ("GET", "/api/v1/results/schema"): "public",
    # Reading.
    ("GET", "/api/v1/runs"): "read",
    ("GET", "/api/v1/runs/{run_id}"): "read",
    ("GET", "/api/v1/runs/{run_id}/trace"): "read",
    ("GET", "/api/v1/runs/{run_id}/flight-recorder"): "read",
    ("GET", "/api/v1/runs/{run_id}/timeline"): "read",
    ("GET", "/api/v1/runs/{run_id}/reproduction"): "read",
    ("GET", "/api/v1/plan"): "read",
    ("GET", "/api/v1/compare"): "read",
    ("GET", "/api/v1/leaderboard"): "read",
    ("GET", "/api/v1/series"): "read",
    ("GET", "/api/v1/series/{series_id}"): "read",
    ("GET", "/api/v1/series/{series_id}/report"): "read",
    ("GET", "/api/v1/me"): "read",
    ("GET", "/"): "read",
    ("GET", "/runs/new"): "read",
    ("GET", "/runs/new/plan.json"): "read",
    ("GET", "/runs/{run_id}"): "read",
    ("GET", "/runs/{run_id}/status.json"): "read",
    ("GET", "/watch.json"): "read",
    ("POST", "/runs/{run_id}/tags"): "cancel own run",
    ("GET", "/runs/{run_id}/timeline.json"): "read",
    ("GET", "/compare"): "read",
    ("GET", "/compare.json"): "read",
    ("GET", "/compare.csv"): "read",
    ("GET", "/leaderboard"): "read",
    ("GET", "/leaderboard.json"): "read",
    ("GET", "/leaderboard.csv"): "read",
    ("GET", "/scaling"): "read",
    ("GET", "/glossary"): "read",
    ("GET", "/series"): "read",
    ("GET", "/series/{series_id}"): "read",
    # The fleet (issue #13); Prometheus scrapes /metrics with any user's token outside local mode.
    ("GET", "/api/v1/workers"): "read",
    ("GET", "/workers"): "read",
    ("GET", "/metrics"): "read",
    # Planning and sweeps (issue #14): reading is reading; a sweep or a varied run is a submission,
    # and cancelling a sweep cancels runs, so it follows the rule for one run.
    ("GET", "/plan"): "read",
    ("GET", "/api/v1/sweeps"): "read",
    ("GET", "/api/v1/sweeps/{sweep_id}"): "read",
    ("GET", "/sweeps"): "read",
    ("GET", "/sweeps/new"): "read",
    ("GET", "/sweeps/{sweep_id}"): "read",
    ("POST", "/api/v1/sweeps"): "submit",
    ("POST", "/sweeps/new"): "submit",
    ("POST", "/runs/{run_id}/vary"): "submit",
    ("POST", "/api/v1/sweeps/{sweep_id}/cancel"): "cancel own run",
    ("POST", "/sweeps/{sweep_id}/cancel"): "cancel own run",
    # Running jobs: submit; cancel only one's own run (admins any).
    ("POST", "/api/v1/runs"): "submit",
    ("POST", "/runs/new"): "submit",
    # Reproducing an upload queues a lab run: a submission (any member's, of anyone's upload).
    ("POST", "/api/v1/runs/{run_id}/reproduce"): "submit",
    ("POST", "/runs/{run_id}/reproduce"): "submit",
    ("POST", "/api/v1/runs/{run_id}/cancel"): "cancel own run",
    ("POST", "/runs/{run_id}/cancel"): "cancel own run",
    # CI: uploads with a token; series settings and alert dismissals.
    ("POST", "/api/v1/results"): "upload",
    ("PATCH", "/api/v1/series/{series_id}"): "change own series",
    ("POST", "/api/v1/series/{series_id}/alerts/{verdict_id}/dismiss"): "change own series",
    ("POST", "/api/v1/series/{series_id}/accept"): "change own series",
    ("POST", "/series/{series_id}/alerts/{verdict_id}/dismiss"): "change own series",
    # One's own tokens; users (admins).
    ("GET", "/tokens"): "tokens",
    ("POST", "/tokens"): "tokens",
    ("POST", "/tokens/{token_id}/revoke"): "revoke own token",
    ("GET", "/users"): "admin",
    ("POST", "/users"): "admin",
    ("POST", "/users/{user_id}/disable"): "admin",
    ("POST", "/users/{user_id}/unlock"): "admin",
}

READ = {"public", "read"}
ALLOWED: dict[str, set[str]] = {
    "anonymous": {"public"},
    "viewer": READ,
    "member": READ | {"submit", "cancel own run", "change own series", "tokens", "revoke own token"},
    "other member": READ | {"submit", "tokens"},
    "admin": READ | {"submit", "cancel own run", "change own series", "tokens", "revoke own token", "admin"},
    "member's upload token": READ | {"upload", "change own series"},
    "member's submit token": READ | {"submit", "cancel own run"},
}
"""What each caller may do. The run, the sweep, the series (and its alert) and the token the routes
act on are the member's: "other member" is refused every write to them."""

HIDDEN = {("other member", "revoke own token")}
"""Refusals that answer 404, not 403: a member cannot list another's tokens, so revoking one must
not tell that it exists. Runs, sweeps and series are readable by every reader: 403 hides nothing."""

PASSWORD = "route-policy-password"
SECRET = "route-policy-secret"


def app_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route, the static mount aside (HEAD goes with GET)."""
    out = []
    for route in app.routes:
        contexts = route.effective_route_contexts() if hasattr(route, "effective_route_contexts") else [route]
        for r in contexts:
            if isinstance(r, Mount):
                continue
            out += [(m, r.path) for m in sorted(r.methods or ()) if m != "HEAD"]
    return out


@dataclass
class World:
    settings: Settings
    app: object
    ids: dict[str, str]
    cookies: dict[str, str]
    bearer: dict[str, str]
    user_ids: dict[str, int]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home: Path = tmp_path_factory.mktemp("policy")
    settings = Settings(home=home, database_url=f"sqlite:///{home / 'p.db'}", secret_key=SECRET, allow_local_mode=False)
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    assert not settings.local_mode, "the policy is checked outside local mode (loopback, local mode switched off)"
    cookies, bearer, ids = {}, {}, {}
    with session_scope(settings.sqlalchemy_url) as session:
        users = {
            name: auth.create_user(session=session, email=f"{name.replace(' ', '-')}@lab.org", password=PASSWORD, role=role)
            for name, role in [
                ("viewer", "viewer"),
                ("member", "member"),
                ("other member", "member"),
                ("admin", "admin"),
                ("target", "viewer"),
            ]
        }
        for name in ("viewer", "member", "other member", "admin"):
            cookies[name] = auth.start_session(session=session, user=users[name], max_age_s=3600)
        member = users["member"]
        bearer["member's upload token"] = tokens.create_token(session=session, name="ci", scopes=["upload"], user=member)
        bearer["member's submit token"] = tokens.create_token(session=session, name="jobs", scopes=["submit"], user=member)
        tokens.create_token(session=session, name="spare", scopes=["upload"], user=member)
        ids["token_id"] = str(max(t.id for t in tokens.list_tokens(session=session, user_id=member.id)))
        ids["user_id"] = str(users["target"].id)
        spec = JobSpec.model_validate({"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}})
        run = run_service.create_run(session=session, spec=spec, settings=settings, source="api", user_id=member.id)
        ids["run_id"] = run.id
        sweep = Sweep(name="policy sweep", status="running", model="tiny", world_size=2, request={}, hardware={}, candidates=[], planned=1)
        session.add(sweep)
        session.flush()
        run.sweep_id = ids["sweep_id"] = sweep.id  # the member's sweep: its one run is the member's
        principal = auth.Principal(via="token", role="member", user_id=member.id, email=member.email, scopes=frozenset({"upload"}))
        base = document(tokens_per_s=1000.0)
        docs = [ResultDocument.model_validate(d) for d in (base, slowed(base, 1.01), slowed(base, 0.99), slowed(base, 1.5))]
        for doc in docs:  # one at a time: three make the baseline, the fourth an alert
            uploaded = upload_results(session=session, documents=[doc], batch=False, idempotency_key=None, principal=principal)
        alert = next(v for v in uploaded[0].verdicts if v.verdict == "regressed")
        ids["series_id"], ids["verdict_id"] = alert.series_id, str(alert.id)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    # The app starts once for the module, as a server does (its lifespan: start-up checks, the
    # lease keeper), and every case's client only sends requests to it: starting and stopping it
    # per case (616 of them) was three quarters of this file's time.
    with TestClient(app):
        yield World(settings, app, ids, cookies, bearer, {name: u.id for name, u in users.items()})
    get_sessionmaker(settings.sqlalchemy_url).kw["bind"].dispose()


def test_every_route_has_a_decision(world: World) -> None:
    routes = set(app_routes(world.app))
    missing = sorted(routes - POLICY.keys())
    assert not missing, f"routes without a decision in POLICY (add one): {missing}"
    stale = sorted(POLICY.keys() - routes)
    assert not stale, f"POLICY names routes the app no longer has: {stale}"
    assert {d for d in POLICY.values()} <= set().union(*ALLOWED.values()), "every decision is some caller's to take"


def client_for(world: World, caller: str) -> TestClient:
    """A fresh client acting as `caller`, with this browser's CSRF cookie (see `sign_forms`); it
    sends requests to the app `world` started (no start-up of its own)."""
    client = TestClient(world.app, follow_redirects=False)
    client.cookies.set(csrf.COOKIE, "nonce-" + "".join(c for c in caller if c.isalnum()))
    if caller in world.cookies:
        client.cookies.set(SESSION_COOKIE, world.cookies[caller])
    if caller in world.bearer:
        client.headers["Authorization"] = f"Bearer {world.bearer[caller]}"
    return client


def sign_forms(client: TestClient) -> str:
    """The CSRF token a page would give this browser now (its nonce, bound to its login session),
    also sent as the X-CSRF-Token header; returns it for forms."""
    session = client.cookies.get(SESSION_COOKIE)
    binding = hashlib.sha256(session.encode()).hexdigest()[:32] if session else ""
    token = csrf._serializer(SECRET).dumps({"n": client.cookies.get(csrf.COOKIE), "s": binding})
    client.headers[CSRF_HEADER] = token
    return token


SMALL_QUERY = {"/plan": "?model=tiny&device=h100&nodes=1&gpus_per_node=2"}
"""Pages whose answer without a query is costly: the planner's page ranks llama-8b on 2 × 8 GPUs by
default (seconds of CPU for each of the six callers who get past it). Who gets past a route does
not depend on its query; the default ranking itself is drawn in test_planning_pages."""


def call(client: TestClient, method: str, path: str, ids: dict[str, str], form_token: str):
    url = path.format(**ids)
    if method == "GET":
        return client.get(url + SMALL_QUERY.get(path, ""))
    if url.startswith("/api/"):
        return client.request(method, url, json={})
    form = {csrf.FIELD: form_token}
    if url == "/login":
        form |= {"email": "viewer@lab.org", "password": PASSWORD}
    return client.request(method, url, data=form)


def refused(response, path: str) -> str | None:
    """How a response refuses (None when it let the caller through)."""
    if response.status_code in (401, 403):
        return str(response.status_code)
    if response.status_code in (302, 303, 307) and response.headers["location"].startswith("/login?next="):
        return "login redirect"
    return None


@pytest.mark.parametrize("caller", list(ALLOWED))
@pytest.mark.parametrize(("method", "path"), sorted(POLICY))
def test_route_against_caller(world: World, caller: str, method: str, path: str) -> None:
    decision = POLICY[(method, path)]
    client = client_for(world, caller)
    if path in ("/login", "/logout") and caller in world.cookies:
        # logging in or out ends the session the request carries: use one of its own, not the one the other cases use
        with session_scope(world.settings.sqlalchemy_url) as session:
            user = auth.get_user(session=session, user_id=world.user_ids[caller])
            client.cookies.set(SESSION_COOKIE, auth.start_session(session=session, user=user, max_age_s=600))
    form_token = sign_forms(client)
    response = call(client, method, path, world.ids, form_token)
    how = refused(response, path)
    if (caller, decision) in HIDDEN:
        assert response.status_code == 404, f"{caller} must be told {method} {path} is not found; got {response.status_code}"
        return
    if decision in ALLOWED[caller]:
        assert how is None, f"{caller} must get past {method} {path} ({decision}); got {response.status_code} {response.text[:200]}"
        assert response.status_code < 500, response.text[:500]
    else:
        assert how is not None, f"{caller} must be refused {method} {path} ({decision}); got {response.status_code}"
        if caller == "anonymous":
            api = path.startswith("/api/") or path in ("/metrics", "/openapi.json")  # read by programs, not browsers
            assert how == ("401" if api else "login redirect"), "anonymous: 401 from the API, the login page for pages"
        else:
            assert how == "403", f"{caller} is known: 403, not {how}"


def test_local_mode_needs_no_login_but_uploads_still_need_a_token(world: World) -> None:
    local = world.settings.model_copy(update={"allow_local_mode": True})
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: local
    with TestClient(app, follow_redirects=False) as client:
        assert client.get("/").status_code == 200 and client.get("/users").status_code == 200
        assert client.get("/api/v1/me").json() == {"via": "local", "email": None, "role": "admin", "scopes": []}
        assert client.post("/api/v1/results", json=document()).status_code == 401


def test_docs_public_opens_the_api_documentation_to_anyone(world: World) -> None:
    opened = world.settings.model_copy(update={"docs_public": True})
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: opened
    with TestClient(app, follow_redirects=False) as client:
        assert client.get("/openapi.json").json()["info"]["title"] == "parallab"
        assert client.get("/docs").status_code == 200 and client.get("/redoc").status_code == 200
        assert client.get("/api/v1/runs").status_code == 401, "only the documentation is opened"


def test_a_csrf_token_from_one_login_session_is_refused_in_another(world: World) -> None:
    """Both browsers carry the same CSRF cookie (say, one planted by a sibling subdomain): the
    member's token still does not pass with the other member's session."""
    member = client_for(world, "member")
    token = sign_forms(member)
    other = client_for(world, "other member")
    other.cookies.set(csrf.COOKIE, member.cookies.get(csrf.COOKIE))
    other.headers[CSRF_HEADER] = token
    with other:
        refused = other.post("/tokens", data={csrf.FIELD: token, "name": "x", "scope": ["upload"]})
        assert refused.status_code == 403 and "another login session" in refused.text
        api = other.patch(f"/api/v1/series/{world.ids['series_id']}", json={})
        assert api.status_code == 403 and "another login session" in api.text
    sign_forms(other)  # its own session's token passes
    with other:
        assert other.post("/tokens", data={csrf.FIELD: sign_forms(other), "name": "x", "scope": ["upload"]}).status_code == 200


PAGE_POSTS = sorted(path for method, path in POLICY if method == "POST" and not path.startswith("/api/") and path != "/login")


@pytest.mark.parametrize("path", PAGE_POSTS)
def test_every_page_post_refuses_a_form_without_its_csrf_token(world: World, path: str) -> None:
    """The admin passes every role check, so the one thing wrong here is the missing token: each
    form route answers 403 naming it before doing anything (login, whose own page shows the
    message, is held in test_series). Dropping a route's checked form fails its case."""
    client = client_for(world, "admin")
    before = database_state(world)
    response = client.post(path.format(**world.ids), data={"name": "x"})
    assert response.status_code == 403, f"POST {path} without a CSRF token: {response.status_code}"
    assert "CSRF" in response.text, response.text[:300]
    assert database_state(world) == before, "nothing was written"


def database_state(world: World) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table but the login sessions' (whose last-seen time a request moves)."""
    with session_scope(world.settings.sqlalchemy_url) as session:
        tables = [name for (name,) in session.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'"))]
        return {t: sorted(map(tuple, session.execute(text(f'SELECT * FROM "{t}"'))), key=repr) for t in tables if "session" not in t}
