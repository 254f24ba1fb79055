"""The ranking of every configuration of a workload on a cluster (`parallab plan --device`,
`GET /api/v1/plan?mode=rank`, `/plan`, sweeps; docs/planner.md).

Every strategy with the options its descriptor plans (`StrategyDescriptor.plan_grid`) × precision × recomputation × accumulation is
resolved with `resolve_job` (its SpecErrors are a rejection's reasons), its memory per rank
predicted (`prediction.predict`: model state + activations + the logits' gradient) against the device's usable memory,
the device asked whether it can train in the precision (`hardware.precision_problem`), and its
step time estimated (`planner.estimate_step_time`). Those that fit are listed fastest predicted
first; the others with every reason. A combination the spec refuses before the cluster is looked
at (a global batch that does not split over data-parallel ranks × accumulation, layers over
stages, heads over tensor ranks) is not a configuration of the workload at all: it is kept apart
(`Ranking.invalid`), never counted as one that does not fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import product
from typing import Any

from pydantic import ValidationError

from parallab.core.accuracy import accuracy_of
from parallab.core.hardware import precision_problem
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.layout import DATA_PARALLEL, DATA_PARALLEL_AXES, MeshAxisName
from parallab.core.model import PRESETS
from parallab.core.plan_hardware import USABLE_MEMORY, Hardware
from parallab.core.planner import estimate_step_time
from parallab.core.prediction import predict
from parallab.core.problems import RecipeError, SpecError
from parallab.core.recipes import micro_batch_size
from parallab.core.reserved import reserved_budget, reserved_memory
from parallab.core.run_recipe import PARALLAB, RunRecipe
from parallab.core.spec import JobSpec
from parallab.core.strategies import TRAINING_STRATEGIES, get_descriptor
from parallab.core.units import format_bytes

RANKED_STRATEGIES: tuple[str, ...] = TRAINING_STRATEGIES
"""Every strategy the planner ranks (each descriptor plans its own grid; the job kinds that train nothing, never)."""
DEFAULT_PRECISIONS = ("fp32", "bf16", "fp8")
"""fp16 runs at bf16's speed on every device the catalogue knows: ask for it by name (`--precision fp16`)."""
DEFAULT_CHECKPOINTING = ("none", "selective", "alternate", "full")
DEFAULT_ACCUMULATION = (1, 2, 4)
MAX_PRECISIONS = 4
"""Most precisions one ranking or sweep plans (each one multiplies the search space)."""
MAX_CHECKPOINTING = 4
"""Most recomputation modes one ranking or sweep plans (there are four)."""
MAX_ACCUMULATION = 8
"""Most accumulation step counts one ranking or sweep plans."""


@dataclass
class PlanRow:
    """One configuration of the workload on the cluster: its dimensions, prediction and verdict."""

    spec: dict[str, Any]
    strategy: str
    options: dict[str, Any]
    mesh: dict[str, int]
    precision: str
    activation_checkpointing: str
    grad_accumulation_steps: int
    microbatches: int | None
    micro_batch_size: int | None
    memory_per_rank_bytes: int | None = None
    model_state_bytes: int | None = None
    activation_bytes: int | None = None
    """Activations at the peak and, when the peak is the head's backward, the logits' gradient."""
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    estimate: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    """The error band and what the prediction does not model (`parallab.core.accuracy`)."""
    reasons: list[str] = field(default_factory=list)
    valid: bool = True
    """False: the spec itself was refused (`resolve_job`), before memory, devices or precision were asked."""
    duplicate: bool = False
    """A placement order that lays this mesh as the default does (`across` on a one-dimensional mesh)."""

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def label(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items() if k != "microbatches")
        world = self.spec.get("strategy", {}).get("world_size", 1)
        dims = " × ".join(f"{k}{v}" for k, v in self.mesh.items() if v > 1) or f"×{world}"
        order = (self.spec.get("placement") or {}).get("order", "inner-first")
        where = f" ({order})" if order != "inner-first" else ""
        return (f"{self.strategy}[{opts}] {dims}" if opts else f"{self.strategy} {dims}") + where

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "label": self.label}


@dataclass
class Ranking:
    hardware: str
    world_size: int
    workload: dict[str, Any]
    fits: list[PlanRow]
    rejected: list[PlanRow]
    """Valid configurations that do not fit this cluster (memory, devices, the device's precisions)."""
    invalid: list[PlanRow] = field(default_factory=list)
    """Combinations of the grid the spec refuses for this workload (not configurations; never misfits)."""

    def closest(self) -> str | None:
        """Why the configuration closest to fitting does not (`tightest_reason` over the valid ones);
        with none valid, why the combinations are not; None when nothing was rejected."""
        return tightest_reason(self.rejected) or tightest_reason(self.invalid)

    def as_dict(self, *, top: int | None = None) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "world_size": self.world_size,
            "workload": self.workload,
            "fits": [r.as_dict() for r in self.fits[:top]],
            "fitting": len(self.fits),
            "rejected": [r.as_dict() for r in self.rejected],
            "rejected_by_reason": rejected_by_reason(self.rejected),
            "closest": None if self.fits else self.closest(),
            "invalid": len(self.invalid),
            "invalid_by_reason": rejected_by_reason(self.invalid),
        }


MESH_DIMS: tuple[str, ...] = (DATA_PARALLEL, *(axis.value for axis in (MeshAxisName.TP, MeshAxisName.PP, MeshAxisName.CP, MeshAxisName.EP)))
"""A row's mesh: a layout's data-parallel dims (dp_replicate × dp_shard) count together as `DATA_PARALLEL`."""


def candidate_specs(
    workload: dict[str, Any],
    world_size: int,
    *,
    strategies: Iterable[str] | None = None,
    precisions: Iterable[str] = DEFAULT_PRECISIONS,
    checkpointing: Iterable[str] = DEFAULT_CHECKPOINTING,
    accumulation: Iterable[int] = DEFAULT_ACCUMULATION,
    nodes: int = 1,
    placements: Iterable[str] = ("inner-first",),
) -> list[dict[str, Any]]:
    """Every (strategy, options, precision, recomputation, accumulation) of `workload` on `world_size` ranks, as raw specs.
    On `nodes` > 1 each is placed over the nodes once per order of `placements`
    (`parallab.core.spec.PlacementOrder`: tp inside a node, or across).

    Each descriptor says what it plans on `world_size` ranks (`plan_grid`: `single` only on one
    rank, a pipeline's micro-batch counts as multiples of its stages) and whether it needs a model
    with experts (on a dense preset it would train another model).
    """
    preset = PRESETS.get(str(workload.get("model")))
    is_moe = bool(workload.get("num_experts") or (preset is not None and preset.config.num_experts))
    names = list(strategies) if strategies is not None else list(TRAINING_STRATEGIES)
    orders = list(dict.fromkeys(placements)) if nodes > 1 else ["inner-first"]
    out = []
    for name in names:
        descriptor = get_descriptor(name)
        if descriptor.needs_experts and not is_moe:
            continue
        grid = descriptor.plan_grid(world_size) if strategies is None else (descriptor.plan_grid(world_size) or [{}])
        for opts in grid:
            for precision, mode, accum in product(precisions, checkpointing, accumulation):
                for order in orders:
                    raw: dict[str, Any] = {
                        "workload": {
                            **workload,
                            "precision": precision,
                            "activation_checkpointing": mode,
                            "grad_accumulation_steps": accum,
                        },
                        "strategy": {"name": name, "world_size": world_size, "options": opts},
                    }
                    if nodes > 1:
                        raw["placement"] = {"nodes": nodes, "order": order}
                    out.append(raw)
    return out


def _row(raw: dict[str, Any], job: ResolvedJob | None) -> PlanRow:
    wl, st = raw["workload"], raw["strategy"]
    mesh = {d: 1 for d in MESH_DIMS}
    micro = None
    if job is not None:
        for d in job.mesh:
            name = DATA_PARALLEL if d.name in DATA_PARALLEL_AXES else d.name
            mesh[name] = mesh[name] * d.size
        micro = micro_batch_size(job)
    return PlanRow(
        spec=raw,
        strategy=st["name"],
        options=dict(st.get("options") or {}),
        mesh=mesh,
        precision=str(wl.get("precision", "fp32")),
        activation_checkpointing=str(wl.get("activation_checkpointing", "none")),
        grad_accumulation_steps=int(wl.get("grad_accumulation_steps", 1)),
        microbatches=(st.get("options") or {}).get("microbatches"),
        micro_batch_size=micro,
    )


def evaluate(
    raw: dict[str, Any],
    hw: Hardware,
    recipe: RunRecipe = PARALLAB,
    *,
    predict_only: bool = False,
) -> PlanRow:
    """One candidate: resolved (its SpecErrors are the reasons), then memory, device and time.

    On a GPU with a device profile the memory is what the allocator reserves: torch.compile's
    share of the eager activations, and reserved over allocated (`device_profile.Allocator`);
    `recipe`: how the head's loss runs and what selective recomputation keeps (`run_recipe`: loss
    parallel, a compiled loss, a published run's policy); `predict_only` predicts a recipe the ranks
    refuse but the planner models (a published run's: fp8 beside tensor parallelism), its accuracy
    saying it is not runnable here."""
    try:
        job = resolve_job(JobSpec.model_validate(raw), Limits(), predict_only=predict_only)
    except SpecError as exc:
        row = _row(raw, None)
        row.reasons, row.valid = [str(p) for p in exc.problems], False
        return row
    except ValidationError as exc:
        row = _row(raw, None)
        row.reasons, row.valid = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()], False
        return row
    row = _row(raw, job)
    row.spec = job.spec.model_dump(mode="json", exclude_none=True)
    row.duplicate = job.placement_order != "inner-first" and sum(d.size > 1 for d in job.mesh) < 2
    if job.world_size > hw.devices:
        row.reasons.append(f"strategy.world_size: {job.world_size} ranks but the cluster has {hw.devices} devices")
    problem = precision_problem(job.workload.precision, hw.device)
    if problem:
        row.reasons.append(f"workload.precision: {problem}")
    try:
        prediction = predict(job, recipe=recipe)
    except RecipeError as exc:  # a recipe the planner does not count for this model (`run_recipe`)
        row.reasons, row.valid = [str(exc)], False
        return row
    state = sum(prediction["model_state_bytes_per_rank"].values())
    # beyond the model state the peak holds the activations and, at the head's backward, the logits' gradient
    activations = int(prediction.get("activation_bytes_per_rank") or 0) + int(prediction.get("backward_temporary_bytes_per_rank") or 0)
    device_profile = hw.device_profile
    if device_profile is not None:  # the allocator's reserved peak (`parallab.core.reserved`)
        categories = reserved_memory(job, prediction, device_profile)
        state = categories[0]["bytes"]
        activations = categories[-1]["bytes"] - state
    row.model_state_bytes, row.activation_bytes, row.memory_per_rank_bytes = state, activations, state + activations
    budget = hw.memory_budget if device_profile is None else reserved_budget(hw.spec.memory_bytes, device_profile)
    if state + activations > budget:
        row.reasons.append(
            f"memory: needs {gib(state + activations)} per rank (model state {gib(state)}, activations {gib(activations)}); "
            f"{hw.spec.name} gives a rank {gib(budget)} "
            + (f"({USABLE_MEMORY:.0%} of its memory)" if device_profile is None else "(its memory less the CUDA context)")
        )
    estimate = estimate_step_time(job, hw, recipe)
    row.accuracy = accuracy_of(job, hw, recipe)
    row.step_time_s, row.tokens_per_s, row.estimate = estimate.step_s, estimate.tokens_per_s, estimate.as_dict()
    return row


def rank(
    specs: Sequence[dict[str, Any]],
    hw: Hardware,
    *,
    workload: dict[str, Any] | None = None,
    world_size: int = 0,
    recipe: RunRecipe = PARALLAB,
) -> Ranking:
    """Evaluate every candidate; those that fit, fastest first, those that don't, with why, and apart
    the combinations the spec refuses (not configurations of this workload)."""
    rows = [row for raw in specs if not (row := evaluate(raw, hw, recipe)).duplicate]
    fits = sorted((r for r in rows if r.fits), key=lambda r: -(r.tokens_per_s or 0.0))
    rejected = [r for r in rows if not r.fits and r.valid]
    invalid = [r for r in rows if not r.valid]
    return Ranking(hardware=hw.label, world_size=world_size, workload=workload or {}, fits=fits, rejected=rejected, invalid=invalid)


def plan_cluster(
    workload: dict[str, Any],
    hw: Hardware,
    *,
    world_size: int | None = None,
    strategies: Iterable[str] | None = None,
    precisions: Iterable[str] = DEFAULT_PRECISIONS,
    checkpointing: Iterable[str] = DEFAULT_CHECKPOINTING,
    accumulation: Iterable[int] = DEFAULT_ACCUMULATION,
    recipe: RunRecipe = PARALLAB,
    nodes: int = 1,
    placements: Iterable[str] = ("inner-first",),
) -> Ranking:
    """Rank every configuration of `workload` on all of `hw`'s devices (or `world_size` of them);
    on `nodes` > 1, placed over them in each of `placements`' orders (`candidate_specs`).

    Without a global batch in the workload, the preset's is rounded up to a multiple of the world
    size, so every data-parallel degree can split it (the same batch for every candidate).
    """
    world = world_size or hw.devices
    wl = dict(workload)
    if not wl.get("global_batch_size") and wl.get("model") in PRESETS:
        preset = PRESETS[str(wl["model"])].global_batch_size
        wl["global_batch_size"] = -(-preset // world) * world
    specs = candidate_specs(
        wl,
        world,
        strategies=strategies,
        precisions=precisions,
        checkpointing=checkpointing,
        accumulation=accumulation,
        nodes=nodes,
        placements=placements,
    )
    return rank(specs, hw, workload=wl, world_size=world, recipe=recipe)


def rejected_by_reason(rows: Iterable[PlanRow]) -> list[dict[str, Any]]:
    """The rejections grouped by the kind of reason (the field it names), most common first."""
    groups: dict[str, list[PlanRow]] = {}
    for row in rows:
        for reason in row.reasons:
            key = reason.split(":", 1)[0]
            groups.setdefault(key, []).append(row)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        example = members[0]
        out.append(
            {
                "field": key,
                "count": len(members),
                "example": example.label,
                "reason": next(r for r in example.reasons if r.startswith(key)),
            }
        )
    return out


def tightest_reason(rows: Sequence[PlanRow]) -> str | None:
    """Why the configuration closest to fitting does not: the rejected row with the least memory
    per rank (the one a bigger cluster or a smaller batch would admit first), else the most common
    reason; None when nothing was rejected."""
    sized = [r for r in rows if r.reasons and r.memory_per_rank_bytes is not None]
    if sized:
        row = min(sized, key=lambda r: r.memory_per_rank_bytes or 0)
        return f"{row.label} {row.precision}, {row.activation_checkpointing} recompute: {'; '.join(row.reasons)}"
    groups = rejected_by_reason(rows)
    return f"{groups[0]['reason']} (e.g. {groups[0]['example']})" if groups else None


def gib(n: float) -> str:
    """Bytes in binary units, one decimal: the one byte formatter (parallab.core.units)."""
    return format_bytes(n, digits=1)
