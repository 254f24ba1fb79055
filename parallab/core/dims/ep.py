"""ep: expert parallelism — each rank owns num_experts/ep experts; tokens travel by all-to-all.

Its ranks also split the batch (each routes its own rows), alone (the `moe` preset) or beside
dp_shard (`composes_with`) — torchtitan borrows the expert ranks from the data dims; here they
are a mesh dim of their own, innermost, and the data-parallel degree counts them. Beside
dp_shard, FSDP shards every tensor over dp_shard as the ep step left it (an expert slice is one
more tensor to shard). After backward the non-expert gradients (router included) are averaged
over ep in one flat all-reduce — of the FSDP shards the reduce-scatter left
(`held_grad_elements`) — and the expert gradients, which the all-to-all's backward already summed
over ep, are divided by ep: each dimension's traffic stays on its own sub-mesh.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from parallab.core.costs import A2A_CALLS, GRAD_BYTES, Tensor, activation_dtype_bytes, chunk
from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan, divisible, held_grad_elements
from parallab.core.layout import Layout, MeshAxisName
from parallab.core.problems import SpecProblem


class Expert(Dimension):
    not_modelled: ClassVar[tuple[str, ...]] = ("expert load imbalance",)
    name = MeshAxisName.EP.value
    title = "expert parallel, all-to-all dispatch"
    splits_batch: ClassVar[bool] = True
    composes_with: ClassVar[frozenset[str] | None] = frozenset({MeshAxisName.DP_SHARD.value})

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
        rows = plan.tokens_per_replica * cfg.top_k  # a replica is one ep rank's rows: it sends each of its slots
        a2a = cfg.moe_layers * (4 * rows * cfg.hidden_size * act + 8 * cfg.num_experts)
        dense = [s for t, s in zip(plan.stages[0], plan.local_shapes("dp_shard")[0], strict=True) if not t.expert]
        stride = plan.layout.inner("ep")
        return [
            CommItem("all_to_all", a2a, A2A_CALLS * cfg.moe_layers * plan.job.accum_steps, n, stride),
            CommItem("all_reduce", held_grad_elements(dense, plan.layout) * GRAD_BYTES, 1, n, stride),
        ]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        """Each rank's experts compute as many rows as it routes (even routing): num_experts/ep of them."""
        if plan.layout.ep == 1:
            return layouts
        return [replace(a, experts_local=plan.model.num_experts // plan.layout.ep) for a in layouts]


DIMENSION = Expert()
