"""REST: the fleet — every worker, alive or not, what it runs now, and each pool's queue."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from backend.api.deps import SessionDep, SettingsDep
from backend.api.queries import WorkerListParams
from backend.queue import queue_lengths
from backend.schemas.workers import PoolRead, WorkerList, WorkerRead
from backend.services import workers as fleet

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkerList)
def list_workers(session: SessionDep, settings: SettingsDep, _: Annotated[WorkerListParams, Query()]) -> WorkerList:
    """Workers by pool (`alive`: heartbeated within the TTL). Reading the fleet also fails runs whose lease lapsed."""
    fleet.reconcile_lost_runs(session=session, settings=settings)
    session.commit()
    pools = fleet.fleet(session=session, settings=settings, queue_lengths=lambda names: queue_lengths(settings, names))
    return WorkerList(
        items=[WorkerRead.model_validate(w) for p in pools for w in p.workers],
        pools=[PoolRead.model_validate(p) for p in pools],
    )
