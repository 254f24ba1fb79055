"""Submitting, reading and cancelling runs.

A spec is resolved once, here, at submission (`parallab.core.jobs.resolve_job`): the run row
keeps the frozen `ResolvedJob` in `job` — what the worker and the ranks run — and the resolved,
resubmittable spec in `spec`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINISHED_STATUSES, Run
from backend.models.base import new_id
from backend.queue import enqueue_run
from backend.services import pools, quotas
from backend.services import workers as fleet
from backend.services.auth import Forbidden, Principal
from backend.services.errors import DomainError, capped
from backend.services.hardware import check_precision
from backend.services.recipes import job_columns
from backend.store import runs as store
from parallab.core.fit import GIB, MemoryFit, memory_fit
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.prediction import predict
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.spec import MAX_TAGS, JobSpec, RepeatOf, Tag

log = logging.getLogger(__name__)


class RunNotFound(DomainError, LookupError):
    """No run has this id (404; the id is echoed, capped)."""

    status_code = 404

    def http_detail(self) -> Any:
        return f"no run {capped(self.args[0])!r}"


class RunStateError(DomainError, ValueError):
    """The run is not in a state that allows what was asked (409)."""

    status_code = 409


class QueueUnavailable(DomainError, RuntimeError):
    """The job queue could not be reached: the run was stored, then marked failed, not left queued (503)."""

    status_code = 503

    def __init__(self, run: Run):
        self.run = run
        super().__init__("the job queue is unreachable; the run was not queued")


def host_memory_bytes() -> int:
    """This host's physical memory."""
    import psutil

    return int(psutil.virtual_memory().total)


def rank_memory_limit(settings: Settings, *, local: bool, world_size: int) -> tuple[int | None, str]:
    """(bytes one rank may use, where that comes from): the setting if set; else, in local mode,
    this host's memory shared by the job's ranks; else no limit."""
    if settings.worker.max_memory_per_rank_bytes:
        return settings.worker.max_memory_per_rank_bytes, "the setting PARALLAB_MAX_MEMORY_PER_RANK_BYTES"
    if local:
        total = host_memory_bytes()
        return total // max(world_size, 1), f"this host's {total / GIB:.1f} GiB shared by {world_size} rank(s)"
    return None, ""


@dataclass(frozen=True)
class CheckedJob:
    """A resolved job, its prediction and its memory fit (None: nothing to hold it against)."""

    job: ResolvedJob
    prediction: dict[str, Any]
    fit: MemoryFit | None


def check_spec(*, spec: JobSpec, settings: Settings, local: bool) -> CheckedJob:
    """Resolve a spec against this deployment's limits (raises SpecError) and predict its memory fit."""
    job = resolve_job(spec, settings.limits)
    prediction = predict(job)
    limit, source = rank_memory_limit(settings, local=local, world_size=job.world_size)
    return CheckedJob(job, prediction, memory_fit(job, prediction, limit_per_rank_bytes=limit, source=source))


def validate_spec(*, spec: JobSpec, settings: Settings, local: bool = False) -> ResolvedJob:
    """A job that may run here: every rule, every limit and the memory fit checked (raises SpecError)."""
    checked = check_spec(spec=spec, settings=settings, local=local)
    if checked.fit is not None and not checked.fit.fits:
        raise SpecError(checked.fit.problems())
    return checked.job


N_D = frozenset({"layout", "3d", "hybrid", "hsdp"})
"""Strategies whose name does not say their layout: a run's name spells its degrees out."""


def run_name(spec: JobSpec, job: ResolvedJob) -> str:
    """The name of a run submitted without one, from what it is: the model (a pasted config's
    model_type and shape, a preset, or a shape changed from one) and the layout, e.g.
    "llama L2·h64 · fsdp ×2" or "tiny · layout ×4 (dp_shard=2,tp=2)"."""
    wl = job.workload
    shape = f"L{wl.num_layers}·h{wl.hidden_size}"
    pasted = spec.workload.hf_config
    if isinstance(pasted, dict) and isinstance(pasted.get("model_type"), str):
        model = f"{pasted['model_type']} {shape}"
    elif wl.family == "hf":  # a config's shape given field by field (a run again of one)
        model = f"hf {shape}"
    elif job.custom_fields:
        model = f"custom {shape} (from {spec.workload.model})"
    else:
        model = spec.workload.model
    layout = f" ({job.layout.label()})" if job.strategy in N_D and job.layout is not None else ""
    return f"{model} · {job.strategy} ×{job.world_size}{layout}"


def place(*, session: Session, job: ResolvedJob, settings: Settings) -> str:
    """The pool a valid job runs on — the Slurm pool it names, or a worker pool that can run it —
    checked against what that pool's device can train in. SpecError naming the field otherwise.
    The submit and the form's live check both call this, so the form refuses all the submit does."""
    pool = pools.place_declared(session=session, job=job) or fleet.place(session=session, job=job, settings=settings)
    check_precision(session=session, settings=settings, job=job, pool=pool)
    return pool


def create_run(
    *,
    session: Session,
    spec: JobSpec,
    settings: Settings,
    source: str,
    user_id: int | None = None,
    local: bool = False,
    job: ResolvedJob | None = None,
) -> Run:
    """Store a `queued` run for a valid spec, its resolved job frozen in the row (caller commits, then enqueues).

    `user_id`: who submitted it (None in local mode). `local`: the request came through local mode,
    where the ranks share this host's memory. `job`: the spec's job as `validate_spec` already gave
    it (the form's check, a repeat group), so a spec is resolved once; None resolves it here. The
    run is placed on the Slurm pool it names, or on a pool that can run it
    (SpecError, a 422 naming the pool and the limit, if none can), and the pool's device, when a
    calibration recorded it, must be able to train in the job's precision. QuotaExceeded
    when the user already has as many runs queued or running as they may."""
    job = job if job is not None else validate_spec(spec=spec, settings=settings, local=local)
    quotas.check_new_runs(session=session, settings=settings, user_id=user_id, adding=1)
    pool = place(session=session, job=job, settings=settings)
    return store.add_run(
        session,
        Run(
            name=job.spec.name or run_name(spec, job),
            status="queued",
            source=source,
            spec=job.spec.model_dump(mode="json"),
            job=job.model_dump(mode="json"),
            strategy=job.strategy,
            world_size=job.world_size,
            model=job.workload.model,
            user_id=user_id,
            pool=pool,
            **job_columns(job),
        ),
    )


def repeat_specs(spec: JobSpec, group: str) -> list[JobSpec]:
    """The spec once per repeat it asks for, each naming its place in the repeat group `group`
    (one run asks for no group: its `repeat` is cleared, whatever the client sent)."""
    if spec.repeats == 1:
        return [spec.model_copy(update={"repeat": None})]
    return [spec.model_copy(update={"repeat": RepeatOf(group=group, index=i, of=spec.repeats)}) for i in range(1, spec.repeats + 1)]


def with_repeat(job: ResolvedJob, one: JobSpec) -> ResolvedJob:
    """`job` as one run of its repeat group: resolution leaves `repeat` as the spec gave it, so a
    group's job is resolved once and each run's copy differs in that field alone."""
    return job.model_copy(update={"spec": job.spec.model_copy(update={"repeat": one.repeat})})


def create_runs(
    *,
    session: Session,
    spec: JobSpec,
    settings: Settings,
    source: str,
    user_id: int | None = None,
    local: bool = False,
    job: ResolvedJob | None = None,
) -> list[Run]:
    """The spec's `repeats` runs as one repeat group, in queue order (caller commits, then enqueues);
    the quota is checked for all of them first, so a refused group leaves nothing behind. The spec
    is resolved once (or not at all when `job`, its checked job, is given)."""
    quotas.check_new_runs(session=session, settings=settings, user_id=user_id, adding=spec.repeats)
    job = job if job is not None else validate_spec(spec=spec, settings=settings, local=local)
    return [
        create_run(session=session, spec=one, settings=settings, source=source, user_id=user_id, local=local, job=with_repeat(job, one))
        for one in repeat_specs(spec, new_id())
    ]


def enqueue_stored(*, session: Session, settings: Settings, runs: Sequence[Run]) -> None:
    """Hand committed runs to their queues in order. Once the broker refuses one, that run and every
    later one are marked failed rather than left queued forever (commits), and QueueUnavailable says so."""
    queued = [run for run in runs if pools.uses_queue(session=session, pool=run.pool)]  # a Slurm pool's agent reads the database
    for i, run in enumerate(queued):
        try:
            enqueue_run(settings, run.id, pool=run.pool)
        except Exception as exc:  # any failure to publish: the runs must not look queued
            log.exception("could not enqueue run %s", run.id)
            for rest in queued[i:]:
                store.set_status(session, rest, "failed", error=f"could not reach the job queue: {exc}")
            session.commit()
            raise QueueUnavailable(run) from exc


def submit_runs(
    *,
    session: Session,
    spec: JobSpec,
    settings: Settings,
    source: str,
    user_id: int | None = None,
    local: bool = False,
    job: ResolvedJob | None = None,
) -> list[Run]:
    """Commit the spec's runs (its `repeats`), then enqueue them (Celery's rule: enqueue only what is committed).
    `job`: the spec's job as a check already resolved it (the form), not resolved again.

    If the broker is unreachable the run is marked failed rather than left queued forever, and
    QueueUnavailable says so.
    """
    runs = create_runs(session=session, spec=spec, settings=settings, source=source, user_id=user_id, local=local, job=job)
    session.commit()
    enqueue_stored(session=session, settings=settings, runs=runs)
    return runs


def submit_run(*, session: Session, spec: JobSpec, settings: Settings, source: str, user_id: int | None = None, local: bool = False) -> Run:
    """`submit_runs`, answering with the first run (the only one unless the spec asks for repeats)."""
    return submit_runs(session=session, spec=spec, settings=settings, source=source, user_id=user_id, local=local)[0]


def get_run(*, session: Session, run_id: str) -> Run:
    run = store.get_run(session, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def result_document(*, session: Session, run_id: str, omit: Sequence[str] = ()) -> dict[str, Any] | None:
    """A run's result document without the top-level keys in `omit` (left out in the database)."""
    found = store.get_document(session, run_id, omit=omit)
    return found[0] if found is not None else None


def list_runs(*, session: Session, limit: int, cursor: str | None, filters: dict[str, Any]) -> tuple[list[Run], str | None]:
    """A page of runs, newest first, and the cursor of the next page (None at the end)."""
    before = decode_cursor(cursor) if cursor else None
    rows = store.list_runs(session, limit=limit + 1, before=before, **filters)
    page, more = rows[:limit], len(rows) > limit
    return page, (encode_cursor(page[-1]) if more and page else None)


def encode_cursor(run: Run) -> str:
    return f"{run.created_at.isoformat()}|{run.id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, run_id = cursor.rsplit("|", 1)
        return datetime.fromisoformat(created), run_id
    except ValueError:
        raise ValueError("cursor is not one this API returned") from None


def may_change(*, principal: Principal, run: Run) -> bool:
    """Whether `principal` may change `run` (cancel it, edit its tags): its submitter or an admin."""
    return principal.may("cancel") and principal.owns(run.user_id)


def check_owner(*, principal: Principal, run: Run) -> None:
    """Raise Forbidden unless `principal` submitted `run` or is an admin (or the local user)."""
    if not principal.owns(run.user_id):
        raise Forbidden("only the member who submitted or uploaded a run, or an admin, can cancel it")


def cancel_run(*, session: Session, run_id: str, settings: Settings | None = None) -> Run:
    """A queued run is cancelled at once; a running one is flagged and its worker kills it; a running
    one whose worker is lost (its lease lapsed) is cancelled at once, and the next worker on its
    host kills its orphaned ranks (commits)."""
    run = store.get_run_for_update(session, run_id)
    if run is None:
        raise RunNotFound(run_id)
    if run.status in FINISHED_STATUSES:
        raise RunStateError(f"run is already {run.status}")
    if run.status == "queued":
        store.set_status(session, run, "cancelled", error="cancelled before it started")
    elif settings is not None and fleet.lease_lapsed(session=session, run=run, settings=settings):
        run.cancel_requested = True
        fleet.mark_lost(
            session=session,
            run=run,
            settings=settings,
            status="cancelled",
            error=f"cancelled; {fleet.lost_reason(session, run)}",
        )
    else:
        run.cancel_requested = True
    session.commit()
    return run


WATCH_MAX = 200
"""The most runs one page may watch in a poll (a sweep's candidates × repeats stay far below it)."""


def watch_states(*, session: Session, run_ids: Sequence[str]) -> dict[str, Any]:
    """What a waiting page polls: each asked run's status and whether it has finished, in the order
    asked, and the ids that name no run. One query, whatever the number of runs."""
    if len(run_ids) > WATCH_MAX:
        raise ValueError(f"ids: at most {WATCH_MAX} runs per poll, got {len(run_ids)}")
    runs = store.get_runs(session, list(dict.fromkeys(run_ids)))
    found = {r.id for r in runs}
    return {
        "runs": [{"id": r.id, "status": r.status, "finished": r.status in FINISHED_STATUSES} for r in runs],
        "missing": [i for i in dict.fromkeys(run_ids) if i not in found],
    }


_TAGS = TypeAdapter(list[Tag])


def parse_tags(text: str) -> list[str]:
    """Comma-separated tags as the form and the run page take them: each 1–64 characters, at most
    20 (a spec's rule); SpecError on `tags` naming the problem."""
    tags = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if len(tags) > MAX_TAGS:
        raise SpecError([SpecProblem(("tags",), f"at most {MAX_TAGS} tags, got {len(tags)}")])
    try:
        return _TAGS.validate_python(tags)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError([SpecProblem(("tags",), f"tag {tags[int(err['loc'][0])]!r:.80}: {err['msg']}")]) from None


def set_run_tags(*, session: Session, run_id: str, text: str) -> list[str]:
    """Replace a run's tags from the run page's box (one transaction: all or none)."""
    get_run(session=session, run_id=run_id)
    tags = parse_tags(text)
    store.set_tags(session, run_id, tags)
    session.commit()
    return tags


def flight_recorder_dumps(*, session: Session, run_id: str) -> int | None:
    """How many ranks' flight-recorder dumps a failed run kept (`GET /runs/{id}/flight-recorder`); None: none kept."""
    return store.flight_recorder_dumps(session, run_id)


def tags_of(*, session: Session, run_ids: Sequence[str]) -> dict[str, list[str]]:
    return store.tags_of(session, run_ids)


def known_tags(*, session: Session) -> list[str]:
    return store.all_tags(session)
