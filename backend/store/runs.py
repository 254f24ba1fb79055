"""All SQL that reads and writes runs, their results, ranks, comm rows, and traces (tokens: store.accounts).

Services call these; routes never touch the session directly. Bulk rows go in with one batched
insert per table. Callers own the transaction (one write, one transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from backend.models import CommMetric, RankMetric, Run, RunResult, RunTrace, utcnow
from backend.store import leaderboard


def add_run(session: Session, run: Run) -> Run:
    session.add(run)
    session.flush()
    return run


def get_run(session: Session, run_id: str) -> Run | None:
    return session.get(Run, run_id)


def get_run_for_update(session: Session, run_id: str) -> Run | None:
    """The run row, locked on Postgres so two workers can't both start it."""
    return session.execute(select(Run).where(Run.id == run_id).with_for_update()).scalar_one_or_none()


def get_run_by_idempotency_key(session: Session, key: str) -> Run | None:
    return session.execute(select(Run).where(Run.idempotency_key == key)).scalar_one_or_none()


def list_runs(
    session: Session,
    *,
    limit: int,
    before: tuple[datetime, str] | None = None,
    status: str | None = None,
    strategy: str | None = None,
    model: str | None = None,
    source: str | None = None,
    user_id: int | None = None,
) -> list[Run]:
    """Newest first; keyset paging on (created_at, id) so pages stay fast with many runs."""
    query = select(Run).order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
    if before is not None:
        created, run_id = before
        query = query.where((Run.created_at < created) | ((Run.created_at == created) & (Run.id < run_id)))
    for column, value in ((Run.status, status), (Run.strategy, strategy), (Run.model, model), (Run.source, source), (Run.user_id, user_id)):
        if value is not None:
            query = query.where(column == value)
    return list(session.execute(query).scalars())


def get_runs(session: Session, run_ids: Sequence[str]) -> list[Run]:
    rows = {r.id: r for r in session.execute(select(Run).where(Run.id.in_(list(run_ids)))).scalars()}
    return [rows[i] for i in run_ids if i in rows]


def get_documents(session: Session, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    rows = session.execute(select(RunResult.run_id, RunResult.document).where(RunResult.run_id.in_(list(run_ids))))
    return {run_id: doc for run_id, doc in rows}


def set_status(session: Session, run: Run, status: str, *, error: str | None = None) -> None:
    run.status = status
    now = utcnow()
    if status == "running":
        run.started_at = now
    if status in ("succeeded", "failed", "cancelled"):
        run.finished_at = now
    if error is not None:
        run.error = error


def set_progress(session: Session, run_id: str, progress: dict[str, Any]) -> None:
    session.execute(update(Run).where(Run.id == run_id).values(progress=progress))


def cancel_requested(session: Session, run_id: str) -> bool:
    return bool(session.execute(select(Run.cancel_requested).where(Run.id == run_id)).scalar_one_or_none())


def store_result(
    session: Session,
    run: Run,
    *,
    document: dict[str, Any],
    summary_columns: dict[str, Any],
    rank_rows: list[dict[str, Any]],
    comm_rows: list[dict[str, Any]],
    traces: dict[int, bytes],
) -> None:
    """The result document and its rows — one batched insert per table, caller's transaction."""
    for key, value in summary_columns.items():
        setattr(run, key, value)
    session.add(RunResult(run_id=run.id, schema_version=document["schema_version"], document=document))
    session.flush()
    if rank_rows:
        session.execute(insert(RankMetric), [{"run_id": run.id, **row} for row in rank_rows])
    if comm_rows:
        session.execute(insert(CommMetric), [{"run_id": run.id, **row} for row in comm_rows])
    if traces:
        session.execute(insert(RunTrace), [{"run_id": run.id, "rank": r, "data": data} for r, data in traces.items()])


def get_trace(session: Session, run_id: str, rank: int) -> bytes | None:
    return session.execute(select(RunTrace.data).where(RunTrace.run_id == run_id, RunTrace.rank == rank)).scalar_one_or_none()


def trace_ranks(session: Session, run_id: str) -> list[int]:
    return list(session.execute(select(RunTrace.rank).where(RunTrace.run_id == run_id).order_by(RunTrace.rank)).scalars())


def count_runs(session: Session) -> int:
    return session.execute(select(func.count()).select_from(Run)).scalar_one()


def delete_run(session: Session, run_id: str) -> None:
    leaderboard.remove_entry(session, run_id)  # its entry and its config's cell, in this transaction
    session.execute(delete(Run).where(Run.id == run_id))
