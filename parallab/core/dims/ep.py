"""ep: expert parallelism — each rank owns num_experts/ep experts; tokens travel by all-to-all.

Rules and costs on its own; on the rank side it runs alone for now (the `moe` preset, whose ranks
also split the batch). Composing it with dp_shard (torchtitan borrows the expert ranks from the
data and context dims) is refused at resolution until the rank module can.
"""

from __future__ import annotations

from typing import ClassVar

from parallab.core.costs import GRAD_BYTES, Tensor, activation_dtype_bytes, chunk, numel
from parallab.core.dims.base import CommItem, Dimension, Draft, Plan, divisible
from parallab.core.layout import Layout
from parallab.core.problems import SpecProblem


class Expert(Dimension):
    name = "ep"
    title = "expert parallel, all-to-all dispatch"
    splits_batch: ClassVar[bool] = True

    def rules(self, draft: Draft) -> list[SpecProblem]:
        ep, model = draft.layout.ep, draft.model
        if ep > 1 and not model.is_moe:
            return [
                SpecProblem(
                    ("workload", "num_experts"), f"ep={ep} needs a model with experts; {model.num_experts or 0} experts is a dense model"
                )
            ]
        return divisible(("workload", "num_experts"), "experts", model.num_experts or 0, "ep", ep)

    def local_shape(self, t: Tensor, shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
        return chunk(shape, 0, layout.ep) if t.expert else shape

    def comm(self, plan: Plan) -> list[CommItem]:
        cfg, n = plan.model, plan.layout.ep
        if n == 1:
            return []
        act = activation_dtype_bytes(plan.precision)
        rows = plan.tokens_per_replica // n * cfg.top_k
        a2a = cfg.moe_layers * (4 * rows * cfg.hidden_size * act + 8 * cfg.num_experts)
        dense = sum(numel(s) for t, s in zip(plan.stages[0], plan.local_shapes("dp_shard")[0], strict=True) if not t.expert)
        return [
            CommItem("all_to_all", a2a, 6 * cfg.moe_layers * plan.job.accum_steps, n),
            CommItem("all_reduce", dense * GRAD_BYTES, 1, n),
        ]


DIMENSION = Expert()
