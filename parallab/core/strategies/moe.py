"""`moe`: expert parallelism — each rank owns num_experts/N experts; tokens travel by all-to-all.

The "ep" mesh dim doubles as data parallel: each rank routes its own rows. Non-expert
parameters (router included) are replicated.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from parallab.core.layout import Layout
from parallab.core.model import Preset
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import Draft, MeshDim, StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class MoEOptions(StrategyOptions):
    aux_loss_coef: float = Field(0.01, ge=0, le=100, description="Weight of the Switch load-balancing loss.")


class MoE(ComposedCosts[MoEOptions]):
    name = "moe"
    title = "expert parallel, all-to-all dispatch"
    options_model = MoEOptions
    needs_experts = True
    plan_options = ({},)

    def layout(self, world_size: int, options: MoEOptions) -> Layout:
        return Layout(ep=world_size, aux_loss_coef=options.aux_loss_coef)

    def model_defaults(self, preset: Preset, overrides: dict[str, Any]) -> dict[str, Any]:
        """A dense preset runs with the preset's default number of experts unless the spec names some."""
        if not overrides.get("num_experts") and not preset.config.num_experts:
            return {**overrides, "num_experts": preset.moe_experts}
        return overrides

    def mesh(self, world_size: int, options: MoEOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("ep", world_size),)

    def dp_degree(self, world_size: int, options: MoEOptions) -> int:
        return world_size

    def rules(self, draft: Draft[MoEOptions]) -> list[SpecProblem]:
        return divides(("workload", "num_experts"), draft.model.num_experts, draft.world_size, "experts")


DESCRIPTOR = MoE()
