"""The worker's claim reads the job frozen into the run row; a row queued before jobs were frozen is
resolved once there and the job stored with it. On SQLite and Postgres; no ranks launched."""

from __future__ import annotations

from typing import Any

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run
from backend.store import runs as store
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.spec import JobSpec
from workers.execute import _claim

SPEC: dict[str, Any] = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "fsdp", "world_size": 2}}


def add_run(settings: Settings, spec: dict[str, Any], job: ResolvedJob | None, status: str = "queued") -> str:
    with session_scope(settings.sqlalchemy_url) as session:
        run = Run(
            name=None,
            status=status,
            source="api",
            spec=spec,
            job=job.model_dump(mode="json") if job else None,
            strategy=spec["strategy"]["name"],
            world_size=spec["strategy"]["world_size"],
            model="tiny",
        )
        return store.add_run(session, run).id


def stored(settings: Settings, run_id: str) -> Run:
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run(session, run_id)
        assert run is not None
        session.expunge(run)
        return run


def test_a_run_without_a_frozen_job_is_resolved_once_and_keeps_it(settings: Settings) -> None:
    run_id = add_run(settings, SPEC, job=None)
    job = _claim(settings, run_id)
    expected = resolve_job(JobSpec.model_validate(SPEC), Limits(max_world_size=settings.max_world_size, max_steps=settings.max_steps))
    assert job == expected
    run = stored(settings, run_id)
    assert run.status == "running" and run.job is not None
    assert ResolvedJob.model_validate(run.job) == expected


def test_the_frozen_job_is_run_as_it_was_resolved(settings: Settings) -> None:
    """No rule runs again at the claim: the frozen job wins over the row's spec and today's limits."""
    frozen = resolve_job(JobSpec.model_validate({**SPEC, "strategy": {"name": "ddp", "world_size": 8}}))
    assert frozen.world_size > settings.max_world_size
    run_id = add_run(settings, SPEC, job=frozen)
    assert _claim(settings, run_id) == frozen
    assert stored(settings, run_id).status == "running"


def test_an_invalid_unfrozen_spec_fails_the_run_naming_the_field(settings: Settings) -> None:
    run_id = add_run(settings, {**SPEC, "strategy": {"name": "tp", "world_size": 64}}, job=None)
    assert _claim(settings, run_id) is None
    run = stored(settings, run_id)
    assert run.status == "failed" and run.job is None
    assert run.error is not None and run.error.startswith("invalid spec:") and "strategy.world_size" in run.error


def test_a_run_that_is_not_queued_is_not_claimed(settings: Settings) -> None:
    run_id = add_run(settings, SPEC, job=None, status="cancelled")
    assert _claim(settings, run_id) is None
    run = stored(settings, run_id)
    assert run.status == "cancelled" and run.job is None
