"""`pp`: pipeline parallelism over contiguous layer stages, GPipe or 1F1B schedules.

Stage s keeps blocks [s·L/p, (s+1)·L/p); the first stage also keeps the embedding, the last the
final norm and the LM head. Each accumulation micro-step is cut into `microbatches` pipeline
micro-batches; every rank sees every row (no data parallelism on this mesh).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from parallab.core.dims.pp import tied_head_rule
from parallab.core.layout import Layout
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import Draft, MeshDim, StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class PPOptions(StrategyOptions):
    schedule: Literal["gpipe", "1f1b"] = Field("1f1b", description="GPipe (all forwards, then all backwards) or 1F1B.")
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
        return Layout(pp=world_size, schedule=options.schedule, microbatches=options.microbatches or 2 * world_size)

    def plan_grid(self, world_size: int) -> list[dict[str, Any]]:
        """Both schedules, with 1, 2 and 4 micro-batches per stage."""
        if world_size < self.min_world_size:
            return []
        return [{"schedule": s, "microbatches": k * world_size} for s in ("1f1b", "gpipe") for k in (1, 2, 4)]

    def complete_options(self, options: PPOptions, world_size: int) -> PPOptions:
        if options.microbatches is None:
            return options.model_copy(update={"microbatches": 2 * world_size})
        return options

    def mesh(self, world_size: int, options: PPOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("pp", world_size),)

    def batch_split(self, world_size: int, options: PPOptions) -> int:
        return options.n_microbatches

    def rules(self, draft: Draft[PPOptions]) -> list[SpecProblem]:
        stages, mb = draft.world_size, draft.options.n_microbatches
        out = divides(("workload", "num_layers"), draft.model.num_layers, stages, "layers")
        out += tied_head_rule(draft.model, stages)
        if mb < stages:
            out.append(
                SpecProblem(
                    ("strategy", "options", "microbatches"), f"micro-batches ({mb}) must be at least the number of stages ({stages})"
                )
            )
        out += divides(("workload", "global_batch_size"), draft.global_batch_size, mb * draft.grad_accumulation_steps, "global batch size")
        return out

    def stage_layers(self, model: ModelConfig, world_size: int, options: PPOptions) -> list[range]:
        per = model.num_layers // world_size
        return [range(s * per, (s + 1) * per) for s in range(world_size)]


DESCRIPTOR = PP()
