"""`fsdp`: FSDP2 `fully_shard` per block and the root — ZeRO-3 (ZeRO-2 without resharding); every
rank on dp_shard (`parallab.core.dims.dp_shard`).

Model state at rest (between steps, where it is measured) is a dim-0 shard of every parameter,
gradient and optimizer state (`torch.chunk` semantics: rank 0 holds ceil(d0/N) rows), with
`reshard_after_forward` true *and* false: false only keeps the gathered parameters alive between
a block's forward and its backward (ZeRO-2's communication, a higher peak), it does not change
the resting state.
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import MeshAxisName
from parallab.core.strategies.layout import LayoutDescriptor, OneAxisOptions


class FSDPOptions(OneAxisOptions):
    axis = MeshAxisName.DP_SHARD

    reshard_after_forward: bool = Field(True, description="True ≈ ZeRO-3; False keeps gathered params until backward (≈ ZeRO-2).")


class FSDP(LayoutDescriptor[FSDPOptions]):
    name = "fsdp"
    title = "ZeRO-3 style sharding with FSDP2"
    options_model = FSDPOptions
    plan_options = ({"reshard_after_forward": True}, {"reshard_after_forward": False})


DESCRIPTOR = FSDP()
