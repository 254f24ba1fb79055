"""A layout: how a run's ranks are split over the parallelism dimensions, and each one's options.

A layout is the unit of parallelism (torchtitan's `ParallelDims`): degrees
`{dp_replicate, dp_shard, cp, tp, pp, ep}` whose product is the world size, plus the options of
each dimension. The named strategies (`ddp`, `fsdp`, `hybrid`, `3d`, ...) are presets that
resolve to a layout (`StrategyDescriptor.layout`); the dimensions' descriptors
(`parallab.core.dims`) say what each degree costs, and `parallab.core.dims.compose` sums them.

The ranks build one device mesh whose dims are the degrees above one, in torchtitan's order:
pipeline outermost (its P2P tolerates the slowest links), then replication, sharding, context,
and tensor parallel innermost (it talks the most, so it gets the closest ranks).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Literal

MESH_ORDER: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
"""Every dimension, outer first (the device mesh's order; `ep` last: a data-like dim of its own whose
all-to-all takes the closest ranks, composed with dp_shard only so far, see `parallab.core.dims.ep`)."""
DEGREE_NAMES: frozenset[str] = frozenset(MESH_ORDER)


@dataclass(frozen=True)
class Layout:
    """Degrees (1: the dimension is off, a no-op) and every dimension's options."""

    dp_replicate: int = 1
    """Full replicas whose gradients are all-reduced (DDP; HSDP's outer dim)."""
    dp_shard: int = 1
    """Ranks that shard parameters, gradients and optimizer state (FSDP2)."""
    cp: int = 1
    """Ranks a sequence is split over (ring attention)."""
    tp: int = 1
    """Ranks each matmul is split over (Megatron column/row)."""
    pp: int = 1
    """Pipeline stages."""
    ep: int = 1
    """Ranks the experts are split over (all-to-all dispatch)."""
    sequence_parallel: bool = False
    """tp: shard norms and the residual stream over the sequence."""
    reshard_after_forward: bool = True
    """dp_shard: True ≈ ZeRO-3, False ≈ ZeRO-2."""
    bucket_cap_mb: float = 25.0
    """dp_replicate: DDP's gradient bucket size (MB)."""
    schedule: Literal["gpipe", "1f1b"] = "1f1b"
    """pp: the pipeline schedule."""
    microbatches: int = 1
    """pp: micro-batches per accumulation micro-step (filled in at resolution)."""
    zigzag: bool = False
    """cp: load-balanced causal sharding."""
    aux_loss_coef: float = 0.01
    """ep: weight of the load-balancing loss."""

    @property
    def degrees(self) -> dict[str, int]:
        """Every degree, in mesh order."""
        return {name: int(getattr(self, name)) for name in MESH_ORDER}

    @property
    def size(self) -> int:
        """The product of the degrees: the world size the layout needs."""
        return math.prod(self.degrees.values())

    @property
    def dp(self) -> int:
        """Ways the global batch is split: replicas × shards × expert ranks (each routes its own rows)."""
        return self.dp_replicate * self.dp_shard * self.ep

    @property
    def on(self) -> tuple[str, ...]:
        """The dimensions of degree above one, in mesh order (the device mesh's named dims)."""
        return tuple(name for name, d in self.degrees.items() if d > 1)

    def inner(self, name: str) -> int:
        """The product of the degrees inside `name` on the mesh: the rank distance between the
        members of one of its groups."""
        after = MESH_ORDER[MESH_ORDER.index(name) + 1 :]
        return math.prod(self.degrees[d] for d in after)

    def label(self) -> str:
        """`pp=2,dp_shard=2,tp=2`: the dimensions that are on ("single" when none is)."""
        return ",".join(f"{name}={d}" for name, d in self.degrees.items() if d > 1) or "single"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def option_names() -> tuple[str, ...]:
    """The layout's fields that are not degrees (each dimension's options)."""
    return tuple(f.name for f in fields(Layout) if f.name not in DEGREE_NAMES)


def parse_layout(text: str) -> dict[str, int]:
    """`pp=2,dp_shard=2,tp=2` → {"pp": 2, "dp_shard": 2, "tp": 2}; ValueError naming the bad part."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in DEGREE_NAMES:
            raise ValueError(f"{part!r} is not DIM=DEGREE with DIM one of {', '.join(MESH_ORDER)}")
        try:
            degree = int(value)
        except ValueError:
            raise ValueError(f"{part!r}: the degree must be a whole number") from None
        if degree < 1:
            raise ValueError(f"{part!r}: a degree is at least 1")
        if name in out:
            raise ValueError(f"{name} is given twice")
        out[name] = degree
    if not out:
        raise ValueError("an empty layout: give DIM=DEGREE pairs such as pp=2,dp_shard=2,tp=2")
    return out
