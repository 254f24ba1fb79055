"""`GET /api/v1/plan`'s query parameters, derived from the core's declarations.

One parameter per workload field (`parallab.core.spec.workload_fields`, with the same bounds and
defaults as the job spec) and one per strategy option (every descriptor's `options_model`; an
option several strategies share, such as `reshard_after_forward`, is one parameter). A field
added to the core is a `/plan` parameter without touching this file.

`mode=rank` ranks every configuration of the workload on a cluster instead of
predicting one: `device` (a catalogue device) on `nodes` × `gpus_per_node`, or a calibrated
`pool`; `precisions` (shared with the calibrate job's option), `checkpointing` and
`accumulation` narrow the search; `top` bounds the list of those that fit.

`loss_parallel`, `compiled_loss` and `selective_policy` (`RECIPE_PARAMS`) are the run's recipe beyond its
spec (`parallab.core.run_recipe`), for either mode: a published run's loss and recomputation policy.

The query is a `QueryParams` like every list route's: an unknown name is refused listing the names
`/plan` takes, and each list parameter is bounded as a sweep bounds it (`MAX_CHECKPOINTING`,
`MAX_ACCUMULATION`; a strategy option's list by its own `max_length`) and keeps each value once —
the ranking plans the product of these lists, so an unbounded one is unbounded work.
"""

from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, create_model, field_validator
from pydantic.fields import FieldInfo

from backend.schemas.queries import QueryParams
from parallab.core.activations import SELECTIVE_POLICIES
from parallab.core.problems import RecipeError, SpecError, SpecProblem
from parallab.core.ranking import MAX_ACCUMULATION, MAX_CHECKPOINTING
from parallab.core.run_recipe import RunRecipe
from parallab.core.spec import MAX_GRAD_ACCUMULATION, POOL_PATTERN, Checkpointing, JobSpec, StrategyName, StrategySpec, workload_fields
from parallab.core.strategies import REGISTRY

RANK_PARAMS: tuple[str, ...] = ("mode", "device", "nodes", "gpus_per_node", "pool", "top", "checkpointing", "accumulation")
"""The ranking mode's own parameters."""
RECIPE_PARAMS: tuple[str, ...] = ("loss_parallel", "compiled_loss", "selective_policy")
"""The run's recipe beyond its spec (`parallab.core.run_recipe.RunRecipe`'s fields)."""


WORKLOAD_PARAMS: tuple[str, ...] = tuple(f.name for f in workload_fields())
"""Workload fields, by the names the job spec gives them."""


def _accepts_none(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def _unset_by_default(info: FieldInfo) -> tuple[Any, FieldInfo]:
    """The option as a query parameter: its type and bounds, None unless given (the strategy fills defaults)."""
    annotation = info.annotation if _accepts_none(info.annotation) else info.annotation | None  # type: ignore[operator]
    return annotation, FieldInfo.merge_field_infos(info, annotation=annotation, default=None, default_factory=None)


def _option_params() -> dict[str, tuple[Any, FieldInfo]]:
    """Every strategy option once; strategies that share a name must give it the same type."""
    params: dict[str, tuple[Any, FieldInfo]] = {}
    owners: dict[str, str] = {}
    for strategy, descriptor in REGISTRY.items():
        for name, info in descriptor.options_model.model_fields.items():
            if name in WORKLOAD_PARAMS or name in ("strategy", "world_size", *RANK_PARAMS, *RECIPE_PARAMS):
                raise TypeError(f"option {strategy}.{name} would shadow a /plan parameter of the same name")
            if name in params:
                if params[name][1].annotation != _unset_by_default(info)[1].annotation:
                    raise TypeError(f"option {name!r} has different types in {owners[name]} and {strategy}")
                continue
            params[name], owners[name] = _unset_by_default(info), strategy
    return params


_OPTIONS = _option_params()
OPTION_PARAMS: tuple[str, ...] = tuple(_OPTIONS)
"""Strategy options, by name."""


def _counted(value: Any, **recipe: Any) -> Any:
    """`value`, where the recipe it belongs to is one the planner counts; else a 422 naming its field."""
    try:
        RunRecipe(**recipe)
    except RecipeError as exc:
        raise ValueError(exc.problem) from None
    return value


class _PlanBase(QueryParams):
    """The strategy's name and world size (the job spec's declarations), then every field below."""

    model_config = ConfigDict(protected_namespaces=(), extra="forbid", allow_inf_nan=False)
    route: ClassVar[str] = "/plan"

    mode: Literal["predict", "rank"] = Field(
        "predict", description="predict: one job's prediction; rank: every configuration on a cluster."
    )
    device: str | None = Field(None, max_length=64, description="rank: a catalogue device (h100, a100, mi300x, cpu, ...).")
    nodes: int = Field(1, ge=1, le=4096, description="rank: nodes of `device`.")
    gpus_per_node: int | None = Field(None, ge=1, le=64, description="rank: devices per node (default: the catalogue's).")
    pool: str | None = Field(None, pattern=POOL_PATTERN, description="rank: plan on this pool's calibrated hardware instead of a device.")
    top: int = Field(20, ge=1, le=10_000, description="rank: how many of the fitting configurations to list.")
    checkpointing: list[Checkpointing] | None = Field(
        None, min_length=1, max_length=MAX_CHECKPOINTING, description="rank: recomputation modes to plan (default: all)."
    )
    accumulation: list[Annotated[int, Field(ge=1, le=MAX_GRAD_ACCUMULATION)]] | None = Field(
        None, min_length=1, max_length=MAX_ACCUMULATION, description="rank: accumulation steps to plan (default: 1, 2, 4)."
    )

    loss_parallel: bool = Field(
        False, description="Predict with the head's output sharded over the vocabulary under tp (torchtitan's loss parallel)."
    )
    compiled_loss: bool = Field(
        False, description="Predict with the cross-entropy compiled (the 16-bit logits kept, their gradient in their dtype)."
    )
    selective_policy: str = Field(
        "every_matmul", max_length=32, description=f"What selective recomputation keeps: one of {', '.join(SELECTIVE_POLICIES)}."
    )

    @field_validator("compiled_loss")
    @classmethod
    def _not_beside_loss_parallel(cls, compiled: bool, info: ValidationInfo) -> bool:
        return _counted(compiled, loss_parallel=bool(info.data.get("loss_parallel")), compiled_loss=compiled)

    @field_validator("selective_policy")
    @classmethod
    def _a_policy_the_planner_counts(cls, policy: str) -> str:
        return _counted(policy, selective_policy=policy)

    def recipe(self) -> RunRecipe:
        """The run's recipe beyond its spec these parameters give."""
        return RunRecipe(loss_parallel=self.loss_parallel, compiled_loss=self.compiled_loss, selective_policy=self.selective_policy)

    def to_spec(self) -> JobSpec:
        """The job spec these parameters describe (options only as given: unknown ones are refused)."""
        given = {name: value for name, value in self.model_dump(mode="json").items() if value is not None}
        if "strategy" not in given:
            raise SpecError([SpecProblem(("strategy", "name"), "name a strategy (or ask for mode=rank)")])
        return JobSpec.model_validate(
            {
                "workload": {name: given[name] for name in WORKLOAD_PARAMS if name in given},
                "strategy": {
                    "name": given["strategy"],
                    "world_size": given["world_size"],
                    "options": {name: given[name] for name in OPTION_PARAMS if name in given},
                },
            }
        )


def _plan_query() -> type[_PlanBase]:
    spec = StrategySpec.model_fields
    name = FieldInfo.merge_field_infos(spec["name"], default=None)
    fields: dict[str, Any] = {"strategy": (StrategyName | None, name), "world_size": (int, spec["world_size"])}
    fields.update({f.name: (f.info.annotation, f.info) for f in workload_fields()})
    fields.update(_OPTIONS)
    return create_model("PlanQuery", __base__=_PlanBase, __doc__="What to plan: a job spec, flattened.", **fields)


if TYPE_CHECKING:
    PlanQuery = _PlanBase
else:
    PlanQuery = _plan_query()
