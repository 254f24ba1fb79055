"""Uploads stored under the old labels are labelled again by migration 0027: an upload is never
verified and a check it does not carry is "not checked"; the lab's own runs are untouched; the
leaderboard's cells and counts follow; down and up again changes nothing (SQLite and Postgres)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text, update

from backend.db import get_engine, get_sessionmaker
from backend.migrate import downgrade, upgrade
from backend.models import LeaderboardCell, LeaderboardEntry, Run, RunResult
from backend.services import leaderboard as leaderboard_service
from backend.store import leaderboard as leaderboard_store
from parallab.core.result import ResultDocument
from tests.backend.test_leaderboard_median import _snapshot
from tests.ui.factories import make_document, store_run


def stripped() -> ResultDocument:
    """An upload with its gradient check, replica check and loss reference removed."""
    doc = make_document(tokens_per_s=11_633.0, loss_noise=1e-7, seed=1).model_dump(mode="json")
    for key in ("gradient_check", "replica_check", "loss_max_rel_diff_vs_reference"):
        doc["summary"].pop(key)
    doc["loss"]["reference"] = None
    return ResultDocument.model_validate(doc)


def board(session, **kwargs: Any) -> dict[str, dict[str, Any]]:
    query = leaderboard_service.LeaderboardQuery(limit=500, best_only=False, **kwargs)
    return {r["id"]: r for r in leaderboard_service.get_leaderboard(session=session, query=query).rows}


def as_stored_before(url: str, upload_id: str) -> None:
    """The upload as ingest stored it before the relabelling: nothing failed, nothing stated, no
    `checks_not_checked` in its document; the leaderboard rebuilt from the runs."""
    with get_sessionmaker(url)() as session:
        document = session.execute(select(RunResult.document).where(RunResult.run_id == upload_id)).scalar_one()
        summary = {k: v for k, v in document["summary"].items() if k != "checks_not_checked"}
        session.execute(update(RunResult).where(RunResult.run_id == upload_id).values(document={**document, "summary": summary}))
        session.execute(
            update(Run).where(Run.id == upload_id).values(checks_failed=None, checks_stated=None),
            execution_options={"synchronize_session": False},
        )
        leaderboard_store.rebuild(session)
        session.commit()


def test_an_upload_stored_before_is_relabelled_and_the_labs_run_is_unchanged(scratch_url: str) -> None:
    # The rows are written and read through today's models, so at today's schema; the labels are then
    # put back as ingest stored them before 0027, and the database is taken down to 0026 and up again:
    # 0027 relabels on the way up (no model is used below the head, whose columns later migrations add).
    upgrade(scratch_url)
    with get_engine(scratch_url).connect() as conn:
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    with get_sessionmaker(scratch_url)() as session:
        worker = store_run(session, make_document(tokens_per_s=5_816.0, loss_noise=1e-7), source="form").id
        upload = store_run(session, stripped(), source="ci").id
    as_stored_before(scratch_url, upload)
    with get_sessionmaker(scratch_url)() as session:
        assert set(board(session, verified=True)) == {worker, upload}  # the old labels: the forgery listed as verified
        worker_before = session.execute(select(Run.__table__).where(Run.id == worker)).one()
    downgrade(scratch_url, "0026")
    upgrade(scratch_url)
    with get_sessionmaker(scratch_url)() as session:
        assert set(board(session, verified=True)) == {worker}
        assert set(board(session, checks="passed")) == {worker}
        rows = board(session)
        assert rows[upload]["checks_not_checked"] == ["loss", "gradient", "replica"]
        assert rows[worker]["checks_not_checked"] == [] and rows[worker]["checks_stated"] == []
        document = session.execute(select(RunResult.document).where(RunResult.run_id == upload)).scalar_one()
        assert document["summary"]["checks_not_checked"] == ["loss_reference", "gradient_check", "replica_check"]
        assert session.execute(select(Run.__table__).where(Run.id == worker)).one() == worker_before
        entry = session.get(LeaderboardEntry, upload)
        assert entry is not None and entry.checks_stated and "gradient" in (entry.checks_failed or "")
        verified = session.execute(select(LeaderboardCell.runs).where(LeaderboardCell.subset == "verified")).scalars().all()
        assert verified == [1]  # the config's verified cell holds the worker's run alone
    after = _snapshot(scratch_url)
    downgrade(scratch_url, "0026")
    upgrade(scratch_url)
    assert _snapshot(scratch_url) == after
    with get_engine(scratch_url).connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == head
