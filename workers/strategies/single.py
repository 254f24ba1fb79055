"""`single`: the plain model on one device — the reference every other strategy is checked against."""

from __future__ import annotations

from parallab.core.strategies.base import NoOptions
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy


class Single(Strategy[NoOptions, Applied]):
    name = "single"

    def apply(self, model: Transformer, ctx: RunContext, options: NoOptions) -> Applied:
        return Applied(model.to(ctx.device))


STRATEGY = Single()
