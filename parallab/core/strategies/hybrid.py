"""`hybrid`: tp × dp_shard — tensor parallel inside each FSDP group (a preset of a layout).

The degrees are the options' `tp` and dp_shard = world / tp; costs, mesh and rules are the
dimensions' (`parallab.core.dims`), composed.
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.dims.tp import async_tp_field
from parallab.core.layout import Layout
from parallab.core.options import FlagsStoredWhenOn
from parallab.core.problems import SpecProblem
from parallab.core.strategies.layout import OPTIONS, LayoutDescriptor, PresetOptions, preset_fields


class HybridOptions(FlagsStoredWhenOn, PresetOptions):
    stored_when_on = ("async_tp",)
    tp: int = Field(2, ge=1, le=1024, description="Tensor-parallel degree (inner mesh dim); FSDP runs over world_size / tp.")
    reshard_after_forward: bool = Field(True, description="FSDP over dp: True ≈ ZeRO-3, False ≈ ZeRO-2.")
    sequence_parallel: bool = Field(False, description="TP with sequence parallel norms and residual.")
    async_tp: bool = async_tp_field()

    def to_layout(self, world_size: int) -> Layout:
        return Layout(**preset_fields(self), dp_shard=max(world_size // self.tp, 1))

    def preset_problems(self, world_size: int) -> list[SpecProblem]:
        tp, loc = self.tp, (*OPTIONS, "tp")
        if world_size % tp:
            return [SpecProblem(loc, f"mesh tp={tp} × dp does not make world size {world_size}")]
        if tp < 2 or world_size // tp < 2:
            return [SpecProblem(loc, f"hybrid needs tp ≥ 2 and dp ≥ 2; tp={tp} on {world_size} ranks gives dp={world_size // tp}")]
        return []


class Hybrid(LayoutDescriptor[HybridOptions]):
    name = "hybrid"
    title = "TP × FSDP on a 2-D mesh"
    options_model = HybridOptions
    plan_options = tuple({"tp": t, "sequence_parallel": sp} for t in (2, 4, 8, 16) for sp in (False, True))


DESCRIPTOR = Hybrid()
