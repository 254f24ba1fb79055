"""Login protection on real Redis (backend.services.login_guard): one client's 57 tries in 30 s are
slowed to a handful, ten in a row lock the account (logged), the owner's own browser still gets
in, an admin lifts the lockout, and with Redis gone each process still counts on its own."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from backend.api.app import create_app
from backend.api.deps import SESSION_COOKIE
from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.migrate import upgrade
from backend.services import auth
from backend.services.login_guard import DEVICE_COOKIE
from parallab.cli import app as cli_app
from tests.conftest import REDIS_URL
from tests.e2e.fleet import private_redis

PASSWORD = "the-right-password"
WRONG = "a-wrong-guess-1"


def lab_settings(tmp_path: Path, broker_url: str, **overrides: object) -> Settings:
    """Lab mode (logins required) on a database of this test's own: its counts are namespaced by it."""
    settings = Settings(
        home=tmp_path / "home",
        database_url=f"sqlite:///{tmp_path / 'p.db'}",
        broker_url=broker_url,
        secret_key="login-guard-secret",
        allow_local_mode=False,
        **overrides,  # type: ignore[arg-type]
    )
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings.sqlalchemy_url) as session:
        auth.create_user(session=session, email="ada@lab.org", password=PASSWORD, role="member")
        auth.create_user(session=session, email="root@lab.org", password=PASSWORD, role="admin")
    return settings


def browser(settings: Settings, ip: str = "10.0.0.1") -> TestClient:
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    return TestClient(app, follow_redirects=False, client=(ip, 40000))


def log_in(client: TestClient, email: str, password: str):
    """Log in from the login form (a browser already logged in has logged out first: its device cookie stays)."""
    client.cookies.delete(SESSION_COOKIE)
    page = client.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token, page[:300]
    return client.post("/login", data={"email": email, "password": password, "csrf_token": token.group(1), "next": "/"})


@pytest.fixture
def redis_settings(tmp_path: Path) -> Iterator[Settings]:
    # The first wait after the 3 free failures is 30 s (default 1 s, doubling): longer than the
    # whole loop below on any machine, so what is refused does not depend on its speed.
    yield lab_settings(tmp_path, REDIS_URL, login_delay_s=30)


def test_57_tries_in_30_s_are_slowed_to_a_handful_and_the_owners_browser_still_gets_in(redis_settings: Settings) -> None:
    owner = browser(redis_settings, ip="10.0.0.7")
    assert log_in(owner, "ada@lab.org", PASSWORD).status_code == 303, "the owner's usual browser, before the attack"
    assert owner.cookies.get(DEVICE_COOKIE)
    attacker = browser(redis_settings, ip="203.0.113.9")
    statuses = [log_in(attacker, "ada@lab.org", WRONG) for _ in range(57)]
    wrong = [r for r in statuses if r.status_code == 401]
    throttled = [r for r in statuses if r.status_code == 429]
    # 3 free failures, and the 4th starts a wait: every other try is refused without a password check.
    assert len(wrong) == 4, [r.status_code for r in statuses]
    assert len(wrong) + len(throttled) == 57
    assert all(int(r.headers["Retry-After"]) >= 1 and "too many failed logins" in r.text for r in throttled)
    # The right password straight afterwards: the attacker's client, and a new browser elsewhere, wait...
    assert log_in(attacker, "ada@lab.org", PASSWORD).status_code == 429
    assert log_in(browser(redis_settings, ip="198.51.100.3"), "ada@lab.org", PASSWORD).status_code == 429
    # ...but the owner's usual browser (its device cookie) is not held by strangers' guesses.
    assert log_in(owner, "ada@lab.org", PASSWORD).status_code == 303


def test_ten_failures_lock_the_account_logged_and_an_admin_lifts_it(tmp_path: Path, caplog, monkeypatch) -> None:
    settings = lab_settings(tmp_path, REDIS_URL, login_delay_s=0)  # no waits: only the lockout
    owner = browser(settings, ip="10.0.0.7")
    assert log_in(owner, "ada@lab.org", PASSWORD).status_code == 303
    attacker = browser(settings, ip="203.0.113.9")
    with caplog.at_level(logging.WARNING, logger="backend.services.login_guard"):
        assert [log_in(attacker, "ada@lab.org", WRONG).status_code for _ in range(10)] == [401] * 10
    assert any("login lockout: account" in r.getMessage() and "ada@lab.org" in r.getMessage() for r in caplog.records)
    locked = log_in(attacker, "ada@lab.org", PASSWORD)
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) > 800, "locked for login_lockout_s (900 s)"
    elsewhere = browser(settings, ip="198.51.100.3")
    assert log_in(elsewhere, "ada@lab.org", PASSWORD).status_code == 429, "the account is locked wherever it is tried from"
    assert log_in(owner, "ada@lab.org", PASSWORD).status_code == 303, "except in the owner's usual browser"
    # Another API process (another app on the same Redis) sees the same lockout.
    assert log_in(browser(settings, ip="198.51.100.4"), "ada@lab.org", PASSWORD).status_code == 429
    # An admin lifts it from the command line...
    monkeypatch.setenv("PARALLAB_DATABASE_URL", settings.sqlalchemy_url)
    monkeypatch.setenv("PARALLAB_BROKER_URL", settings.celery_broker_url)
    monkeypatch.setenv("PARALLAB_HOME", str(settings.resolved_home))
    get_settings.cache_clear()
    try:
        unlocked = CliRunner().invoke(cli_app, ["user", "unlock", "ADA@lab.org"])
        assert unlocked.exit_code == 0 and "ada@lab.org: login unlocked" in unlocked.output, unlocked.output
        assert CliRunner().invoke(cli_app, ["user", "unlock", "nobody@lab.org"]).exit_code == 2
    finally:
        get_settings.cache_clear()
    assert log_in(elsewhere, "ada@lab.org", PASSWORD).status_code == 303
    # ...or on the Users page.
    for _ in range(10):
        log_in(attacker, "ada@lab.org", WRONG)
    assert log_in(elsewhere := browser(settings, ip="198.51.100.5"), "ada@lab.org", PASSWORD).status_code == 429
    admin = browser(settings, ip="10.0.0.8")
    assert log_in(admin, "root@lab.org", PASSWORD).status_code == 303
    users = admin.get("/users").text
    ada_id = re.search(r'action="/users/(\d+)/unlock"', users.split('data-email="ada@lab.org"')[1])
    token = re.search(r'name="csrf_token" value="([^"]+)"', users)
    assert ada_id and token
    assert admin.post(f"/users/{ada_id.group(1)}/unlock", data={"csrf_token": token.group(1)}).status_code == 303
    assert log_in(elsewhere, "ada@lab.org", PASSWORD).status_code == 303


def test_one_address_guessing_many_accounts_is_locked(tmp_path: Path) -> None:
    settings = lab_settings(tmp_path, REDIS_URL, login_delay_s=0)
    sprayer = browser(settings, ip="203.0.113.50")
    assert {log_in(sprayer, f"user{i}@lab.org", WRONG).status_code for i in range(30)} == {401}
    assert log_in(sprayer, "ada@lab.org", PASSWORD).status_code == 429, "the address is locked, whatever account it names"
    assert log_in(browser(settings, ip="10.0.0.9"), "ada@lab.org", PASSWORD).status_code == 303, "other addresses are not"


def test_with_redis_down_each_process_still_counts_on_its_own(tmp_path: Path, caplog) -> None:
    with private_redis(tmp_path) as redis:
        settings = lab_settings(tmp_path, redis.url, login_delay_s=0)
        attacker = browser(settings, ip="203.0.113.9")
        assert log_in(attacker, "ada@lab.org", WRONG).status_code == 401  # counted in Redis
        redis.stop()
        with caplog.at_level(logging.WARNING, logger="backend.services.login_guard"):
            statuses = [log_in(attacker, "ada@lab.org", WRONG).status_code for _ in range(11)]
        assert statuses == [401] * 10 + [429], "fail closed: this process's own count locks the account"
        assert any("Redis did not answer" in r.getMessage() for r in caplog.records)
        assert log_in(attacker, "ada@lab.org", PASSWORD).status_code == 429
