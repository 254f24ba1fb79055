"""The prediction for a job spec before anything runs (`GET /api/v1/plan`, what `parallab plan`
prints), and the ranking of every configuration of a workload on a cluster (`mode=rank`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.services import hardware
from parallab.core.jobs import resolve_job
from parallab.core.plan_hardware import Hardware
from parallab.core.prediction import predict
from parallab.core.ranking import DEFAULT_ACCUMULATION, DEFAULT_CHECKPOINTING, DEFAULT_PRECISIONS, Ranking, plan_cluster
from parallab.core.run_recipe import PARALLAB, RunRecipe
from parallab.core.spec import JobSpec


def plan(*, spec: JobSpec, settings: Settings, recipe: RunRecipe = PARALLAB) -> dict[str, Any]:
    """The resolved workload and strategy and their prediction under `recipe` (raises SpecError,
    and RecipeError for a recipe the planner does not count for this model).

    Planning is for any cluster, not just this deployment's workers: no ceilings apply. The
    allow-list of lab modules does: what this deployment will not run, it does not plan either.
    """
    job = resolve_job(spec, settings.limits.without_ceilings())
    return {"workload": job.workload_document(), "strategy": job.strategy_document(), "prediction": predict(job, recipe=recipe)}


def ranking_hardware(
    *, session: Session, settings: Settings, device: str | None, pool: str | None, nodes: int, gpus_per_node: int | None
) -> Hardware:
    """A catalogue device on nodes × gpus_per_node, or a pool's calibrated hardware (the default pool without either)."""
    if device:
        return hardware.device_hardware(settings=settings, device=device, nodes=nodes, gpus_per_node=gpus_per_node)
    return hardware.pool_hardware(session=session, settings=settings, pool=pool)


def rank(
    *,
    workload: dict[str, Any],
    hw: Hardware,
    world_size: int | None = None,
    precisions: Iterable[str] | None = None,
    checkpointing: Iterable[str] | None = None,
    accumulation: Iterable[int] | None = None,
    recipe: RunRecipe = PARALLAB,
) -> Ranking:
    """Every configuration of `workload` on `hw` under `recipe` (see `parallab.core.planner.plan_cluster`)."""
    return plan_cluster(
        {k: v for k, v in workload.items() if v is not None},
        hw,
        world_size=world_size,
        precisions=precisions or DEFAULT_PRECISIONS,
        checkpointing=checkpointing or DEFAULT_CHECKPOINTING,
        accumulation=accumulation or DEFAULT_ACCUMULATION,
        recipe=recipe,
    )
