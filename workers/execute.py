"""Run a job and turn its ranks' records into a result document.

`parallab bench` calls :func:`run_and_collect` directly with a `ResolvedJob`; the Celery task calls
:func:`execute_run`, which adds the database around it: a status guard, the frozen job of the run
row, live progress, cancel, and one transaction for the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run
from backend.services.hardware import latest_profile
from backend.services.ingest import attach_result
from backend.store import runs as store
from parallab.core.hardware import HardwareProfile, load_catalogue
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.problems import SpecError
from parallab.core.result import ResultDocument
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from workers.aggregate import build_result, read_rank_records
from workers.launcher import LaunchOutcome, launch

log = logging.getLogger(__name__)


@dataclass
class Collected:
    outcome: LaunchOutcome
    document: ResultDocument | None = None
    traces: dict[int, bytes] = field(default_factory=dict)
    error: str | None = None
    """Why it failed, with the log tail, when it did."""


def read_traces(run_dir: RunDir, world_size: int, cap_bytes: int) -> dict[int, bytes]:
    """Each rank's gzipped Chrome trace, skipping any over the cap."""
    traces = {}
    for rank in range(world_size):
        path = run_dir.trace(rank)
        if path.exists() and path.stat().st_size <= cap_bytes:
            traces[rank] = path.read_bytes()
    return traces


def run_and_collect(
    job: ResolvedJob,
    run_dir: Path,
    *,
    settings: Settings,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    profile: HardwareProfile | None = None,
) -> Collected:
    """Launch `job` in `run_dir` under the settings' limits and build its result document; the
    prediction's step time uses the pool's calibrated `profile` when there is one (issue 14)."""
    files = RunDir(run_dir)
    outcome = launch(
        job,
        files,
        timeout_s=settings.max_job_seconds,
        trace_cap_bytes=settings.max_trace_bytes,
        cache_dir=settings.resolved_home / "cache" / "reference",
        on_progress=on_progress,
        should_cancel=should_cancel,
    )
    if not outcome.ok:
        return Collected(outcome, error=f"training process failed: {outcome.reason}\n--- log tail ---\n{outcome.log_tail}")
    try:
        catalogue = load_catalogue(settings.hardware_catalogue)
        document = build_result(job, read_rank_records(files, job.world_size), profile=profile, catalogue=catalogue)
    except Exception as exc:  # a rank wrote a bad or partial record
        log.exception("could not build the result of %s", run_dir)
        return Collected(outcome, error=f"could not build the result document: {exc}\n--- log tail ---\n{outcome.log_tail}")
    traces = read_traces(files, job.world_size, settings.max_trace_bytes) if job.spec.trace else {}
    return Collected(outcome, document=document, traces=traces)


def frozen_job(run: Run, settings: Settings) -> ResolvedJob:
    """The job frozen into the run at submission. A run queued before jobs were frozen has none:
    its spec is resolved here, once, and the result stored in the row (the caller commits)."""
    if run.job is not None:
        return ResolvedJob.model_validate(run.job)
    job = resolve_job(JobSpec.model_validate(run.spec), Limits(max_world_size=settings.max_world_size, max_steps=settings.max_steps))
    run.job = job.model_dump(mode="json")
    return job


def _claim(settings: Settings, run_id: str) -> ResolvedJob | None:
    """Move a queued run to running and return its job; None if it is not queued (the status guard)."""
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run_for_update(session, run_id)
        if run is None or run.status != "queued":
            log.info("run %s is %s; not running it", run_id, run.status if run else "missing")
            return None
        try:
            job = frozen_job(run, settings)
        except (SpecError, ValidationError) as exc:
            store.set_status(session, run, "failed", error=f"invalid spec: {exc}")
            return None
        store.set_status(session, run, "running")
        return job


def execute_run(run_id: str, settings: Settings) -> str:
    """Run a queued run end to end; returns its final status. Never raises for a failed job."""
    job = _claim(settings, run_id)
    if job is None:
        return "skipped"
    url = settings.sqlalchemy_url
    with session_scope(url) as session:  # this pool's latest calibration, for the step-time estimate
        profile = latest_profile(session=session, pool=settings.queue)

    def on_progress(progress: dict[str, Any]) -> None:
        with session_scope(url) as session:
            store.set_progress(session, run_id, progress)

    def should_cancel() -> bool:
        with session_scope(url) as session:
            return store.cancel_requested(session, run_id)

    try:
        collected = run_and_collect(
            job, settings.runs_dir / run_id, settings=settings, on_progress=on_progress, should_cancel=should_cancel, profile=profile
        )
    except Exception as exc:  # the launcher itself broke: the run must still end
        log.exception("run %s could not be launched", run_id)
        collected = Collected(LaunchOutcome(None, "launch failed", ""), error=f"could not launch the job: {exc}")

    with session_scope(url) as session:
        run = store.get_run_for_update(session, run_id)
        if run is None:
            return "missing"
        if collected.outcome.reason == "cancelled":
            store.set_status(session, run, "cancelled", error="cancelled while running\n--- log tail ---\n" + collected.outcome.log_tail)
        elif collected.document is None:
            store.set_status(session, run, "failed", error=collected.error)
        else:
            attach_result(session, run=run, document=collected.document, traces=collected.traces, pool=settings.queue)
        return run.status
