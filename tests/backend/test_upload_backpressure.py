"""Back-pressure on CI uploads: a bounded queue in front of the upload threads, 503 + Retry-After at
once when it is full, no database connection held while waiting, and a stored upload always
answered with its run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from backend.api.routes import results
from backend.api.upload_pool import UploadPool, UploadsBusy, upload_pool
from backend.config import get_settings
from backend.db import get_engine
from backend.models import Run
from tests.backend.test_api_results import DOCUMENT, count, token


@contextmanager
def busy_threads(pool: UploadPool) -> Iterator[None]:
    """Every upload thread of `pool` held by work that waits until the block ends (admitted like an upload)."""
    release = threading.Event()
    started = threading.Barrier(pool.threads + 1)

    def hold() -> None:
        started.wait()
        release.wait(60)

    loops = [threading.Thread(target=asyncio.run, args=(pool.run(hold, retry_after_s=1),)) for _ in range(pool.threads)]
    for t in loops:
        t.start()
    started.wait(10)
    try:
        yield
    finally:
        release.set()
        for t in loops:
            t.join(10)


def wait_for(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_full_queue_refuses_at_once_and_frees_its_place() -> None:
    pool = UploadPool(threads=1, queue=1)
    gate = threading.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(pool.run(lambda: gate.wait(10), retry_after_s=3))
        second = asyncio.ensure_future(pool.run(lambda: "queued", retry_after_s=3))
        await asyncio.sleep(0.05)
        assert pool.admitted == 2
        with pytest.raises(UploadsBusy) as refused:
            await pool.run(lambda: "one too many", retry_after_s=3)
        assert refused.value.retry_after_s == 3 and "retry in 3 s" in str(refused.value)
        gate.set()
        assert await first is True and await second == "queued"
        assert pool.admitted == 0
        assert await pool.run(lambda: "room again", retry_after_s=3) == "room again"

    asyncio.run(scenario())


def test_an_upload_over_a_full_queue_is_503_with_retry_after_and_stores_nothing(client, settings) -> None:
    settings.server.upload_concurrency, settings.server.upload_queue, settings.server.upload_retry_after_s = 1, 0, 4
    ci = {**token(settings, "upload"), "Idempotency-Key": "busy-1"}
    with busy_threads(upload_pool(threads=1, queue=0)):
        refused = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "4"
        assert "same Idempotency-Key" in refused.json()["detail"]
        assert count(settings, Run) == 0
    retried = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
    assert retried.status_code == 201, retried.text
    assert count(settings, Run) == 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_uploads_waiting_for_a_thread_hold_no_database_connection(client, settings) -> None:
    """Ten uploads queue behind a busy thread: the pool lends none of them a connection meanwhile
    (each took one for its token check, and gave it back before it queued)."""
    waiting = 10
    settings.server.upload_concurrency, settings.server.upload_queue = 1, waiting
    pool = upload_pool(threads=1, queue=waiting)
    headers = [token(settings, "upload") for _ in range(waiting)]
    for h in headers:  # a token's first use is recorded in a commit of its own, which would give the connection back anyway
        assert client.get("/api/v1/results/schema", headers=h).status_code == 200
    engine_pool = get_engine(settings.sqlalchemy_url).pool
    # the clients' pool is left last: leaving it waits for every answer, which comes only once the
    # busy thread is released (in the other order the wait ran out busy_threads' 60 s first)
    with ThreadPoolExecutor(waiting) as clients, busy_threads(pool):
        futures = [
            clients.submit(
                client.post, "/api/v1/results", json={**DOCUMENT, "name": f"queued {i}"}, headers={**h, "Idempotency-Key": f"q-{i}"}
            )
            for i, h in enumerate(headers)
        ]
        wait_for(lambda: pool.admitted == 1 + waiting, "the uploads to queue")
        assert engine_pool.checkedout() == 0, f"{engine_pool.checkedout()} connections held by queued uploads"
    codes = [f.result().status_code for f in futures]
    assert codes == [201] * waiting, [f.result().text[:200] for f in futures]
    assert count(settings, Run) == waiting


def test_an_upload_whose_answer_fails_after_its_commit_still_answers_its_run(client, settings, monkeypatch) -> None:
    built = results.upload_read
    calls = []

    def fails_first(uploaded):
        calls.append(uploaded.run.id)
        if len(calls) == 1:
            raise RuntimeError("the answer broke after the commit")
        return built(uploaded)

    monkeypatch.setattr(results, "upload_read", fails_first)
    ci = {**token(settings, "upload"), "Idempotency-Key": "after-commit"}
    response = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
    assert response.status_code == 201, response.text
    assert response.json()["id"] == calls[0] and response.json()["status"] == "succeeded"
    assert count(settings, Run) == 1
    again = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
    assert again.status_code == 200 and again.json()["id"] == calls[0]


def test_an_upload_whose_answer_cannot_be_built_at_all_is_a_503_naming_its_run(client, settings, monkeypatch) -> None:
    def broken(uploaded):
        raise RuntimeError("no answer today")

    with monkeypatch.context() as patch:
        patch.setattr(results, "upload_read", broken)
        ci = {**token(settings, "upload"), "Idempotency-Key": "never-answered"}
        response = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert count(settings, Run) == 1
    again = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
    assert again.status_code == 200 and again.json()["id"] in response.json()["detail"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_request_that_finds_no_free_connection_is_503_after_the_pools_timeout_not_500(client, settings) -> None:
    engine = get_engine(settings.sqlalchemy_url)
    assert engine.pool.timeout() == get_settings().database.db_pool_timeout_s  # type: ignore[attr-defined]
    ci = token(settings, "upload")
    held = [engine.connect() for _ in range(get_settings().database.db_pool_size + get_settings().database.db_max_overflow)]
    try:
        response = client.post("/api/v1/results", json=DOCUMENT, headers={**ci, "Idempotency-Key": "no-connection"})
    finally:
        for conn in held:
            conn.close()
    assert response.status_code == 503 and response.headers["retry-after"] == "2", response.text
    assert "no database connection was free" in response.json()["detail"]
    assert client.post("/api/v1/results", json=DOCUMENT, headers={**ci, "Idempotency-Key": "no-connection"}).status_code == 201
