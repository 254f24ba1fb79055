"""The database briefly down (issue 10): the API answers 503 for what needs it and recovers without
a restart. Postgres is reached through a TCP relay of the test's own, which is cut and restored
mid-test (the machine's Postgres itself is never stopped); a dead port stands for a database that
is not there at all. `/metrics` still answers, saying the database is down."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from backend.api.app import create_app
from backend.config import Settings, get_settings


class Relay:
    """Forwards a loopback port to Postgres; `cut()` drops every connection and stops listening."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept(); a bare close() would not
            self._server.close()
            self._server = None
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()


@pytest.fixture
def relayed(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Relay, TestClient]]:
    url = make_url(postgres_url)
    relay = Relay((url.host or "127.0.0.1", url.port or 5432))
    relay.start()
    settings = Settings(
        home=tmp_path / "home", database_url=url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    )
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as client:
        yield relay, client
    relay.cut()


def test_the_api_answers_503_while_the_database_is_down_and_recovers_without_a_restart(relayed) -> None:
    relay, client = relayed
    assert client.get("/api/v1/runs").status_code == 200
    relay.cut()
    down = client.get("/api/v1/runs")
    assert down.status_code == 503 and down.headers["retry-after"] == "5"
    assert "database is unavailable" in down.json()["detail"]
    assert client.post("/api/v1/runs", json={"strategy": {"name": "ddp", "world_size": 2}}).status_code == 503
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "parallab_database_up 0" in metrics.text
    relay.start()
    assert client.get("/api/v1/runs").status_code == 200, "the same app reconnects once the database is back"
    assert "parallab_database_up 1" in client.get("/metrics").text


def test_a_database_on_a_dead_port_is_a_503_not_a_500(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    settings = Settings(home=tmp_path / "home", database_url=f"postgresql+psycopg://postgres@127.0.0.1:{dead}/nothing")
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as client:
        assert client.get("/api/v1/workers").status_code == 503
        assert client.get("/api/v1/runs/abc").status_code == 503
