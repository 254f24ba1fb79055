"""SQL for the lab's reference loss curves. Callers own the transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from backend.models import ReferenceCurve, utcnow


def get_curve(session: Session, key: str, device: str) -> ReferenceCurve | None:
    return session.get(ReferenceCurve, (key, device))


def add_curve(
    session: Session, *, key: str, device: str, model: str, seed: int, workload: dict[str, Any], loss: list[float], run_id: str | None
) -> bool:
    """Store a curve unless one is already stored for (key, device): the first writer wins, a
    concurrent second one is a no-op (INSERT … ON CONFLICT DO NOTHING). True if this call stored it."""
    values = {
        "key": key,
        "device": device,
        "model": model,
        "seed": seed,
        "steps": len(loss),
        "workload": workload,
        "loss": loss,
        "run_id": run_id,
        "created_at": utcnow(),
    }
    insert = sqlite_insert if session.get_bind().dialect.name == "sqlite" else pg_insert
    statement = insert(ReferenceCurve).values(**values).on_conflict_do_nothing(index_elements=["key", "device"])
    return session.execute(statement.returning(ReferenceCurve.key)).scalar_one_or_none() is not None
