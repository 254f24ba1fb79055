"""A layout: how a run's ranks are split over the parallelism dimensions, and each one's options.

A layout is the unit of parallelism (torchtitan's `ParallelDims`): degrees
`{dp_replicate, dp_shard, cp, tp, pp, ep}` whose product is the world size, plus the options of
each dimension. The named strategies (`ddp`, `fsdp`, `hybrid`, `3d`, ...) are presets that
resolve to a layout (`StrategyDescriptor.layout`); the dimensions' descriptors
(`parallab.core.dims`) say what each degree costs, and `parallab.core.dims.compose` sums them.

The ranks build one device mesh whose dims are the degrees above one, in torchtitan's order:
pipeline outermost (its P2P tolerates the slowest links), then replication, sharding, context,
and tensor parallel innermost (it talks the most, so it gets the closest ranks).

Pipeline schedules (`SCHEDULES`) and where each puts its stages: with v model chunks (virtual
stages) per rank the model is cut into p·v stages of L/(p·v) contiguous blocks each; stage k
keeps blocks [k·L/(p·v), (k+1)·L/(p·v)), the first stage the embedding and the last the final
norm and head. Which rank holds stage k is the schedule's:

- GPipe, 1F1B: one stage per rank, stage k on rank k;
- interleaved 1F1B and interleaved zero bubble (torch's `ScheduleInterleaved1F1B`,
  `ScheduleInterleavedZeroBubble`): loop placement, stage k on rank k mod p, so rank r holds
  r, r+p, r+2p, … (Narayanan et al. 2021, §2.2.2);
- ZB-V (`ScheduleZBVZeroBubble`): exactly two chunks per rank in a V, rank r holds stages r and
  2p−1−r, so rank 0 holds the first and the last (Qi et al. 2024, §6; torch's
  `generate_stage_to_rank_mapping(style="v")`).

The core's formulas and the ranks read the same table, so the stage layout is written once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Literal


class MeshAxisName(str, Enum):
    """The one vocabulary of mesh dimensions (torchtitan's `MeshAxisName`): a layout's degrees,
    the device mesh's dim names, the dimensions' modules (`parallab.core.dims`), the process groups
    the predictions name. Every table that names a dimension reads it from here."""

    PP = "pp"
    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"
    CP = "cp"
    TP = "tp"
    EP = "ep"


MESH_ORDER: tuple[str, ...] = tuple(axis.value for axis in MeshAxisName)
"""Every dimension, outer first (the device mesh's order; `ep` last: a data-like dim of its own whose
all-to-all takes the closest ranks, composed with dp_shard only so far, see `parallab.core.dims.ep`)."""
DATA_PARALLEL_AXES: tuple[str, ...] = (MeshAxisName.DP_REPLICATE.value, MeshAxisName.DP_SHARD.value)
"""Replicas and shards: the two data-parallel dims, which the tables that fold them into one
data-parallel degree (a plan row's mesh, an accuracy band's kind) count together as `DATA_PARALLEL`."""
DATA_PARALLEL = "dp"
"""The label of replicas × shards counted together — a column of a table, never a mesh dim."""
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
    schedule: Schedule = "1f1b"
    """pp: the pipeline schedule."""
    virtual_stages: int = 1
    """pp: model chunks (virtual stages) per rank; above 1 only under a multi-chunk schedule."""
    microbatches: int = 1
    """pp: micro-batches per accumulation micro-step (filled in at resolution)."""
    zigzag: bool = False
    """cp: load-balanced causal sharding."""
    async_tp: bool = False
    """tp: torch's async (micro-pipelined) TP, as torchtitan's `enable_async_tensor_parallel` asks.
    Predicted only: under torch.compile with sequence parallelism the planner times each block's
    fused all-gathers and reduce-scatters against their matmuls (`dims.tp.async_tp_items`), else as
    without it, and every prediction that asks for it says which; parallab's ranks do not run it."""
    shard_over_cp: bool = False
    """cp: FSDP shards over dp_shard × cp, torchtitan's flattened `dp_shard_cp` mesh (the cp ranks
    also shard parameters, gradients and optimizer state), instead of replicating the dp_shard
    shards over cp. Predicted only: parallab's ranks run the replicated form."""
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
    def fsdp_shards(self) -> int:
        """Ranks FSDP shards over: dp_shard, times cp where the cp ranks shard too (`shard_over_cp`)."""
        return self.dp_shard * (self.cp if self.shard_over_cp else 1)

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

    @property
    def stages(self) -> int:
        """Pipeline stages: pp × virtual stages per rank."""
        return self.pp * self.virtual_stages

    def rank_layers(self, num_layers: int) -> list[int]:
        """Blocks each pp rank holds (`rank_layers`): L/p each where the stages divide L."""
        return rank_layers(num_layers, self.pp, self.virtual_stages, self.schedule)

    def most_layers(self, num_layers: int) -> int:
        """Blocks of the pp rank that holds the most (the busiest stage's)."""
        return max(self.rank_layers(num_layers))

    def stage_layer_ranges(self, num_layers: int) -> list[range]:
        """Every pipeline stage's blocks, stage 0 first (`rank_stages` says which rank holds each)."""
        return [stage_layers(num_layers, self.stages, k) for k in range(self.stages)]

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


# ---- pipeline schedules: where each puts its stages ----

Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb", "zbv"]
"""pp's schedules (`torch.distributed.pipelining`): GPipe and 1F1B hold one stage per rank; the
interleaved ones (`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`) `virtual_stages`
per rank in loop order, ZB-V (`ScheduleZBVZeroBubble`) two per rank in V order
(`parallab.core.dims.pp`)."""


@dataclass(frozen=True)
class ScheduleFacts:
    """What the descriptor's rules and formulas, and the ranks, need to know of one schedule."""

    name: str
    title: str
    chunks: int | None
    """Chunks per rank the schedule takes: 1 (a single-stage schedule), 2 (ZB-V), None (any v ≥ 1)."""
    v_shape: bool = False
    """Stages placed in a V (rank r: r and 2p−1−r) rather than in a loop (rank r: r, r+p, …)."""
    split_backward: bool = False
    """Backward split into input and weight gradients (the zero-bubble schedules)."""
    rounds: bool = False
    """torch's interleaved schedules run m in max(1, m // p) rounds, and m must be a multiple of
    the number of rounds (`ScheduleInterleaved1F1B.__init__`)."""


SCHEDULES: dict[str, ScheduleFacts] = {
    s.name: s
    for s in (
        ScheduleFacts("gpipe", "GPipe: all forwards, then all backwards", chunks=1),
        ScheduleFacts("1f1b", "1F1B: one forward, one backward in the steady state", chunks=1),
        ScheduleFacts("interleaved_1f1b", "interleaved 1F1B over virtual stages (loop placement)", chunks=None, rounds=True),
        ScheduleFacts(
            "interleaved_zb",
            "interleaved zero bubble (ZB1P)",
            chunks=None,
            split_backward=True,
            rounds=True,
        ),
        ScheduleFacts("zbv", "ZB-V zero bubble: two chunks per rank in a V", chunks=2, v_shape=True, split_backward=True),
    )
}


def stage_rank(stage: int, pp: int, schedule: str) -> int:
    """The pp rank that holds pipeline stage `stage`."""
    if SCHEDULES[schedule].v_shape and stage >= pp:
        return 2 * pp - 1 - stage
    return stage % pp


def rank_stages(rank: int, pp: int, virtual_stages: int, schedule: str) -> list[int]:
    """The stages pp rank `rank` holds, in ascending order (its chunks)."""
    return [k for k in range(pp * virtual_stages) if stage_rank(k, pp, schedule) == rank]


def stage_sizes(num_layers: int, stages: int) -> list[int]:
    """Blocks per stage, torchtitan's split (`generate_split_points`, pipelining_utils.py at
    9dec370): L // S each, the middle stages one more while L % S lasts, the last stage the rest —
    equal stages wherever S divides L (Llama 3.1 405B's 126 over 8: 15, 16 × 6, 15)."""
    base, extra = divmod(num_layers, stages)
    sizes = [base]
    for _ in range(1, stages - 1):
        sizes.append(base + (1 if extra > 0 else 0))
        extra -= 1 if extra > 0 else 0
    if stages > 1:
        sizes.append(num_layers - sum(sizes))
    return sizes


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The blocks of stage `stage` of `stages` contiguous stages (`stage_sizes`)."""
    sizes = stage_sizes(num_layers, stages)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def rank_layers(num_layers: int, pp: int, virtual_stages: int, schedule: str) -> list[int]:
    """Blocks each pp rank holds over its stages (`rank_stages`), rank 0 first."""
    sizes = stage_sizes(num_layers, pp * virtual_stages)
    return [sum(sizes[k] for k in rank_stages(r, pp, virtual_stages, schedule)) for r in range(pp)]


def last_stage_rank(pp: int, virtual_stages: int, schedule: str) -> int:
    """The pp rank that holds the last stage (the head and the loss): p−1, or 0 under ZB-V."""
    return stage_rank(pp * virtual_stages - 1, pp, schedule)


def p2p_per_microbatch(rank: int, pp: int, virtual_stages: int, schedule: str) -> int:
    """Sends (equally, receives) pp rank `rank` makes per micro-batch: per stage boundary k→k+1
    held on two different ranks, the activation goes forward from k's rank and its gradient comes
    back from k+1's. With one stage per rank a micro-batch crosses p−1 boundaries; with v chunks
    in a loop, v·p−1 (every one between ranks); in a V, 2p−2 (stages p−1 and p share a rank)."""
    sends = 0
    for k in range(pp * virtual_stages - 1):
        here, there = stage_rank(k, pp, schedule), stage_rank(k + 1, pp, schedule)
        if here != there:
            sends += (here == rank) + (there == rank)
    return sends
