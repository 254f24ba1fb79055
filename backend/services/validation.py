"""Check a job spec against the model's shape and the worker's limits before anything is queued.

Every rule names the field at fault, so the API can answer 422 with a `loc` the form can put its
message beside, and `parallab bench` can print the same sentence. The ranks re-use the resolved
job (`ResolvedJob`) so the rules are written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backend.schemas.spec import JobSpec
from backend.workload import DEFAULT_GLOBAL_BATCH, PRESETS, ModelConfig, build_model_config

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class SpecProblem:
    loc: Loc
    msg: str

    def as_detail(self) -> dict[str, Any]:
        return {"loc": ["body", *self.loc], "msg": self.msg, "type": "value_error"}


class SpecError(ValueError):
    """A spec that cannot run; `problems` says where and why."""

    def __init__(self, problems: list[SpecProblem]):
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))


# ---- per-strategy options (unknown keys are refused, so a typo never silently does nothing) ----


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoOptions(_Options):
    pass


class DDPOptions(_Options):
    bucket_cap_mb: float = Field(25.0, gt=0, description="Gradient bucket size of DistributedDataParallel.")


class FSDPOptions(_Options):
    reshard_after_forward: bool = Field(True, description="True ≈ ZeRO-3; False keeps gathered params until backward (≈ ZeRO-2).")


class TPOptions(_Options):
    sequence_parallel: bool = Field(False, description="Shard norms/residual over the sequence (all-gather/reduce-scatter instead of all-reduce).")


class PPOptions(_Options):
    schedule: Literal["gpipe", "1f1b"] = "1f1b"
    microbatches: int | None = Field(None, ge=1, description="Micro-batches per step; default 2 × stages.")


class RingOptions(_Options):
    zigzag: bool = Field(False, description="Load-balanced causal sharding: each rank holds chunks i and 2n−1−i.")


class MoEOptions(_Options):
    aux_loss_coef: float = Field(0.01, ge=0, description="Weight of the Switch load-balancing loss.")


class HybridOptions(_Options):
    tp: int = Field(2, ge=1, description="Tensor-parallel degree (inner mesh dim); FSDP runs over world_size / tp.")
    reshard_after_forward: bool = True
    sequence_parallel: bool = False


class CollectivesOptions(_Options):
    ops: list[Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]] = Field(
        default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
    )
    min_bytes: int = Field(1024, ge=8)
    max_bytes: int = Field(64 * 1024 * 1024, ge=8, le=8 * 1024**3)
    iters: int = Field(5, ge=1, le=1000)
    warmup_iters: int = Field(2, ge=0, le=100)


OPTION_MODELS: dict[str, type[_Options]] = {
    "single": NoOptions,
    "ddp": DDPOptions,
    "fsdp": FSDPOptions,
    "tp": TPOptions,
    "pp": PPOptions,
    "ring": RingOptions,
    "moe": MoEOptions,
    "hybrid": HybridOptions,
    "collectives": CollectivesOptions,
}


@dataclass(frozen=True)
class ResolvedJob:
    """A spec with every default filled in: what the ranks run and what the prediction uses."""

    spec: JobSpec
    model: ModelConfig
    options: dict[str, Any]
    global_batch_size: int
    dp_degree: int
    """How many ways the global batch is split (1 for tp/pp/ring, world/tp for hybrid)."""

    @property
    def strategy(self) -> str:
        return self.spec.strategy.name

    @property
    def world_size(self) -> int:
        return self.spec.strategy.world_size

    def workload_document(self) -> dict[str, Any]:
        """The result document's `workload` block: the spec's recipe with the model fully resolved."""
        doc = self.spec.workload.model_dump()
        doc.update(self.model.to_dict())
        doc.pop("moe_default_experts", None)
        doc["global_batch_size"] = self.global_batch_size
        return doc

    def strategy_document(self) -> dict[str, Any]:
        return {"name": self.strategy, "world_size": self.world_size, "options": self.options}

    def to_spec_dict(self) -> dict[str, Any]:
        """A fully resolved spec (JSON-able) — what the worker hands to the ranks."""
        doc = self.spec.model_dump()
        doc["workload"].update({k: v for k, v in self.workload_document().items() if k in doc["workload"]})
        doc["strategy"]["options"] = self.options
        return doc


def _dp_degree(name: str, world: int, options: dict[str, Any]) -> int:
    if name in ("ddp", "fsdp", "moe"):
        return world
    if name == "hybrid":
        return max(world // options["tp"], 1)
    return 1


def _divides(problems: list[SpecProblem], loc: Loc, value: int, by: int, what: str) -> None:
    if by and value % by:
        problems.append(SpecProblem(loc, f"{what} ({value}) is not divisible by {by}"))


def resolve_job(spec: JobSpec, *, max_world_size: int, max_steps: int | None = None) -> ResolvedJob:
    """Fill defaults and check every rule; raise SpecError naming each field at fault."""
    problems: list[SpecProblem] = []
    wl, st = spec.workload, spec.strategy
    name, world = st.name, st.world_size

    if world > max_world_size:
        problems.append(SpecProblem(("strategy", "world_size"), f"world size {world} is above this worker's limit of {max_world_size}"))
    if name == "single" and world != 1:
        problems.append(SpecProblem(("strategy", "world_size"), "the single-process reference runs on exactly 1 rank"))
    if name not in ("single",) and world < 2:
        problems.append(SpecProblem(("strategy", "world_size"), f"{name} needs at least 2 ranks"))
    if max_steps is not None and wl.steps > max_steps:
        problems.append(SpecProblem(("workload", "steps"), f"steps {wl.steps} is above the limit of {max_steps}"))
    if wl.model not in PRESETS:
        problems.append(SpecProblem(("workload", "model"), f"unknown model preset {wl.model!r}; known: {', '.join(PRESETS)}"))
        raise SpecError(problems)

    try:
        options = OPTION_MODELS[name].model_validate(st.options).model_dump()
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(SpecProblem(("strategy", "options", *err["loc"]), err["msg"]))
        raise SpecError(problems) from None

    overrides = wl.model_dump()
    if name == "moe" and not overrides.get("num_experts") and not PRESETS[wl.model].num_experts:
        overrides["num_experts"] = PRESETS[wl.model].moe_default_experts
    try:
        model = build_model_config(wl.model, overrides)
    except ValueError as exc:
        field = next((f for f in ("num_heads", "top_k", "capacity_factor", "num_experts") if f in str(exc)), "model")
        problems.append(SpecProblem(("workload", field), str(exc)))
        raise SpecError(problems) from None

    dp = _dp_degree(name, world, options)
    if name == "pp" and options["microbatches"] is None:
        options["microbatches"] = 2 * world
    # Unset, the global batch is the preset's, rounded up so it splits evenly (64 ranks of ddp on
    # `tiny` get 64 sequences, not an error); a batch the user set is checked as given.
    split = wl.grad_accumulation_steps * (math.lcm(dp, options["microbatches"]) if name == "pp" else dp)
    gbs = wl.global_batch_size or -(-DEFAULT_GLOBAL_BATCH.get(wl.model, 8) // split) * split
    _divides(problems, ("workload", "global_batch_size"), gbs, dp * wl.grad_accumulation_steps, "global batch size")

    if name == "tp" or name == "hybrid":
        tp = world if name == "tp" else options["tp"]
        if name == "hybrid":
            if world % tp:
                problems.append(SpecProblem(("strategy", "options", "tp"), f"mesh tp={tp} × dp does not make world size {world}"))
            elif tp < 2 or world // tp < 2:
                problems.append(SpecProblem(("strategy", "options", "tp"), f"hybrid needs tp ≥ 2 and dp ≥ 2; tp={tp} on {world} ranks gives dp={world // tp}"))
        _divides(problems, ("workload", "num_heads"), model.num_heads, tp, "heads")
        _divides(problems, ("workload", "ffn_hidden_size"), model.ffn_hidden_size, tp, "ffn hidden size")
        if options.get("sequence_parallel"):
            _divides(problems, ("workload", "seq_len"), model.seq_len, tp, "sequence length")
        if model.is_moe:
            problems.append(SpecProblem(("workload", "num_experts"), f"{name} supports dense models only; use the moe strategy for experts"))
    elif name == "pp":
        _divides(problems, ("workload", "num_layers"), model.num_layers, world, "layers")
        mb = options["microbatches"]
        if mb < world:
            problems.append(SpecProblem(("strategy", "options", "microbatches"), f"micro-batches ({mb}) must be at least the number of stages ({world})"))
        _divides(problems, ("workload", "global_batch_size"), gbs, mb * wl.grad_accumulation_steps, "global batch size")
        if model.is_moe:
            problems.append(SpecProblem(("workload", "num_experts"), "pp supports dense models only"))
    elif name == "ring":
        _divides(problems, ("workload", "seq_len"), model.seq_len, world * (2 if options["zigzag"] else 1), "sequence length" + (" (zig-zag needs 2 × ring size)" if options["zigzag"] else ""))
        if model.is_moe:
            problems.append(SpecProblem(("workload", "num_experts"), "ring supports dense models only"))
    elif name == "moe":
        _divides(problems, ("workload", "num_experts"), model.num_experts, world, "experts")
    elif name == "collectives":
        if options["min_bytes"] > options["max_bytes"]:
            problems.append(SpecProblem(("strategy", "options", "min_bytes"), "min_bytes is above max_bytes"))
    if wl.precision == "fp8" and name != "collectives":
        problems.append(SpecProblem(("workload", "precision"), "fp8 training is not supported yet; use fp32, bf16 or fp16"))

    if problems:
        raise SpecError(problems)
    return ResolvedJob(spec=spec, model=model, options=options, global_batch_size=gbs, dp_degree=dp)


