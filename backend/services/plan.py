"""The prediction for a job spec before anything runs (`GET /api/v1/plan`, what `parallab plan` prints)."""

from __future__ import annotations

from typing import Any

from parallab.core.jobs import resolve_job
from parallab.core.prediction import predict
from parallab.core.spec import JobSpec


def plan(*, spec: JobSpec) -> dict[str, Any]:
    """The resolved workload and strategy and their prediction (raises SpecError).

    Planning is for any cluster, not just this deployment's workers: no limits apply.
    """
    job = resolve_job(spec)
    return {"workload": job.workload_document(), "strategy": job.strategy_document(), "prediction": predict(job)}
