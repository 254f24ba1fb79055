"""`collectives`: not a training strategy but a job kind — an nccl-tests-style sweep of the interconnect.

It trains nothing, so it has no model costs and no prediction; the registry lists it so that the
spec, the API, the form and the worker treat it like any other job (`trains` is False).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from parallab.core.problems import SpecProblem
from parallab.core.strategies.base import Draft, MeshDim, StrategyDescriptor, StrategyOptions

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
ALL_OPS: tuple[CollectiveOp, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


class CollectivesOptions(StrategyOptions):
    ops: list[CollectiveOp] = Field(default_factory=lambda: list(ALL_OPS), max_length=len(ALL_OPS), description="Ops to sweep.")
    min_bytes: int = Field(1024, ge=8, le=8 * 1024**3, description="Smallest message (doubling up to max_bytes).")
    max_bytes: int = Field(64 * 1024 * 1024, ge=8, le=8 * 1024**3, description="Largest message.")
    iters: int = Field(5, ge=1, le=1000, description="Timed calls per size.")
    warmup_iters: int = Field(2, ge=0, le=100, description="Untimed calls per size first.")


class Collectives(StrategyDescriptor[CollectivesOptions]):
    name = "collectives"
    title = "nccl-tests-style sweep of the interconnect (a job kind, not a strategy)"
    options_model = CollectivesOptions
    trains: ClassVar[bool] = False

    def mesh(self, world_size: int, options: CollectivesOptions) -> tuple[MeshDim, ...]:
        """No mesh: the sweep runs on the default process group."""
        return ()

    def batch_split(self, world_size: int, options: CollectivesOptions) -> int:
        return 1

    def rules(self, draft: Draft[CollectivesOptions]) -> list[SpecProblem]:
        if draft.options.min_bytes > draft.options.max_bytes:
            return [SpecProblem(("strategy", "options", "min_bytes"), "min_bytes is above max_bytes")]
        return []


DESCRIPTOR = Collectives()
