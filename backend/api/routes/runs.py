"""REST: submit, list, read and cancel runs; fetch a run's trace."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from backend.api.deps import CancellerDep, LocalModeDep, SessionDep, SettingsDep, SubmitterDep
from backend.api.queries import RunListParams
from backend.models import Run
from backend.schemas.runs import RunList, RunRead, RunSummary, TimelineRead
from backend.services import auth as auth_service
from backend.services import runs as run_service
from backend.services import timeline as timeline_service
from backend.store import runs as store
from parallab.core.result import MAX_RANKS
from parallab.core.spec import JobSpec

router = APIRouter(prefix="/runs", tags=["runs"])

RunId = Annotated[str, Path(max_length=64, description="A run's id (32 hex digits).")]


Heavy = Literal["timeline"]
HEAVY_PARTS: tuple[Heavy, ...] = ("timeline",)
"""Result keys left out of a run's API view unless asked for with `?include=`: a traced
run's timeline can hold 80,000 events (megabytes). The run page loads it downsampled from
`GET /runs/{id}/timeline`; the full detail is in the Perfetto trace."""


def run_read(run: Run, *, include: Sequence[str] = (), document: dict[str, Any] | None = None) -> RunRead:
    """The API view of a run, with its result document once it has one, less the heavy parts not in
    `include` (named in `result_omitted`). `document`: the stored one when the caller already has it."""
    if document is None and run.result is not None:
        document = run.result.document
    omitted = [key for key in HEAVY_PARTS if key not in include] if document is not None else []
    if document is not None and omitted:
        document = {k: v for k, v in document.items() if k not in omitted}
    return RunRead(
        **RunSummary.model_validate(run).model_dump(),
        spec=run.spec,
        error=run.error,
        cancel_requested=run.cancel_requested,
        result=document,
        result_omitted=omitted,
    )


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=RunRead)
def create_run(spec: JobSpec, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, local: LocalModeDep) -> RunRead:
    """Resolve a job spec, store it as `queued` and hand it to a worker (503 if the queue is unreachable).

    Refused (422, naming the field and the limit) above any of this server's ceilings, or when the
    predicted memory per rank is above what a rank may use. With `repeats` > 1 the job is queued
    that many times as one repeat group: the answer is its first run, `repeat_run_ids` lists them all."""
    runs = run_service.submit_runs(session=session, settings=settings, spec=spec, source="api", user_id=principal.user_id, local=local)
    first = run_read(runs[0])
    return first.model_copy(update={"repeat_run_ids": [r.id for r in runs]}) if len(runs) > 1 else first


@router.get("", response_model=RunList)
def list_runs(session: SessionDep, params: Annotated[RunListParams, Query()]) -> RunList:
    """A page of runs, newest first; an unknown parameter, status, source or strategy is refused (422)."""
    user_id = auth_service.user_filter(session=session, email=params.user)
    filters = {"status": params.status, "strategy": params.strategy, "model": params.model, "source": params.source, "user_id": user_id}
    filters.update(tag=params.tag, search=params.q)
    try:
        rows, next_cursor = run_service.list_runs(session=session, limit=params.limit, cursor=params.cursor, filters=filters)
    except ValueError as exc:
        raise HTTPException(422, detail=[{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]) from None
    return RunList(items=[RunSummary.model_validate(r) for r in rows], next_cursor=next_cursor, limit=params.limit)


@router.get("/{run_id}", response_model=RunRead)
def read_run(
    run_id: RunId,
    session: SessionDep,
    include: Annotated[
        list[Heavy] | None, Query(description="Heavy result parts to include (left out by default): `timeline`.", max_length=4)
    ] = None,
) -> RunRead:
    """A run and, once finished, its result document — without its timeline unless `?include=timeline`
    (`result_omitted` names what was left out; `GET /runs/{id}/timeline` gives it downsampled)."""
    run = run_service.get_run(session=session, run_id=run_id)
    wanted = set(include or ())
    stored = run_service.result_document(session=session, run_id=run.id, omit=[k for k in HEAVY_PARTS if k not in wanted])
    return run_read(run, include=list(wanted), document=stored)


@router.get("/{run_id}/timeline", response_model=TimelineRead)
def read_timeline(
    run_id: RunId,
    session: SessionDep,
    max_events: Annotated[int, Query(ge=1, le=timeline_service.MAX_EVENTS_LIMIT)] = timeline_service.DEFAULT_MAX_EVENTS,
    buckets: Annotated[int, Query(ge=1, le=100_000, description="The chart's width in buckets (about its pixels).")] = (
        timeline_service.DEFAULT_BUCKETS
    ),
) -> TimelineRead:
    """A run's timeline, downsampled to at most `max_events` bars: on each (rank, op) lane, events
    closer than the step's span / `buckets` merge into one bar (`count` events, `busy_us` of them
    busy, `bytes` summed). The full detail is in the Perfetto trace (`/runs/{id}/trace?rank=N`)."""
    timeline = timeline_service.run_timeline(session=session, run_id=run_id, buckets=buckets, max_events=max_events)
    return TimelineRead(events=timeline.events, total=timeline.total, downsampled=timeline.downsampled, bucket_us=timeline.bucket_us)


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
