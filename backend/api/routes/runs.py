"""REST: submit, list, read and cancel runs; fetch a run's trace."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from backend.api.deps import CancellerDep, LocalModeDep, SessionDep, SettingsDep, SubmitterDep
from backend.models import Run
from backend.schemas.runs import RunList, RunRead, RunSummary
from backend.services import auth as auth_service
from backend.services import runs as run_service
from backend.store import runs as store
from parallab.core.result import MAX_RANKS
from parallab.core.spec import JobSpec

router = APIRouter(prefix="/runs", tags=["runs"])

RunId = Annotated[str, Path(max_length=64, description="A run's id (32 hex digits).")]


def run_read(run: Run) -> RunRead:
    """The API view of a run, with its result document once it has one."""
    return RunRead(
        **RunSummary.model_validate(run).model_dump(),
        spec=run.spec,
        error=run.error,
        cancel_requested=run.cancel_requested,
        result=run.result.document if run.result is not None else None,
    )


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=RunRead)
def create_run(spec: JobSpec, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, local: LocalModeDep) -> RunRead:
    """Resolve a job spec, store it as `queued` and hand it to a worker (503 if the queue is unreachable).

    Refused (422, naming the field and the limit) above any of this server's ceilings, or when the
    predicted memory per rank is above what a rank may use."""
    return run_read(
        run_service.submit_run(session=session, settings=settings, spec=spec, source="api", user_id=principal.user_id, local=local)
    )


@router.get("", response_model=RunList)
def list_runs(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    status_: Annotated[str | None, Query(alias="status", max_length=16)] = None,
    strategy: Annotated[str | None, Query(max_length=32)] = None,
    model: Annotated[str | None, Query(max_length=64)] = None,
    source: Annotated[str | None, Query(max_length=16)] = None,
    user: Annotated[str | None, Query(description="Who submitted or uploaded the runs (email).", max_length=320)] = None,
) -> RunList:
    user_id = auth_service.user_filter(session=session, email=user)
    try:
        rows, next_cursor = run_service.list_runs(
            session=session,
            limit=limit,
            cursor=cursor,
            filters={"status": status_, "strategy": strategy, "model": model, "source": source, "user_id": user_id},
        )
    except ValueError as exc:
        raise HTTPException(422, detail=[{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]) from None
    return RunList(items=[RunSummary.model_validate(r) for r in rows], next_cursor=next_cursor, limit=limit)


@router.get("/{run_id}", response_model=RunRead)
def read_run(run_id: RunId, session: SessionDep) -> RunRead:
    return run_read(run_service.get_run(session=session, run_id=run_id))


@router.post("/{run_id}/cancel", response_model=RunRead)
def cancel_run(run_id: RunId, session: SessionDep, settings: SettingsDep, principal: CancellerDep) -> RunRead:
    """Cancel a run: a member only its own, an admin any."""
    run_service.check_owner(principal=principal, run=run_service.get_run(session=session, run_id=run_id))
    return run_read(run_service.cancel_run(session=session, run_id=run_id, settings=settings))


@router.get("/{run_id}/trace", responses={200: {"content": {"application/gzip": {}}}})
def read_trace(run_id: RunId, session: SessionDep, rank: Annotated[int, Query(ge=0, lt=MAX_RANKS)] = 0) -> Response:
    """One rank's Chrome trace (gzipped JSON): open it in https://ui.perfetto.dev or chrome://tracing."""
    run_service.get_run(session=session, run_id=run_id)
    data = store.get_trace(session, run_id, rank)
    if data is None:
        raise HTTPException(404, detail=f'run {run_id} has no trace for rank {rank} (submit with "trace": true)')
    return Response(
        content=data,
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="parallab-{run_id}-rank{rank}.json.gz"'},
    )
