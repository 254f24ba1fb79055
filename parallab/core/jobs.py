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
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from parallab.core import dims
from parallab.core.data import DEFAULT_LR, data_problems
from parallab.core.families import family_of
from parallab.core.families.module import allow_list_entry_problem, allow_list_problem, parse_allow_list
from parallab.core.hf_config import HFShape, read_hf_config
from parallab.core.layout import Layout
from parallab.core.model import PRESETS, SHAPE_FIELDS, ModelConfig, custom_fields, model_with, shape_problems
from parallab.core.pools import crossing_dims, host_rank, mesh_rank
from parallab.core.problems import Loc, SpecError, SpecProblem, divides
from parallab.core.recipes import recipe_problems
from parallab.core.spec import JobSpec
from parallab.core.strategies import get_descriptor
from parallab.core.strategies.base import Draft, MeshDim, StrategyDescriptor, StrategyOptions


class Limits(BaseModel):
    """What this deployment lets one job ask for (None: no limit — `parallab plan` plans any cluster).

    Each is checked against the resolved job (a preset's default counts as asked for), and a job
    above one is refused naming the field and the limit. The server's settings hold one of these
    (`Settings.limits`, with the deployment's ceilings as defaults): every submission is checked
    against that same object.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_world_size: int | None = None
    max_steps: int | None = None
    # Ceilings on everything else a job may ask for.
    max_warmup_steps: int | None = None
    max_seq_len: int | None = None
    max_global_batch_size: int | None = None
    max_grad_accumulation_steps: int | None = None
    max_hidden_size: int | None = None
    max_ffn_hidden_size: int | None = None
    max_num_layers: int | None = None
    max_vocab_size: int | None = None
    max_num_experts: int | None = None
    max_tokens_per_step: int | None = None
    """global_batch_size × seq_len."""
    max_microbatches: int | None = None
    """Pipeline micro-batches per accumulation micro-step (pp)."""
    whose: str = Field("this deployment's", exclude=True)
    """Whose limits these are, as the refusal says it: "the server's", "parallab bench's". Wording,
    not a limit: no setting sets it and a dump leaves it out."""
    allowed_modules: frozenset[str] = frozenset()
    """Modules whose entry points the module family may run (`PARALLAB_ALLOWED_MODULES`). Empty by
    default, unlike the ceilings: a submitted entry point is code, and code runs only when allowed."""

    @field_validator("allowed_modules", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`a.b:build, c:make` → {"a.b:build", "c:make"} (the environment's form); a list or set passes as it is."""
        return parse_allow_list(value) if isinstance(value, str) else value

    @field_validator("allowed_modules")
    @classmethod
    def _callables(cls, value: frozenset[str]) -> frozenset[str]:
        """Each item names one callable: a bare module would let any of its attributes be called."""
        problems = [why for item in sorted(value) if (why := allow_list_entry_problem(item)) is not None]
        if problems:
            raise ValueError("; ".join(problems))
        return value

    def without_ceilings(self) -> Limits:
        """The allow-list alone: what planning is held to. A plan is for any cluster, not just this
        deployment's workers, so no ceiling applies; code this deployment will not run, it does not
        plan either."""
        return Limits(whose=self.whose, allowed_modules=self.allowed_modules)

    def problems(self, job: ResolvedJob) -> list[SpecProblem]:
        """One problem per ceiling the resolved job is above."""
        wl = job.workload
        asked: list[tuple[Loc, str, int, int | None]] = [
            (("workload", "warmup_steps"), "warmup steps", wl.warmup_steps, self.max_warmup_steps),
            (("workload", "seq_len"), "sequence length", wl.seq_len, self.max_seq_len),
            (("workload", "global_batch_size"), "global batch size", job.global_batch_size, self.max_global_batch_size),
            (("workload", "grad_accumulation_steps"), "gradient accumulation steps", job.accum_steps, self.max_grad_accumulation_steps),
            (("workload", "hidden_size"), "hidden size", wl.hidden_size, self.max_hidden_size),
            (("workload", "ffn_hidden_size"), "ffn hidden size", wl.ffn_hidden_size, self.max_ffn_hidden_size),
            (("workload", "num_layers"), "layers", wl.num_layers, self.max_num_layers),
            (("workload", "vocab_size"), "vocabulary size", wl.vocab_size, self.max_vocab_size),
            (("workload", "num_experts"), "experts", wl.num_experts, self.max_num_experts),
        ]
        if job.trains:
            asked.append(
                (
                    ("workload", "global_batch_size"),
                    "tokens per step (global batch × seq_len)",
                    job.tokens_per_step,
                    self.max_tokens_per_step,
                )
            )
        microbatches = getattr(job.options, "microbatches", None)
        if isinstance(microbatches, int):
            asked.append((("strategy", "options", "microbatches"), "micro-batches", microbatches, self.max_microbatches))
        out = [
            SpecProblem(loc, f"{what} {value} is above {self.whose} limit of {limit}")
            for loc, what, value, limit in asked
            if limit is not None and value > limit
        ]
        if wl.module is not None and (refused := allow_list_problem(wl.module, self.allowed_modules, self.whose)) is not None:
            out.append(refused)
        return out


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
    def nodes(self) -> int:
        """Hosts the job spans (1 unless its placement says more)."""
        return self.spec.placement.nodes if self.spec.placement is not None else 1

    @property
    def placement_order(self) -> str:
        """How the mesh is laid over the nodes (`parallab.core.spec.PlacementOrder`)."""
        return self.spec.placement.order if self.spec.placement is not None else "inner-first"

    def host_rank(self, rank: int) -> int:
        """Where mesh rank `rank` runs: its torchrun global rank (node × ranks per node + local)."""
        return host_rank(rank, [(d.name, d.size) for d in self.mesh], self.placement_order)

    def mesh_rank(self, position: int) -> int:
        """The mesh rank torchrun's global rank `position` runs (the inverse of `host_rank`)."""
        return mesh_rank(position, [(d.name, d.size) for d in self.mesh], self.placement_order)

    def node_of(self, rank: int) -> int:
        """The node mesh rank `rank` runs on."""
        return self.host_rank(rank) // max(self.ranks_per_node, 1)

    @property
    def crossing_dims(self) -> list[str]:
        """The mesh dimensions whose groups span nodes under the placement (none on one node)."""
        if self.nodes < 2:
            return []
        return crossing_dims([(d.name, d.size) for d in self.mesh], self.ranks_per_node, self.placement_order)

    @property
    def ranks_per_node(self) -> int:
        """Ranks each host runs: the world size split evenly over the nodes."""
        return self.world_size // self.nodes

    @property
    def pool(self) -> str | None:
        """The pool the spec names (None: the deployment's default)."""
        return self.spec.placement.pool if self.spec.placement is not None else None

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
    def layout(self) -> Layout | None:
        """The layout the strategy resolves to (None for job kinds that train nothing)."""
        return self.descriptor.layout(self.world_size, self.options)

    @property
    def mesh(self) -> tuple[MeshDim, ...]:
        return self.descriptor.mesh(self.world_size, self.options)

    @property
    def degrees(self) -> dict[str, int]:
        """Each layout dimension's degree by its name (`dp_replicate`, `dp_shard`, `cp`, `tp`, `pp`,
        `ep`), 1 where off — from the layout, so a 1-D preset reads the same as its layout (the
        `fsdp` preset's rank mesh names its one dimension `dp`; its layout says `dp_shard`)."""
        layout = self.layout
        names = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
        return {name: (getattr(layout, name) if layout is not None else 1) for name in names}

    @property
    def fsdp_shards(self) -> int:
        """Ranks FSDP shards parameters, gradients and optimizer state over (`Layout.fsdp_shards`)."""
        layout = self.layout
        return layout.fsdp_shards if layout is not None else 1

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

    @property
    def custom_fields(self) -> list[str]:
        """The shape fields that differ from the preset's (the strategy's defaults, e.g. MoE's
        experts, aside): the model is labelled *custom* when there are any."""
        return workload_custom_fields(self.spec.workload.model_dump(), self.strategy)

    @property
    def model_label(self) -> str:
        """`tiny`, or `custom (from tiny)` when any shape field differs from the preset."""
        return model_label(self.spec.workload.model, custom=bool(self.custom_fields))

    def workload_document(self) -> dict[str, Any]:
        """The result document's `workload` block (a valid `Workload`: it resubmits as is), with
        `custom` (derived, ignored on input): whether any shape field differs from the preset."""
        return {**self.spec.workload.model_dump(mode="json"), "custom": bool(self.custom_fields)}

    def strategy_document(self) -> dict[str, Any]:
        return self.spec.strategy.model_dump(mode="json")


def workload_custom_fields(workload: dict[str, Any], strategy: str | None = None) -> list[str]:
    """The shape fields of a workload block (a spec's or a result's) that differ from its preset's;
    the fields `strategy` fills in by default (MoE's experts on a dense preset) are the preset's."""
    preset = str(workload.get("model") or "")
    shape = {name: workload.get(name) for name in SHAPE_FIELDS}
    defaults: dict[str, Any] = {}
    if preset in PRESETS and strategy is not None:
        try:
            defaults = get_descriptor(strategy).model_defaults(PRESETS[preset], {})
        except KeyError:
            defaults = {}
    return custom_fields(preset, shape, defaults=defaults)


def model_label(preset: str, *, custom: bool) -> str:
    """How pages and the planner name a model: the preset, or `custom (from <preset>)`."""
    return f"custom (from {preset})" if custom else preset


def _options_problems(exc: ValidationError) -> list[SpecProblem]:
    return [SpecProblem(("strategy", "options", *err["loc"]), err["msg"]) for err in exc.errors()]


def _default_batch(preset_batch: int, split: int) -> int:
    """The preset's batch rounded up to a multiple of `split` (64 ranks of ddp on `tiny` get 64
    sequences, not an error); a batch the user set is checked as given instead."""
    return -(-preset_batch // split) * split


def resolve_job(spec: JobSpec, limits: Limits | None = None, *, predict_only: bool = False) -> ResolvedJob:
    """Fill defaults and check every rule; raise SpecError naming each field at fault. `predict_only`:
    the job is predicted, never run (a published run the planner is held against), so a recipe the
    ranks refuse but the planner models is let through (`recipes.not_runnable_here` says which)."""
    limits = limits or Limits()
    wl, st = spec.workload, spec.strategy
    descriptor = get_descriptor(st.name)
    world = st.world_size
    problems: list[SpecProblem] = []

    if limits.max_world_size is not None and world > limits.max_world_size:
        problems.append(
            SpecProblem(("strategy", "world_size"), f"world size {world} is above {limits.whose} limit of {limits.max_world_size}")
        )
    problems += descriptor.world_size_problems(world)
    if spec.placement is not None and world % spec.placement.nodes:
        problems.append(SpecProblem(("placement", "nodes"), f"world size {world} does not split evenly over {spec.placement.nodes} nodes"))
    if limits.max_steps is not None and wl.steps > limits.max_steps:
        problems.append(SpecProblem(("workload", "steps"), f"steps {wl.steps} is above {limits.whose} limit of {limits.max_steps}"))
    if wl.model not in PRESETS:
        problems.append(SpecProblem(("workload", "model"), f"unknown model preset {wl.model!r}; known: {', '.join(PRESETS)}"))
        raise SpecError(problems)

    try:
        options = descriptor.complete_options(descriptor.parse_options(st.options), world)
    except ValidationError as exc:
        raise SpecError(problems + _options_problems(exc)) from None

    preset = PRESETS[wl.model]
    given = wl.shape_overrides()
    hf: HFShape | None = None
    if wl.hf_config is not None:  # a config.json: its shape under the fields given beside it
        try:
            hf = read_hf_config(wl.hf_config)
        except SpecError as exc:
            raise SpecError(problems + exc.problems) from None
    overrides = hf.overrides(given, preset.config.seq_len) if hf is not None else given
    fields = model_with(wl.model, descriptor.model_defaults(preset, overrides))
    try:
        model = ModelConfig.model_validate(fields)
    except ValidationError:
        # the bounds were checked with the spec (or the config): what is left ties fields together
        shape = ModelConfig.model_construct(**fields)
        problems += [
            SpecProblem(hf.loc_of(name, given) if hf is not None else ("workload", name), msg) for name, msg in shape_problems(shape)
        ]
        raise SpecError(problems) from None
    if hf is not None:
        problems += hf.seq_len_problems(model.seq_len)

    dp = descriptor.dp_degree(world, options)
    accum = wl.grad_accumulation_steps
    split = accum * math.lcm(dp, descriptor.batch_split(world, options))
    gbs = wl.global_batch_size or _default_batch(preset.global_batch_size, split)
    problems += divides(("workload", "global_batch_size"), gbs, dp * accum, "global batch size")
    rules = descriptor.rules(Draft(model=model, world_size=world, options=options, global_batch_size=gbs, grad_accumulation_steps=accum))
    problems += [p for p in rules if not (predict_only and p.predictable)]
    layout = descriptor.layout(world, options)
    per_token = family_of(model).routes_per_token
    if descriptor.dense_only and model.is_moe and (layout is None or dims.dense_only_dims(layout, routes_per_token=per_token)):
        problems.append(
            SpecProblem(("workload", "num_experts"), f"{descriptor.name} supports dense models only; use the moe strategy for experts")
        )
    problems += recipe_problems(descriptor, options, world, wl.precision, predict_only=predict_only)
    problems += data_problems(wl.data, model.vocab_size)
    if layout is not None:
        problems += family_of(model).layout_problems(model, layout)
    problems += family_of(model).recipe_problems(model, precision=wl.precision, activation_checkpointing=wl.activation_checkpointing)
    if problems:
        raise SpecError(problems)

    lr = wl.lr if wl.lr is not None else DEFAULT_LR[wl.data]
    workload = wl.model_copy(update={**model.model_dump(), "global_batch_size": gbs, "lr": lr, "hf_config": None})
    strategy = st.model_copy(update={"options": options.model_dump(mode="json")})
    job = ResolvedJob(spec=spec.model_copy(update={"workload": workload, "strategy": strategy}))
    problems = limits.problems(job)
    if problems:
        raise SpecError(problems)
    return job
