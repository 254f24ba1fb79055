"""`moe`: expert parallelism — each rank owns num_experts/N experts; tokens travel by all-to-all
(every rank on ep, `parallab.core.dims.ep`).

The ep dim doubles as data parallel: each rank routes its own rows. Non-expert parameters
(router included) are replicated.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from parallab.core.layout import MeshAxisName
from parallab.core.model import Preset
from parallab.core.strategies.layout import LayoutDescriptor, OneAxisOptions


class MoEOptions(OneAxisOptions):
    axis = MeshAxisName.EP

    aux_loss_coef: float = Field(0.01, ge=0, le=100, description="Weight of the Switch load-balancing loss.")


class MoE(LayoutDescriptor[MoEOptions]):
    name = "moe"
    title = "expert parallel, all-to-all dispatch"
    options_model = MoEOptions
    needs_experts = True
    plan_options = ({},)

    def model_defaults(self, preset: Preset, overrides: dict[str, Any]) -> dict[str, Any]:
        """A dense preset runs with the preset's default number of experts unless the spec names some."""
        if not overrides.get("num_experts") and not preset.config.num_experts:
            return {**overrides, "num_experts": preset.moe_experts}
        return overrides


DESCRIPTOR = MoE()
