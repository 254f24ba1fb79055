"""`pp`: pipeline parallelism over contiguous layer stages: GPipe, 1F1B, interleaved 1F1B, zero bubble.

The model is cut into p·v stages of L/(p·v) blocks (v = `virtual_stages`, above 1 under the
interleaved and ZB-V schedules), placed on the ranks as the schedule says
(`parallab.core.layout.rank_stages`); the first stage also keeps the embedding, the last the
final norm and the LM head. The schedules' rules and formulas are the pp dimension's
(`parallab.core.dims.pp`). Each accumulation micro-step is cut into `microbatches` pipeline
micro-batches; every rank sees every row (no data parallelism on this mesh).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from parallab.core.dims.pp import schedule_field, schedule_rules, stage_split_rule, tied_head_rule, virtual_stages_field
from parallab.core.layout import Layout, Schedule
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import Draft, MeshDim, StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class PPOptions(StrategyOptions):
    schedule: Schedule = schedule_field()
    virtual_stages: int = virtual_stages_field()
    microbatches: int | None = Field(None, ge=1, le=4096, description="Micro-batches per step; default 2 × stages.")

    @property
    def n_microbatches(self) -> int:
        """The micro-batch count of a resolved job (resolution always fills it in)."""
        assert self.microbatches is not None, "unresolved pp options"
        return self.microbatches


class PP(ComposedCosts[PPOptions]):
    name = "pp"
    title = "pipeline stages over layers"
    options_model = PPOptions
    dense_only = True

    def layout(self, world_size: int, options: PPOptions) -> Layout:
        return Layout(
            pp=world_size,
            schedule=options.schedule,
            virtual_stages=options.virtual_stages,
            microbatches=options.microbatches or 2 * world_size,
        )

    def plan_grid(self, world_size: int) -> list[dict[str, Any]]:
        """GPipe, 1F1B and interleaved 1F1B over 2 chunks per rank, with 1, 2 and 4 micro-batches per
        stage (the zero-bubble schedules run, but their formulas assume equal forward, input- and
        weight-backward times, so the planner does not rank them yet)."""
        if world_size < self.min_world_size:
            return []
        plain = [{"schedule": s, "microbatches": k * world_size} for s in ("1f1b", "gpipe") for k in (1, 2, 4)]
        interleaved = [{"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": k * world_size} for k in (1, 2, 4)]
        return plain + interleaved

    def complete_options(self, options: PPOptions, world_size: int) -> PPOptions:
        if options.microbatches is None:
            return options.model_copy(update={"microbatches": 2 * world_size})
        return options

    def mesh(self, world_size: int, options: PPOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("pp", world_size),)

    def batch_split(self, world_size: int, options: PPOptions) -> int:
        return options.n_microbatches

    def rules(self, draft: Draft[PPOptions]) -> list[SpecProblem]:
        layout = self.layout(draft.world_size, draft.options)
        out = stage_split_rule(draft.model, layout)
        out += tied_head_rule(draft.model, draft.world_size)
        out += schedule_rules(("strategy", "options"), layout)
        out += divides(
            ("workload", "global_batch_size"),
            draft.global_batch_size,
            layout.microbatches * draft.grad_accumulation_steps,
            "global batch size",
        )
        return out

    def stage_layers(self, model: ModelConfig, world_size: int, options: PPOptions) -> list[range]:
        """Every stage's blocks, p·v stages (`Layout.stage_ranks` says which rank holds each)."""
        return self.layout(world_size, options).stage_layer_ranges(model.num_layers)


DESCRIPTOR = PP()
