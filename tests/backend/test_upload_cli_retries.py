"""`parallab upload` against a real server that is busy, then away: it retries under the same
Idempotency-Key until the result is stored, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from backend.api.app import create_app
from backend.api.upload_pool import upload_pool
from backend.config import get_settings
from backend.models import Run
from parallab.commands.retry import backoff_s
from tests.backend.test_api_results import DOCUMENT, count, token
from tests.backend.test_upload_backpressure import busy_threads
from tests.ui.conftest import LiveServer

REPO = Path(__file__).resolve().parents[2]
ON_POSTGRES = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


class Cli:
    """`parallab upload` in a subprocess, its stderr read line by line as it comes."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("PARALLAB_SERVER", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "parallab", "upload", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
        self.reader.start()

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if time.monotonic() > deadline or self.proc.poll() is not None and not self.reader.is_alive():
                raise AssertionError(f"the CLI never printed {text!r}: {''.join(self.lines)}")
            time.sleep(0.05)

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        self.proc.wait(timeout)
        self.reader.join(10)
        return self.proc.returncode, " ".join("".join(self.lines).split())  # rich wraps long lines


def served(settings):
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    return LiveServer(app)


def document(tmp_path: Path) -> Path:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(DOCUMENT))
    return path


@ON_POSTGRES
def test_a_busy_server_is_retried_after_its_retry_after_and_the_result_stored_once(settings, tmp_path) -> None:
    settings.server.upload_concurrency, settings.server.upload_queue, settings.server.upload_retry_after_s = 1, 0, 1
    bearer = token(settings, "upload")["Authorization"].split()[1]
    with served(settings) as server:
        with busy_threads(upload_pool(threads=1, queue=0)):
            cli = Cli(str(document(tmp_path)), "--server", server.url, "--token", bearer, "--retries", "20")
            cli.wait_for("503")  # turned away while the upload threads are busy
            assert count(settings, Run) == 0
        code, err = cli.finish()
    assert code == 0, err
    assert "retrying in 1.0 s under the same Idempotency-Key" in err
    assert "(new" in err
    assert count(settings, Run) == 1


@ON_POSTGRES
def test_a_server_that_comes_up_late_is_retried_and_a_retry_of_a_stored_upload_is_not_stored_again(settings, tmp_path) -> None:
    bearer = token(settings, "upload")["Authorization"].split()[1]
    path = document(tmp_path)
    server = served(settings)
    cli = Cli(str(path), "--server", server.url, "--token", bearer)
    cli.wait_for("no answer")  # nothing listens yet: the connection is refused
    with server:
        code, err = cli.finish()
        assert code == 0, err
        assert "(new" in err
        again = Cli(str(path), "--server", server.url, "--token", bearer)  # CI re-runs the job
        code, err = again.finish()
    assert code == 0 and "already uploaded" in err, err
    assert count(settings, Run) == 1


@ON_POSTGRES
def test_retries_are_bounded(settings, tmp_path) -> None:
    settings.server.upload_concurrency, settings.server.upload_queue, settings.server.upload_retry_after_s = 1, 0, 1
    bearer = token(settings, "upload")["Authorization"].split()[1]
    with served(settings) as server, busy_threads(upload_pool(threads=1, queue=0)):
        code, err = Cli(str(document(tmp_path)), "--server", server.url, "--token", bearer, "--retries", "2").finish()
    assert code == 3 and "after 3 tries" in err, err
    assert err.count("retrying in") == 2, err
    assert count(settings, Run) == 0


def test_the_backoff_doubles_with_jitter_and_is_capped() -> None:
    assert [backoff_s(n, rng=lambda: 0.5) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(20, rng=lambda: 0.5) == 60.0
    assert 0.75 <= backoff_s(1, rng=lambda: 0.0) <= backoff_s(1, rng=lambda: 1.0) == 1.25
