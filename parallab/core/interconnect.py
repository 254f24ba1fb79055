"""The interconnect sweep's options, shared by the job kinds that run it: `collectives` (the sweep
alone) and `calibrate` (the sweep as part of a pool's profile). Outside the strategies package,
so neither job kind imports the other (the strategies' import wall)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from parallab.core.options import StrategyOptions

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
ALL_OPS: tuple[CollectiveOp, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


class CollectivesOptions(StrategyOptions):
    ops: list[CollectiveOp] = Field(default_factory=lambda: list(ALL_OPS), max_length=len(ALL_OPS), description="Ops to sweep.")
    min_bytes: int = Field(1024, ge=8, le=8 * 1024**3, description="Smallest message (doubling up to max_bytes).")
    max_bytes: int = Field(64 * 1024 * 1024, ge=8, le=8 * 1024**3, description="Largest message.")
    iters: int = Field(5, ge=1, le=1000, description="Timed calls per size.")
    warmup_iters: int = Field(2, ge=0, le=100, description="Untimed calls per size first.")
