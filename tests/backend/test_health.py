"""`/healthz` asks the database and the broker: each "ok" or its error, and 503 while either is down
(a settings object pointing at a closed port stands in for a server that is down). Its errors are
the drivers' own, shortened; the route stays public."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from benchmarks.load import free_port
from tests.conftest import REDIS_URL


def healthz(settings: Settings) -> tuple[int, dict[str, str]]:
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as client:
        response = client.get("/healthz")
    return response.status_code, response.json()


def test_both_up_on_the_test_database_and_real_redis(settings: Settings) -> None:
    assert healthz(settings.model_copy(update={"broker_url": REDIS_URL})) == (200, {"status": "ok", "database": "ok", "broker": "ok"})


def test_the_embedded_broker_is_asked_too(settings: Settings) -> None:
    settings.ensure_home()
    assert healthz(settings) == (200, {"status": "ok", "database": "ok", "broker": "ok"})


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_database_that_is_down_is_503_naming_it(settings: Settings) -> None:
    down = settings.model_copy(
        update={"database_url": f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test", "broker_url": REDIS_URL}
    )
    code, body = healthz(down)
    assert code == 503 and body["status"] == "unavailable" and body["broker"] == "ok", body
    assert body["database"].startswith("OperationalError") and "refused" in body["database"], body


def test_a_broker_that_is_down_is_503_naming_it(settings: Settings) -> None:
    code, body = healthz(settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{free_port()}/0"}))
    assert code == 503 and body["database"] == "ok" and body["broker"].startswith("ConnectionError"), body
    assert "refused" in body["broker"], body


def test_a_hung_database_answers_within_the_timeout(tmp_path: Path, settings: Settings) -> None:
    """A port that accepts and never speaks: the check gives up after `health_timeout_s`."""
    import socket
    import time

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        hung = settings.model_copy(
            update={
                "database_url": f"postgresql+psycopg://postgres@127.0.0.1:{port}/test",
                "broker_url": REDIS_URL,
                "health_timeout_s": 0.5,
            }
        )
        started = time.monotonic()
        code, body = healthz(hung)
    assert code == 503 and body["database"] == "timed out after 0.5 s" and time.monotonic() - started < 10, body
