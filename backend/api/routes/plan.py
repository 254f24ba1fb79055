"""REST: the prediction for a spec, before anything runs (what `parallab plan` prints), or the
ranking of every configuration of a workload on a cluster (`mode=rank`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from backend.api.deps import SessionDep, SettingsDep
from backend.schemas.plan import WORKLOAD_PARAMS, PlanQuery
from backend.services import plan as plan_service
from backend.services.hardware import UnknownDevice
from parallab.core.problems import RecipeError
from parallab.core.ranking import rejected_by_reason

router = APIRouter(tags=["plan"])


@router.get("/plan")
def plan(query: Annotated[PlanQuery, Query()], session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """Predicted model state per rank, communication per step and bubble, for any world size.

    Every workload field and every strategy option is a parameter of the same name; an option the
    chosen strategy does not have is refused (422), as in a job spec.

    `mode=rank`: every strategy and degree (dp × tp × pp × cp × ep), micro-batching, recomputation
    and precision of the workload on `device` × `nodes` × `gpus_per_node` (or a calibrated
    `pool`): those that fit, fastest predicted first, with memory per rank, step time and tokens/s;
    and every one that does not, with why.

    `loss_parallel`, `compiled_loss` and `selective_policy`: the run's recipe beyond its spec (a
    published run's loss and recomputation policy), in either mode.
    """
    if query.mode != "rank":
        try:
            return plan_service.plan(spec=query.to_spec(), settings=settings, recipe=query.recipe())
        except RecipeError as exc:  # a recipe the planner does not count for this model
            raise HTTPException(422, detail=[{"loc": ["query", exc.field], "msg": exc.problem, "type": "value_error"}]) from None
    try:
        hw = plan_service.ranking_hardware(
            session=session, settings=settings, device=query.device, pool=query.pool, nodes=query.nodes, gpus_per_node=query.gpus_per_node
        )
    except UnknownDevice as exc:
        raise HTTPException(422, detail=[{"loc": ["query", "device"], "msg": str(exc), "type": "value_error"}]) from None
    given = query.model_dump(mode="json")
    ranking = plan_service.rank(
        workload={name: given[name] for name in WORKLOAD_PARAMS if name in query.model_fields_set or name == "model"},
        hw=hw,
        world_size=given["world_size"] if "world_size" in query.model_fields_set else None,
        precisions=given.get("precisions") if "precisions" in query.model_fields_set else None,
        checkpointing=query.checkpointing,
        accumulation=query.accumulation,
        recipe=query.recipe(),
    )
    out = ranking.as_dict(top=query.top)
    out["rejected_by_reason"] = rejected_by_reason(ranking.rejected)
    return out
