"""Issue 12: a workload pays for its fp32 reference once per lab, not once per host.

Two hosts — two homes, so two reference caches on disk, one Postgres — each run the same tiny
workload through the worker's own path (`execute_run`: claim, launcher, torchrun ranks, ingest).
The first computes the reference in the job and stores it in the lab database; the second finds
it there, copies it into its own empty cache before launching, and its ranks never train the
reference (no 'reference' phase in its progress file). Two one-rank launches in all.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import delete

from backend.config import Settings
from backend.db import session_scope
from backend.models import ReferenceCurve
from backend.services import workers as fleet
from backend.services.runs import create_run
from backend.store import references as reference_store
from backend.store import runs as store
from parallab.core.jobs import ResolvedJob
from parallab.core.reference import cache_path, reference_key
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from workers import fleet as worker_fleet
from workers.execute import execute_run, reference_cache_dir

pytestmark = pytest.mark.slow

# Not a reference recipe (recomputation), so the job must obtain the reference; a seed no other test uses.
# Untraced: the reference is obtained whether or not a profiled window follows the timed steps.
SPEC = {
    "workload": {"model": "tiny", "steps": 3, "warmup_steps": 1, "seed": 1212, "activation_checkpointing": "full"},
    "strategy": {"name": "single", "world_size": 1},
    "trace": False,
}


def run_on(settings: Settings) -> tuple[dict, list[str], ResolvedJob]:
    """Submit SPEC and run it as this host's worker: (result document, progress phases seen, job)."""
    me = worker_fleet.describe(settings, pool=settings.worker.pool)
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=me)
        run_id = create_run(session=session, spec=JobSpec.model_validate(SPEC), settings=settings, source="api").id
    assert execute_run(run_id, settings, worker=me) == "succeeded"
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run(session, run_id)
        assert run is not None and run.result is not None, run and run.error
        document, job = run.result.document, ResolvedJob.model_validate(run.job)
    progress = RunDir(settings.runs_dir / run_id).progress
    phases = [json.loads(line)["phase"] for line in progress.read_text().splitlines()] if progress.exists() else []
    return document, phases, job


def test_the_second_host_reads_the_reference_from_the_lab_database(postgres_url: str, tmp_path: Path) -> None:
    pool = f"refs-{uuid.uuid4().hex[:8]}"
    hosts = [
        Settings(home=tmp_path / name, database_url=postgres_url, pool=pool, default_pool=pool, worker_host=name) for name in ("a", "b")
    ]
    first, first_phases, job = run_on(hosts[0])
    key = reference_key(job)
    try:
        assert first["loss"]["reference_source"] == "computed"
        assert "reference" in first_phases  # the marker can fail: the first host did train the reference
        with session_scope(postgres_url) as session:
            row = reference_store.get_curve(session, key, "cpu")
            assert row is not None and list(row.loss) == first["loss"]["reference"] and row.seed == 1212

        assert not cache_path(reference_cache_dir(hosts[1]), job).exists()  # host b has no file cache of its own
        second, second_phases, _ = run_on(hosts[1])
        assert second["loss"]["reference_source"] == "lab database"
        assert "reference" not in second_phases and "train" in second_phases
        assert second["loss"]["reference"] == first["loss"]["reference"]
        assert second["summary"]["loss_max_rel_diff_vs_reference"] is not None
        assert cache_path(reference_cache_dir(hosts[1]), job).exists()  # now cached on host b too
    finally:
        with session_scope(postgres_url) as session:
            session.execute(delete(ReferenceCurve).where(ReferenceCurve.key == key))
