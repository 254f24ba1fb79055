"""`hsdp`: dp_replicate × dp_shard — FSDP2 on a 2-D mesh: shard inside a group, replicate across
groups (a preset of a layout). Gradients are reduce-scattered inside the group, then the shard is
all-reduced across the replicas.
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import Layout
from parallab.core.problems import SpecProblem
from parallab.core.strategies.layout import OPTIONS, LayoutDescriptor, PresetOptions, preset_fields


class HSDPOptions(PresetOptions):
    dp_replicate: int = Field(2, ge=1, le=1024, description="Replicas (outer mesh dim); FSDP shards over world_size / dp_replicate.")
    reshard_after_forward: bool = Field(True, description="FSDP over dp_shard: True ≈ ZeRO-3, False ≈ ZeRO-2.")

    def to_layout(self, world_size: int) -> Layout:
        return Layout(**preset_fields(self), dp_shard=max(world_size // self.dp_replicate, 1))

    def preset_problems(self, world_size: int) -> list[SpecProblem]:
        rep, loc = self.dp_replicate, (*OPTIONS, "dp_replicate")
        if world_size % rep or rep < 2 or world_size // rep < 2:
            return [
                SpecProblem(
                    loc, f"hsdp needs dp_replicate ≥ 2 dividing the world size and dp_shard ≥ 2; dp_replicate={rep} on {world_size} ranks"
                )
            ]
        return []


class HSDP(LayoutDescriptor[HSDPOptions]):
    name = "hsdp"
    title = "FSDP2 sharding inside replicas (dp_replicate × dp_shard)"
    options_model = HSDPOptions
    plan_options = tuple({"dp_replicate": r, "reshard_after_forward": ra} for r in (2, 4, 8) for ra in (True, False))


DESCRIPTOR = HSDP()
