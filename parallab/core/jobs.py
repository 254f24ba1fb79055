"""A job spec resolved once: every rule checked, every default filled in, then frozen.

`resolve_job` is the only place a spec is checked and completed. It runs at submission (API,
form, `parallab bench`/`plan`); the result, a `ResolvedJob`, is stored with the run and handed to
the ranks as a file, and everything later reads that frozen copy instead of resolving again.

A `ResolvedJob` is a fully resolved `JobSpec` — every shape field, the global batch and every
strategy option filled in — so `job.spec` is also what a result document resubmits: resolving it
again gives the same job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from parallab.core.model import PRESETS, ModelConfig, model_with, shape_problems
from parallab.core.problems import SpecError, SpecProblem, divides
from parallab.core.recipes import recipe_problems
from parallab.core.spec import JobSpec
from parallab.core.strategies import get_descriptor
from parallab.core.strategies.base import Draft, MeshDim, StrategyDescriptor, StrategyOptions


@dataclass(frozen=True)
class Limits:
    """What this deployment lets one job ask for (None: no limit — `parallab plan` plans any cluster)."""

    max_world_size: int | None = None
    max_steps: int | None = None


class ResolvedJob(BaseModel):
    """A spec with every default filled in: what the ranks run and what the prediction uses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: JobSpec
    """The fully resolved spec (JSON-able; resubmitting it gives this same job)."""

    # ---- what the spec says ----

    @property
    def strategy(self) -> str:
        return self.spec.strategy.name

    @property
    def world_size(self) -> int:
        return self.spec.strategy.world_size

    @property
    def workload(self) -> Any:
        """The spec's `Workload` (typed Any: its shape fields are generated from ModelConfig)."""
        return self.spec.workload

    @property
    def descriptor(self) -> StrategyDescriptor[Any]:
        return get_descriptor(self.strategy)

    @property
    def trains(self) -> bool:
        """False for job kinds that train nothing (the collectives sweep)."""
        return self.descriptor.trains

    @cached_property
    def options(self) -> StrategyOptions:
        """The strategy's options model, every default filled in."""
        options: StrategyOptions = self.descriptor.parse_options(self.spec.strategy.options)
        return options

    @cached_property
    def model(self) -> ModelConfig:
        return ModelConfig.model_validate(self.spec.workload.shape_overrides())

    @property
    def global_batch_size(self) -> int:
        gbs = self.spec.workload.global_batch_size
        assert gbs is not None, "a resolved job always has a global batch size"
        return int(gbs)

    @property
    def accum_steps(self) -> int:
        return int(self.spec.workload.grad_accumulation_steps)

    @property
    def mesh(self) -> tuple[MeshDim, ...]:
        return self.descriptor.mesh(self.world_size, self.options)

    @property
    def dp_degree(self) -> int:
        """How many ways the global batch is split (1 for tp/pp/ring, world/tp for hybrid)."""
        return self.descriptor.dp_degree(self.world_size, self.options)

    @property
    def micro_batch_size(self) -> int:
        """Sequences one data-parallel replica processes per accumulation micro-step."""
        return self.global_batch_size // (self.dp_degree * self.accum_steps)

    @property
    def tokens_per_replica(self) -> int:
        """Tokens one data-parallel replica processes per optimizer step (all micro-steps)."""
        return self.global_batch_size // self.dp_degree * self.model.seq_len

    @property
    def tokens_per_step(self) -> int:
        """Global tokens per optimizer step (0 for job kinds that train nothing)."""
        return self.global_batch_size * self.model.seq_len if self.trains else 0

    def workload_document(self) -> dict[str, Any]:
        """The result document's `workload` block (a valid `Workload`: it resubmits as is)."""
        return self.spec.workload.model_dump(mode="json")

    def strategy_document(self) -> dict[str, Any]:
        return self.spec.strategy.model_dump(mode="json")


def _options_problems(exc: ValidationError) -> list[SpecProblem]:
    return [SpecProblem(("strategy", "options", *err["loc"]), err["msg"]) for err in exc.errors()]


def _default_batch(preset_batch: int, split: int) -> int:
    """The preset's batch rounded up to a multiple of `split` (64 ranks of ddp on `tiny` get 64
    sequences, not an error); a batch the user set is checked as given instead."""
    return -(-preset_batch // split) * split


def resolve_job(spec: JobSpec, limits: Limits | None = None) -> ResolvedJob:
    """Fill defaults and check every rule; raise SpecError naming each field at fault."""
    limits = limits or Limits()
    wl, st = spec.workload, spec.strategy
    descriptor = get_descriptor(st.name)
    world = st.world_size
    problems: list[SpecProblem] = []

    if limits.max_world_size is not None and world > limits.max_world_size:
        problems.append(
            SpecProblem(("strategy", "world_size"), f"world size {world} is above this worker's limit of {limits.max_world_size}")
        )
    problems += descriptor.world_size_problems(world)
    if limits.max_steps is not None and wl.steps > limits.max_steps:
        problems.append(SpecProblem(("workload", "steps"), f"steps {wl.steps} is above the limit of {limits.max_steps}"))
    if wl.model not in PRESETS:
        problems.append(SpecProblem(("workload", "model"), f"unknown model preset {wl.model!r}; known: {', '.join(PRESETS)}"))
        raise SpecError(problems)

    try:
        options = descriptor.complete_options(descriptor.parse_options(st.options), world)
    except ValidationError as exc:
        raise SpecError(problems + _options_problems(exc)) from None

    preset = PRESETS[wl.model]
    fields = model_with(wl.model, descriptor.model_defaults(preset, wl.shape_overrides()))
    try:
        model = ModelConfig.model_validate(fields)
    except ValidationError:
        # the bounds were checked with the spec: what is left ties fields together
        shape = ModelConfig.model_construct(**fields)
        problems += [SpecProblem(("workload", name), msg) for name, msg in shape_problems(shape)]
        raise SpecError(problems) from None

    dp = descriptor.dp_degree(world, options)
    accum = wl.grad_accumulation_steps
    split = accum * math.lcm(dp, descriptor.batch_split(world, options))
    gbs = wl.global_batch_size or _default_batch(preset.global_batch_size, split)
    problems += divides(("workload", "global_batch_size"), gbs, dp * accum, "global batch size")
    problems += descriptor.rules(
        Draft(model=model, world_size=world, options=options, global_batch_size=gbs, grad_accumulation_steps=accum)
    )
    if descriptor.dense_only and model.is_moe:
        problems.append(
            SpecProblem(("workload", "num_experts"), f"{descriptor.name} supports dense models only; use the moe strategy for experts")
        )
    problems += recipe_problems(descriptor, wl.precision)
    if problems:
        raise SpecError(problems)

    workload = wl.model_copy(update={**model.model_dump(), "global_batch_size": gbs})
    strategy = st.model_copy(update={"options": options.model_dump(mode="json")})
    return ResolvedJob(spec=spec.model_copy(update={"workload": workload, "strategy": strategy}))
