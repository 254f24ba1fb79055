"""The leaderboard's tables are kept by the write paths themselves, with no hook behind them.

After each kind of write of a run — a worker's result stored, an upload, a status change off
success, a cancel, a delete — the entries, cells and counts equal what `rebuild` recomputes from
the runs (in a savepoint, rolled back). A write that skips the store function (a bare ORM
assignment), or a store function that forgets to maintain the board, leaves them apart: caught.
On SQLite and Postgres.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from backend.db import session_scope
from backend.models import Run
from backend.services.ingest import attach_result, ingest_upload
from backend.store import accounts as accounts_store
from backend.store import leaderboard as leaderboard_store
from backend.store import runs as run_store
from tests.ui.factories import make_document, store_run

TABLES = ("leaderboard_entries", "leaderboard_cells", "leaderboard_counts")


def tables(session: Session) -> dict[str, list[Any]]:
    """Every row of the leaderboard's tables, without the cells' and counts' surrogate ids."""
    out = {}
    for table in TABLES:
        rows = session.execute(text(f"SELECT * FROM {table}")).mappings()
        kept = (tuple(sorted((k, repr(v)) for k, v in r.items() if k != "id" or table == "leaderboard_entries")) for r in rows)
        out[table] = sorted(kept)
    return out


def assert_the_board_matches_the_runs(session: Session) -> None:
    """The maintained tables against `rebuild` from the runs, in this transaction (rolled back)."""
    session.flush()
    kept = tables(session)
    savepoint = session.begin_nested()
    leaderboard_store.rebuild(session)
    rebuilt = tables(session)
    savepoint.rollback()
    assert kept == rebuilt
    assert rebuilt["leaderboard_entries"], "a board with ranked runs"


def queued(session: Session, strategy: str = "ddp") -> Run:
    doc = make_document(strategy=strategy, world_size=2)
    run = Run(name=doc.name, status="queued", source="api", spec={}, strategy=strategy, world_size=2, model="tiny")
    return run_store.add_run(session, run)


def test_each_write_path_keeps_the_board_equal_to_a_rebuild(settings) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        ada = accounts_store.add_user(session, email="oracle@lab.example", password_hash="x", role="member")
        ids = [store_run(session, make_document(strategy=s, world_size=2, tokens_per_s=t, seed=i), source="form").id
               for i, (s, t) in enumerate((("ddp", 10_000.0), ("ddp", 12_000.0), ("fsdp", 9_000.0), ("fsdp", 9_500.0)))]  # fmt: skip
        assert_the_board_matches_the_runs(session)
        # an upload: its uploader stored with it
        upload, _ = ingest_upload(
            session,
            document=make_document(strategy="ddp", world_size=2, tokens_per_s=11_000.0, seed=9),
            idempotency_key=None,
            user_id=ada.id,
        )
        assert_the_board_matches_the_runs(session)
        # a worker's result stored on a running run (the worker's and the pool's path)
        running = queued(session, "fsdp")
        run_store.set_status(session, running, "running")
        attach_result(session, run=running, document=make_document(strategy="fsdp", world_size=2, tokens_per_s=9_900.0, seed=5))
        assert_the_board_matches_the_runs(session)
        # a ranked run's status changed off success, and a queued run cancelled
        run_store.set_status(session, session.get(Run, ids[1]), "failed", error="diverged")
        run_store.set_status(session, queued(session), "cancelled", error="cancelled before it started")
        assert_the_board_matches_the_runs(session)
        # deletes: a worker's run and the upload
        run_store.delete_run(session, ids[2])
        run_store.delete_run(session, upload.id)
        session.commit()
        assert_the_board_matches_the_runs(session)


def test_a_write_that_skips_the_store_function_is_caught(settings) -> None:
    """A bare ORM write of a ranked run's status: nothing follows it behind the caller's back."""
    with session_scope(settings.sqlalchemy_url) as session:
        ids = [store_run(session, make_document(strategy="ddp", world_size=2, tokens_per_s=t, seed=i), source="form").id
               for i, t in enumerate((10_000.0, 12_000.0))]  # fmt: skip
        session.get(Run, ids[0]).status = "failed"
        session.commit()
        with pytest.raises(AssertionError):
            assert_the_board_matches_the_runs(session)


@pytest.mark.parametrize("write", ["result", "status", "delete"])
def test_a_store_function_that_forgets_the_board_is_caught(settings, monkeypatch, write: str) -> None:
    """The oracle fails for each write path whose maintenance is taken out."""
    with session_scope(settings.sqlalchemy_url) as session:
        ids = [store_run(session, make_document(strategy="ddp", world_size=2, tokens_per_s=t, seed=i), source="form").id
               for i, t in enumerate((10_000.0, 12_000.0))]  # fmt: skip
        monkeypatch.setattr(run_store.leaderboard, "follow_run", lambda *a, **kw: None)
        monkeypatch.setattr(run_store.leaderboard, "forget_run", lambda *a, **kw: None)
        if write == "result":
            store_run(session, make_document(strategy="ddp", world_size=2, tokens_per_s=11_000.0, seed=7), source="form")
        elif write == "status":
            run_store.set_status(session, session.get(Run, ids[0]), "failed", error="diverged")
        else:
            run_store.delete_run(session, ids[0])
        with pytest.raises(AssertionError):
            assert_the_board_matches_the_runs(session)
        assert session.execute(select(Run.id)).first() is not None
