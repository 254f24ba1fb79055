"""REST: submit, list, read and cancel runs; fetch a run's trace."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from backend.api.deps import CancellerDep, CurrentUser, LocalModeDep, SessionDep, SettingsDep, SubmitterDep
from backend.api.queries import RunListParams
from backend.models import Run
from backend.schemas.runs import RunList, RunRead, RunSummary, TimelineRead
from backend.services import auth as auth_service
from backend.services import reproduce as reproduce_service
from backend.services import runs as run_service
from backend.services import timeline as timeline_service
from backend.services.auth import Principal
from backend.services.redact import error_for, progress_for
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


def run_read(run: Run, viewer: Principal, *, include: Sequence[str] = (), document: dict[str, Any] | None = None) -> RunRead:
    """The API view of a run, with its result document once it has one, less the heavy parts not in
    `include` (named in `result_omitted`). `document`: the stored one when the caller already has it.
    Its error and log tail as `viewer` may read them (the server's paths shortened but for an admin)."""
    if document is None and run.result is not None:
        document = run.result.document
    omitted = [key for key in HEAVY_PARTS if key not in include] if document is not None else []
    if document is not None and omitted:
        document = {k: v for k, v in document.items() if k not in omitted}
    summary = run_summary(run, viewer).model_dump()
    return RunRead(
        **summary,
        spec=run.spec,
        error=error_for(viewer, run.error),
        cancel_requested=run.cancel_requested,
        result=document,
        result_omitted=omitted,
    )


def run_summary(run: Run, viewer: Principal) -> RunSummary:
    """A run's list entry, its log tail as `viewer` may read it."""
    summary = RunSummary.model_validate(run)
    return summary.model_copy(update={"progress": progress_for(viewer, summary.progress)})


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=RunRead)
def create_run(spec: JobSpec, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, local: LocalModeDep) -> RunRead:
    """Resolve a job spec, store it as `queued` and hand it to a worker (503 if the queue is unreachable).

    Refused (422, naming the field and the limit) above any of this server's ceilings, or when the
    predicted memory per rank is above what a rank may use. With `repeats` > 1 the job is queued
    that many times as one repeat group: the answer is its first run, `repeat_run_ids` lists them all."""
    runs = run_service.submit_runs(session=session, settings=settings, spec=spec, source="api", user_id=principal.user_id, local=local)
    first = run_read(runs[0], principal)
    return first.model_copy(update={"repeat_run_ids": [r.id for r in runs]}) if len(runs) > 1 else first


@router.get("", response_model=RunList)
def list_runs(session: SessionDep, viewer: CurrentUser, params: Annotated[RunListParams, Query()]) -> RunList:
    """A page of runs, newest first; an unknown parameter, status, source or strategy is refused (422)."""
    user_id = auth_service.user_filter(session=session, email=params.user)
    filters = {"status": params.status, "strategy": params.strategy, "model": params.model, "source": params.source, "user_id": user_id}
    filters.update(tag=params.tag, search=params.q, straggler=params.straggler)
    try:
        rows, next_cursor = run_service.list_runs(session=session, limit=params.limit, cursor=params.cursor, filters=filters)
    except ValueError as exc:
        raise HTTPException(422, detail=[{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]) from None
    return RunList(items=[run_summary(r, viewer) for r in rows], next_cursor=next_cursor, limit=params.limit)


@router.get("/{run_id}", response_model=RunRead)
def read_run(
    run_id: RunId,
    session: SessionDep,
    viewer: CurrentUser,
    include: Annotated[
        list[Heavy] | None, Query(description="Heavy result parts to include (left out by default): `timeline`.", max_length=4)
    ] = None,
) -> RunRead:
    """A run and, once finished, its result document — without its timeline unless `?include=timeline`
    (`result_omitted` names what was left out; `GET /runs/{id}/timeline` gives it downsampled)."""
    run = run_service.get_run(session=session, run_id=run_id)
    wanted = set(include or ())
    stored = run_service.result_document(session=session, run_id=run.id, omit=[k for k in HEAVY_PARTS if k not in wanted])
    return run_read(run, viewer, include=list(wanted), document=stored)


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
    return run_read(run_service.cancel_run(session=session, run_id=run_id, settings=settings), principal)


@router.post("/{run_id}/reproduce", status_code=status.HTTP_202_ACCEPTED, response_model=RunRead)
def reproduce_run(run_id: RunId, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, local: LocalModeDep) -> RunRead:
    """Re-run an upload's configuration on a pool as the lab's own (traced) run, linked to the upload
    (`reproduces_id`): 202 with the new run. 409 for a run the lab ran itself; 422 when this lab
    cannot run the upload's spec (naming the field)."""
    run = reproduce_service.reproduce(
        session=session, settings=settings, upload_id=run_id, source="api", user_id=principal.user_id, local=local
    )
    return run_read(run, principal)


@router.get("/{run_id}/reproduction")
def read_reproduction(run_id: RunId, session: SessionDep) -> dict[str, Any]:
    """An upload and its newest reproduction (or a reproduction and its upload): stated against
    measured per figure (throughput, step time, peak memory, communication bytes) and the verdict,
    "reproduced within X %" or "not reproduced" (tolerance ±10 %). 404 for a lab run that reproduces nothing."""
    found = reproduce_service.reproduction_of(session=session, run=run_service.get_run(session=session, run_id=run_id))
    if found is None:
        raise HTTPException(404, detail=f"run {run_id} is the lab's own run and reproduces no upload")
    return found.as_json()


@router.get("/{run_id}/flight-recorder")
def read_flight_recorder(run_id: RunId, session: SessionDep, viewer: CurrentUser) -> dict[str, Any]:
    """A failed run's flight-recorder dumps, kept when its ranks failed or were stopped: `report`
    (the first collective where the ranks disagree, what each called, which never arrived; its
    `sentence` leads the run's error) and `dumps` (each rank's, torch's own dump under `torch`;
    null for a rank that wrote none). 404 for a run that kept none."""
    run_service.get_run(session=session, run_id=run_id)
    kept = store.get_flight_recorder(session, run_id)
    if kept is None:
        raise HTTPException(404, detail=f"run {run_id} kept no flight-recorder dumps (only a failed or stopped run's ranks write them)")
    report = kept.get("report")
    if isinstance(report, dict) and isinstance(report.get("sentence"), str):
        report = {**report, "sentence": error_for(viewer, report["sentence"])}
    return {**kept, "report": report}


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
