"""`pp`: pipeline parallelism over contiguous layer stages: GPipe, 1F1B, interleaved 1F1B, zero
bubble; every rank on pp.

The model is cut into p·v stages of L/(p·v) blocks (v = `virtual_stages`, above 1 under the
interleaved and ZB-V schedules), placed on the ranks as the schedule says
(`parallab.core.layout.rank_stages`); the first stage also keeps the embedding, the last the
final norm and the LM head. The schedules' rules and formulas are the pp dimension's
(`parallab.core.dims.pp`). Each accumulation micro-step is cut into `microbatches` pipeline
micro-batches; every rank sees every row (no data parallelism on this mesh).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field

from parallab.core.dims.pp import schedule_field, virtual_stages_field
from parallab.core.layout import Layout, MeshAxisName, Schedule
from parallab.core.strategies.layout import LayoutDescriptor, OneAxisOptions


class PPOptions(OneAxisOptions):
    axis = MeshAxisName.PP

    schedule: Schedule = schedule_field()
    virtual_stages: int = virtual_stages_field()
    microbatches: int | None = Field(None, ge=1, le=4096, description="Micro-batches per step; default 2 × stages.")

    def to_layout(self, world_size: int) -> Layout:
        """The pipeline over every rank, `microbatches` defaulting to 2 × stages."""
        return replace(super().to_layout(world_size), microbatches=self.microbatches or 2 * world_size)


class PP(LayoutDescriptor[PPOptions]):
    name = "pp"
    title = "pipeline stages over layers"
    options_model = PPOptions
    dense_only = True

    def plan_grid(self, world_size: int) -> list[dict[str, Any]]:
        """GPipe, 1F1B and interleaved 1F1B over 2 chunks per rank, with 1, 2 and 4 micro-batches per
        stage (the zero-bubble schedules run, but their formulas assume equal forward, input- and
        weight-backward times, so the planner does not rank them yet)."""
        if world_size < self.min_world_size:
            return []
        plain = [{"schedule": s, "microbatches": k * world_size} for s in ("1f1b", "gpipe") for k in (1, 2, 4)]
        interleaved = [{"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": k * world_size} for k in (1, 2, 4)]
        return plain + interleaved


DESCRIPTOR = PP()
