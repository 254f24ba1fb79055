"""`collectives`: not a training strategy but a job kind — an nccl-tests-style sweep of the interconnect.

It trains nothing, so it has no model costs and no prediction; the registry lists it so that the
spec, the API, the form and the worker treat it like any other job (`trains` is False).
"""

from __future__ import annotations

from typing import ClassVar

from parallab.core.interconnect import ALL_OPS, CollectiveOp, CollectivesOptions
from parallab.core.problems import SpecProblem
from parallab.core.strategies.base import Draft, StrategyDescriptor

__all__ = ["ALL_OPS", "DESCRIPTOR", "CollectiveOp", "Collectives", "CollectivesOptions"]


class Collectives(StrategyDescriptor[CollectivesOptions]):
    name = "collectives"
    title = "nccl-tests-style sweep of the interconnect (a job kind, not a strategy)"
    options_model = CollectivesOptions
    trains: ClassVar[bool] = False

    def rules(self, draft: Draft[CollectivesOptions]) -> list[SpecProblem]:
        if draft.options.min_bytes > draft.options.max_bytes:
            return [SpecProblem(("strategy", "options", "min_bytes"), "min_bytes is above max_bytes")]
        return []


DESCRIPTOR = Collectives()
