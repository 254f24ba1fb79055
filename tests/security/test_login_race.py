"""The login lockout under concurrency: many clients guessing one account at the same instant, on a
real `uvicorn --workers 2` over Postgres with the counts in the broker's Redis, get exactly
`login_account_lockout` password checks between them — every other try is refused 429 without one.
(A check of the count, then a slow password hash, then an increment let 13 of 10 through.) And in
one process without Redis, threads racing the same guard get the same bound."""

from __future__ import annotations

import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from backend.config import Settings
from backend.db import session_scope
from backend.services import auth
from backend.services.login_guard import Attempt, LocalCounts, LoginGuard
from benchmarks.load import server, server_env
from tests.conftest import REDIS_URL

LOCKOUT = 10
CLIENTS = 24
"""More clients than the lockout, fewer than the address's (raised here): only the account's count can stop them."""


def _guess(base: str, email: str, barrier: threading.Barrier) -> int:
    """One client: fetch the form (its CSRF token), wait for the others, post a wrong password."""
    with httpx.Client(base_url=base, timeout=120, follow_redirects=False) as client:
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").text)
        assert token is not None
        barrier.wait()
        form = {"email": email, "password": "a-wrong-guess", "csrf_token": token.group(1), "next": "/"}
        return client.post("/login", data=form).status_code


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_parallel_clients_get_exactly_the_lockouts_number_of_password_checks(settings: Settings, tmp_path: Path) -> None:
    email = f"race-{secrets.token_hex(4)}@lab.org"  # the counts are namespaced by database: a fresh account
    with session_scope(settings.sqlalchemy_url) as session:
        auth.create_user(session=session, email=email, password="the-right-password", role="member")
    env = server_env(tmp_path, settings.sqlalchemy_url)
    env.update(
        PARALLAB_BROKER_URL=REDIS_URL,
        PARALLAB_LOGIN_DELAY_S="0",  # no growing waits: only the lockout stops a try
        PARALLAB_LOGIN_ACCOUNT_LOCKOUT=str(LOCKOUT),
        PARALLAB_LOGIN_IP_LOCKOUT="1000",
    )
    with server("uvicorn2", env, tmp_path, timeout=120) as base:
        barrier = threading.Barrier(CLIENTS)
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(lambda _: _guess(base, email, barrier), range(CLIENTS)))
        assert (statuses.count(401), statuses.count(429)) == (LOCKOUT, CLIENTS - LOCKOUT), "password checks, refusals"
        with httpx.Client(base_url=base, timeout=60) as owner:
            token = re.search(r'name="csrf_token" value="([^"]+)"', owner.get("/login").text)
            assert token is not None
            form = {"email": email, "password": "the-right-password", "csrf_token": token.group(1), "next": "/"}
            assert owner.post("/login", data=form).status_code == 429, "locked: not even the right password is checked"


class SlowHash(LocalCounts):
    """This process's counts, with each increment answered after the others have read theirs."""

    def fail(self, key: str, *, forget_after_s: float) -> int:
        time.sleep(0.01)
        return super().fail(key, forget_after_s=forget_after_s)


def test_threads_racing_one_guard_without_redis_get_exactly_the_lockouts_number_of_checks(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, login_delay_s=0, login_account_lockout=LOCKOUT, login_ip_lockout=1000)
    guard = LoginGuard(settings, SlowHash())
    barrier = threading.Barrier(CLIENTS)
    checked: list[int] = []

    def guess(i: int) -> None:
        barrier.wait()
        ticket = guard.admit(Attempt(email="ada@lab.org", ip=f"10.0.0.{i}"))
        if ticket.wait_s == 0:
            checked.append(i)
            time.sleep(0.05)  # the password hash
            guard.failed(ticket)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(guess, range(CLIENTS)))
    assert len(checked) == LOCKOUT
    assert guard.admit(Attempt(email="ada@lab.org", ip="10.0.0.99")).wait_s >= settings.security.login_lockout_s - 1


@pytest.mark.parametrize("counts", ["redis", "process"])
def test_successful_logins_give_their_addresss_place_back(tmp_path: Path, counts: str) -> None:
    """An office behind one address logs in all day: only failures count against it."""
    from backend.services.login_guard import login_guard

    broker = REDIS_URL if counts == "redis" else f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    settings = Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / f'{secrets.token_hex(4)}.db'}", broker_url=broker)
    guard = login_guard(settings)
    for i in range(settings.security.login_ip_lockout + 5):
        ticket = guard.admit(Attempt(email=f"user{i}@lab.org", ip="198.51.100.20"))
        assert ticket.wait_s == 0, f"success {i + 1} was refused"
        guard.succeeded(ticket)
