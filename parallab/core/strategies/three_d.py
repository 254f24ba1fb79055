"""`3d`: pp × dp_shard × tp — pipeline stages, FSDP inside each stage, tensor parallel innermost
(a preset of a layout; torchtitan's layout for the largest models).
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.dims.pp import schedule_field, virtual_stages_field
from parallab.core.layout import Layout, Schedule
from parallab.core.problems import SpecProblem
from parallab.core.strategies.layout import OPTIONS, LayoutDescriptor, PresetOptions, preset_fields


class ThreeDOptions(PresetOptions):
    pp: int = Field(2, ge=1, le=1024, description="Pipeline stages (outer mesh dim).")
    tp: int = Field(2, ge=1, le=1024, description="Tensor-parallel degree (inner mesh dim); FSDP shards over world_size / (pp × tp).")
    schedule: Schedule = schedule_field()
    virtual_stages: int = virtual_stages_field()
    microbatches: int | None = Field(None, ge=1, le=4096, description="Micro-batches per step; default 2 × stages.")
    reshard_after_forward: bool = Field(True, description="FSDP over dp_shard: True ≈ ZeRO-3, False ≈ ZeRO-2.")

    def to_layout(self, world_size: int) -> Layout:
        return Layout(**{**preset_fields(self), "microbatches": self.microbatches or 1}, dp_shard=max(world_size // (self.pp * self.tp), 1))

    def preset_problems(self, world_size: int) -> list[SpecProblem]:
        pp, tp = self.pp, self.tp
        if world_size % (pp * tp) or min(pp, tp, world_size // (pp * tp)) < 2:
            return [
                SpecProblem(OPTIONS, f"3d needs pp, tp and dp_shard = world / (pp × tp) all ≥ 2; pp={pp} × tp={tp} on {world_size} ranks")
            ]
        return []


class ThreeD(LayoutDescriptor[ThreeDOptions]):
    name = "3d"
    title = "pipeline × FSDP × tensor parallel (pp × dp_shard × tp)"
    options_model = ThreeDOptions
    plan_options = tuple({"pp": p, "tp": t, "schedule": "1f1b", "microbatches": 2 * p} for p in (2, 4) for t in (2, 4, 8))


DESCRIPTOR = ThreeD()
