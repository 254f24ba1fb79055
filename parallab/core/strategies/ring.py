"""`ring`: context parallelism — the sequence sharded over a ring, K/V passed around, causal; every
rank on cp (`parallab.core.dims.cp`).

Everything outside attention is replicated; each rank's loss covers its 1/n of the tokens, and
the gradients are averaged over the ring in one all-reduce.
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import MeshAxisName
from parallab.core.strategies.layout import LayoutDescriptor, OneAxisOptions


class RingOptions(OneAxisOptions):
    axis = MeshAxisName.CP

    zigzag: bool = Field(False, description="Load-balanced causal sharding: each rank holds chunks i and 2n−1−i.")


class Ring(LayoutDescriptor[RingOptions]):
    name = "ring"
    title = "context parallel ring attention"
    options_model = RingOptions
    dense_only = True
    plan_options = ({"zigzag": False}, {"zigzag": True})


DESCRIPTOR = Ring()
