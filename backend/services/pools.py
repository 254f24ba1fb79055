"""Declared pools, of any kind in the registry (`parallab.core.pools.POOL_KINDS`), and the ledger of
runs a scheduler's agent holds.

A Slurm pool's runs are not sent to a Celery queue: its `parallab slurm-agent` reads them from the
database (`next_to_submit`), because the database is where a run's state already lives — taking
a run, recording its Slurm job id and, later, its end are row-locked transactions that survive
an agent restart, and nothing is lost or delivered twice by a broker the login node may not even
reach. The agent's other writes are here too, one function per piece of a ledger transaction
(`backend.services.ledger.DbLedger` owns the transactions): what Slurm said of a job (`observe`);
how its run ended is the ledger's one fenced `finish`, shared with the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from backend.models import FINISHED_STATUSES, EngineJob, Run, utcnow
from backend.store import pools as store
from backend.store import runs as run_store
from backend.store import workers as worker_store
from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import Observed
from parallab.core.pools import POOL_KINDS, CeleryPool, PoolSettings, PoolTopology, pool_settings
from parallab.core.problems import SpecError


class PoolError(ValueError):
    """A pool cannot be declared as asked (the name is a live Celery pool's, a bad setting)."""


def declare_pool(*, session: Session, name: str, settings: PoolSettings) -> None:
    """Declare (or re-declare) `name` as a pool of `settings`' kind (caller commits). A name that
    Celery workers serve stays theirs: one pool, one engine."""
    if not settings.queued and any(worker.pool == name for worker in worker_store.list_workers(session)):
        raise PoolError(f"pool {name!r} is served by Celery workers; choose another name")
    store.put_pool(session, name=name, kind=settings.kind, settings=settings.model_dump(mode="json"))


def declared_pool(*, session: Session, name: str | None) -> PoolSettings | None:
    """The settings of declared pool `name`, as its kind's model; None if no such pool is declared."""
    pool = store.get_pool(session, name) if name else None
    return pool_settings(pool.kind, pool.settings) if pool is not None else None


def scheduled_pool(*, session: Session, name: str | None) -> PoolSettings | None:
    """The settings of pool `name` when it is a scheduler's (its runs are not queued for workers)."""
    settings = declared_pool(session=session, name=name)
    return settings if settings is not None and not settings.queued else None


def scheduled_pools(*, session: Session) -> dict[str, PoolSettings]:
    """Every declared scheduler's pool (Slurm's, …) by name."""
    found = {p.name: pool_settings(p.kind, p.settings) for p in store.list_pools(session)}
    return {name: settings for name, settings in found.items() if not settings.queued}


@dataclass(frozen=True)
class SettingColumn:
    """One setting of a pool kind, as a column of its table: its field, heading and description."""

    field: str
    heading: str
    description: str


@dataclass(frozen=True)
class KindPools:
    """The declared pools of one scheduler's kind, for the /workers page."""

    kind: str
    title: str
    columns: list[SettingColumn]
    pools: dict[str, dict[str, Any]]
    """Each pool's settings by name, as stored (JSON values), in the columns' order."""


def scheduled_pools_by_kind(*, session: Session) -> list[KindPools]:
    """Every declared scheduler's pool, grouped by kind in the registry's order (`POOL_KINDS`); a
    kind with no pool declared is left out. Columns are the kind's settings, as its model says."""
    declared = scheduled_pools(session=session)
    out = []
    for kind, model in POOL_KINDS.items():
        mine = {name: said for name, said in sorted(declared.items()) if type(said) is model}
        if model.queued or not mine:
            continue
        columns = [
            SettingColumn(field, info.title or field.replace("_", " ").capitalize(), info.description or "")
            for field, info in model.model_fields.items()
        ]
        pools = {name: said.model_dump(mode="json") for name, said in mine.items()}
        out.append(KindPools(kind, model.title or kind, columns, pools))
    return out


def record_topology(*, session: Session, name: str, topology: PoolTopology) -> None:
    """Write how a Celery pool's hosts are wired into its settings (`topology`), declaring the pool
    if it has no row yet; a scheduler's pool keeps its own settings and is refused."""
    current = declared_pool(session=session, name=name) or CeleryPool()
    if not isinstance(current, CeleryPool):
        raise ValueError(f"pool {name!r} is a {current.kind} pool; its topology is not recorded here")
    declare_pool(session=session, name=name, settings=current.model_copy(update={"topology": topology}))


def pool_topology(*, session: Session, name: str) -> PoolTopology | None:
    """The recorded topology of pool `name`, if any."""
    settings = declared_pool(session=session, name=name)
    return settings.topology if isinstance(settings, CeleryPool) else None


def uses_queue(*, session: Session, pool: str | None) -> bool:
    """Whether a run of `pool` is sent to a Celery queue (False: its scheduler's agent takes it from the database)."""
    return scheduled_pool(session=session, name=pool) is None


def place_declared(*, session: Session, job: ResolvedJob) -> str | None:
    """The scheduler's pool the job names, when it names one that can run it; None when it names
    none (SpecError naming the limit when the pool cannot)."""
    settings = scheduled_pool(session=session, name=job.pool)
    if settings is None or job.pool is None:
        return None
    problems = settings.problems(job.pool, job)
    if problems:
        raise SpecError(problems)
    return job.pool


# ---- the agent's ledger ----


def next_to_submit(*, session: Session, pool: str) -> tuple[Run, ResolvedJob] | None:
    """The pool's oldest queued run not yet submitted, locked until the caller commits; a run whose
    frozen job cannot be read is failed here (and the next one looked at)."""
    while (run := store.next_unsubmitted(session, pool)) is not None:
        try:
            return run, ResolvedJob.model_validate(run.job)
        except ValidationError as exc:
            run_store.set_status(session, run, "failed", error=f"invalid job: {exc}")
    return None


def record_submission(*, session: Session, run: Run, engine: str, pool: str, job_id: str, output: str | None) -> EngineJob:
    """The run is in the scheduler now as `job_id` (it stays `queued` until the job starts)."""
    now = utcnow()
    return store.add_engine_job(
        session,
        EngineJob(run_id=run.id, engine=engine, pool=pool, job_id=job_id, state="PENDING", output=output, submitted_at=now, updated_at=now),
    )


def submission_failed(*, session: Session, run: Run, error: str) -> None:
    """The scheduler refused the job (an unknown partition, a bad account): the run fails with its message."""
    run_store.set_status(session, run, "failed", error=error)


def observe(*, session: Session, run_id: str, state: str, reason: str | None, nodes: str | None, running: bool) -> Observed | None:
    """Record the scheduler's view of a run's job; a run whose job started becomes `running`
    (no lease: the scheduler, not a worker, holds it). None if the run is gone."""
    job = store.get_engine_job_for_update(session, run_id)
    run = run_store.get_run_for_update(session, run_id)
    if job is None or run is None:
        return None
    job.state, job.reason, job.updated_at = state, reason, utcnow()
    if nodes:
        job.nodes = nodes
    if running and run.status == "queued":
        run_store.set_status(session, run, "running")
        run.worker_id, run.host = None, (nodes or "").split(",")[0] or None
    return Observed(run.status, run.status == "cancelled" or run.cancel_requested, run.job)


def open_jobs(*, session: Session, pool: str) -> list[EngineJob]:
    """The pool's submitted jobs whose runs the agent has not ended yet."""
    return store.open_engine_jobs(session, pool)


def engine_job(*, session: Session, run_id: str) -> EngineJob | None:
    """A run's job in its scheduler, for the run page (None: a run of a Celery pool)."""
    return store.get_engine_job(session, run_id)


def describe(job: EngineJob) -> str:
    """One line for the run page: the scheduler's job, its state with the scheduler's reason, and its nodes."""
    text = job.reason or f"{job.engine.capitalize()} job {job.job_id} {job.state}"
    return text + (f" on {job.nodes}" if job.nodes else "")


def adopt(*, session: Session, run_id: str, engine: str, pool: str, job_id: str, output: str | None) -> bool:
    """A job found in the scheduler under a run's name that the ledger lacks (the agent died between
    `sbatch` and its commit): record it. False if the run is not a queued or running run of `pool`."""
    if store.get_engine_job(session, run_id) is not None:
        return False
    run = run_store.get_run_for_update(session, run_id)
    if run is None or run.pool != pool or run.status in FINISHED_STATUSES:
        return False
    record_submission(session=session, run=run, engine=engine, pool=pool, job_id=job_id, output=output)
    return True
