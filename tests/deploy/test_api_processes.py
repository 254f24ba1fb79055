"""What several API processes (`uvicorn --workers N`, as compose runs it) share: the env-seeded
admin is created once, whichever process starts first, and the others start too; with a Redis
broker a token's upload rate is one budget across the processes."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import func, select

from backend.api.app import create_app
from backend.api.lifespan import seed_admin
from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.models import User
from backend.store import accounts as store
from tests.backend.test_api_results import DOCUMENT, token
from tests.conftest import REDIS_URL
from tests.e2e.fleet import free_port

EMAIL, PASSWORD = "first-admin@lab.example", "first-admin-password-1"


def admins(settings: Settings) -> int:
    with session_scope(settings.sqlalchemy_url) as session:
        return int(session.scalar(select(func.count()).select_from(User).where(User.email == EMAIL)) or 0)


def test_a_second_process_that_loses_the_race_to_seed_the_admin_still_starts(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = settings.model_copy(update={"admin_email": EMAIL, "admin_password": SecretStr(PASSWORD)})
    seed_admin(seeded)
    assert admins(seeded) == 1
    seed_admin(seeded)  # a later start: the admin exists, nothing happens
    # The race: the other process inserted between this one's look-up (which saw nobody) and its insert.
    monkeypatch.setattr(store, "find_user", lambda session, email: None)
    seed_admin(seeded)  # the unique email refuses the insert; start-up goes on
    assert admins(seeded) == 1


ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def two_processes(settings: Settings) -> tuple[TestClient, TestClient]:
    """Two API apps on the same settings: what two uvicorn workers hold (each its own app.state)."""
    apps = [create_app(), create_app()]
    for app in apps:
        app.dependency_overrides[get_settings] = lambda: settings
    return TestClient(apps[0]), TestClient(apps[1])


@ON_SQLITE
def test_with_a_redis_broker_the_upload_rate_is_one_budget_across_api_processes(settings: Settings) -> None:
    settings.broker.broker_url, settings.security.upload_burst, settings.security.upload_rate_per_minute = REDIS_URL, 3, 1.0
    first, second = two_processes(settings)
    ci = token(settings, "upload")
    answers = [(first if i % 2 == 0 else second).post("/api/v1/results", json=DOCUMENT, headers=ci) for i in range(4)]
    assert [a.status_code for a in answers] == [201, 201, 201, 429], "3 at once in all, not 3 per process"
    assert [a.headers["ratelimit-remaining"] for a in answers] == ["2", "1", "0", "0"]
    assert 1 <= int(answers[-1].headers["retry-after"]) <= 60


@ON_SQLITE
def test_with_redis_away_each_process_keeps_its_own_budget(settings: Settings) -> None:
    settings.broker.broker_url, settings.security.upload_burst, settings.security.upload_rate_per_minute = (
        f"redis://127.0.0.1:{free_port()}/0",
        1,
        1.0,
    )
    first, second = two_processes(settings)
    ci = token(settings, "upload")
    assert first.post("/api/v1/results", json=DOCUMENT, headers=ci).status_code == 201
    assert first.post("/api/v1/results", json=DOCUMENT, headers=ci).status_code == 429
    assert second.post("/api/v1/results", json=DOCUMENT, headers=ci).status_code == 201, "a process's own bucket, not a refusal"


def test_connections_accepted_by_a_worker_of_several_send_without_delay() -> None:
    """`uvicorn --workers N` binds with `socket.socket(family)` (proto 0), so asyncio leaves Nagle on
    for the connections its workers accept, and each answer's body waited 40 ms for the client's
    delayed ACK of its head. The lifespan's `nodelay_listeners` sets TCP_NODELAY on the listening
    socket, which the connections accepted from it inherit."""
    import socket

    from backend.api.bind import nodelay_listeners

    with socket.socket(socket.AF_INET) as listener:  # as uvicorn's Config.bind_socket makes it
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert listener.proto == 0
        with socket.create_connection(listener.getsockname()) as _client:
            before, _ = listener.accept()
        with before:
            assert before.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0, "Nagle on: what the workers accepted"
        assert nodelay_listeners() >= 1
        with socket.create_connection(listener.getsockname()) as _client:
            after, _ = listener.accept()
        with after:
            assert after.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
