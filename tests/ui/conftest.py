"""UI fixtures: a fresh SQLite database per test module (schema by migrations), the app with its
settings overridden, a seeded lab of runs, and — for browser tests — a real uvicorn server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.db import get_sessionmaker
from backend.migrate import upgrade
from tests.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: F401 (the browser tests import them from here)


def make_settings(home: Path) -> Settings:
    """Local-mode settings on a SQLite database (and broker) under `home`, schema migrated."""
    settings = Settings(home=home, database_url=f"sqlite:///{home / 'parallab.db'}", host="127.0.0.1", secret_key="ui-test-secret")
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    return settings


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return make_settings(tmp_path_factory.mktemp("ui"))


@pytest.fixture(scope="module")
def app(settings: Settings):
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    return app


@pytest.fixture(scope="module")
def session_factory(settings: Settings):
    return get_sessionmaker(settings.sqlalchemy_url)


@pytest.fixture(scope="module")
def lab(session_factory):
    """The seeded runs, by key (see factories.seed_lab)."""
    from tests.ui.factories import seed_lab

    with session_factory() as session:
        return seed_lab(session)


@pytest.fixture(scope="module")
def lab_series(session_factory, lab) -> str:
    """A CI series with a history of six results beside the lab (see factories.seed_series): its id."""
    from tests.ui.factories import seed_series

    with session_factory() as session:
        return seed_series(session)


@pytest.fixture()
def client(app) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving `app` on a free loopback port, in a thread of this process."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def live_server(app, lab) -> Iterator[LiveServer]:
    with LiveServer(app) as server:
        yield server


def polled_into_view(page: Any, locator: Any, interval_ms: int = 2000, timeout_s: float = 15.0) -> None:
    """Wait for `locator` to be visible on a page with an installed clock (`page.clock.install()`), moving that
    clock on by the page's poll interval (watch.js and index.js: 2 s) at each try instead of
    waiting the interval out: the page still has to poll, get the new state and draw it (or reload
    with it), only sooner."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = time.monotonic() + timeout_s
    while True:
        page.clock.run_for(interval_ms)
        try:
            locator.wait_for(state="visible", timeout=500)
            return
        except PlaywrightTimeout:  # not yet: the next poll
            if time.monotonic() > deadline:
                raise
