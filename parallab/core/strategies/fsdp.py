"""`fsdp`: FSDP2 `fully_shard` per block and the root — ZeRO-3 (ZeRO-2 without resharding).

Model state at rest (between steps, where it is measured) is a dim-0 shard of every parameter,
gradient and optimizer state (`torch.chunk` semantics: rank 0 holds ceil(d0/N) rows), with
`reshard_after_forward` true *and* false: false only keeps the gathered parameters alive between
a block's forward and its backward (ZeRO-2's communication, a higher peak), it does not change
the resting state.
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import Layout
from parallab.core.strategies.base import StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class FSDPOptions(StrategyOptions):
    reshard_after_forward: bool = Field(True, description="True ≈ ZeRO-3; False keeps gathered params until backward (≈ ZeRO-2).")


class FSDP(ComposedCosts[FSDPOptions]):
    name = "fsdp"
    title = "ZeRO-3 style sharding with FSDP2"
    options_model = FSDPOptions
    plan_options = ({"reshard_after_forward": True}, {"reshard_after_forward": False})

    def layout(self, world_size: int, options: FSDPOptions) -> Layout:
        return Layout(dp_shard=world_size, reshard_after_forward=options.reshard_after_forward)


DESCRIPTOR = FSDP()
