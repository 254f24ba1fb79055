"""CI uploads under load on a real `uvicorn --workers 2` over Postgres, bounded: 20 clients × 5 uploads
against a server whose upload queues are short on purpose, so some uploads are turned away and
retried. No answer is a 5xx but a 503 with Retry-After, every upload ends stored exactly once,
and 20 uploads under one key store one run. (Speed is benchmarks/load.py's, not this test's.)"""

from __future__ import annotations

import os
import secrets

import pytest

from benchmarks.load import REPO, ci_phase, one_key_phase, server

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["postgres"], indirect=True)]

CLIENTS, EACH = 20, 5


def test_uploads_from_twenty_clients_are_stored_exactly_once_with_no_5xx(settings, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    env.update(
        PARALLAB_HOME=str(tmp_path),
        PARALLAB_DATABASE_URL=settings.sqlalchemy_url,
        PARALLAB_SECRET_KEY=secrets.token_urlsafe(32),
        PARALLAB_UPLOAD_QUEUE="2",  # 2 threads + 2 waiting per process, for 20 clients: some are turned away
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
    )
    with server("uvicorn2", env, tmp_path, timeout=120) as base:
        ci = ci_phase(base, settings.sqlalchemy_url, clients=CLIENTS, per_client=EACH, timeout=240, prefix="load-test")
        one = one_key_phase(base, settings.sqlalchemy_url, timeout=240, prefix="load-test-one")
    assert ci["problems"] == [], ci
    assert ci["stored"] == CLIENTS * EACH and ci["final"] == {201: CLIENTS * EACH}
    assert not any(code >= 500 and code != 503 for code in ci["codes"]), ci["codes"]  # type: ignore[attr-defined]
    assert one["problems"] == [] and one["stored"] == 1, one
