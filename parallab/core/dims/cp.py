"""cp: context parallelism — the sequence split over a ring, K/V passed around (ring attention).

Alone (the `ring` preset) or beside dp_shard (`composes_with`): every cp rank of a data-parallel
group takes the same rows and its own chunk of the sequence, so its parameters are replicated over
cp and each rank's loss covers 1/cp of the group's tokens. After backward the gradients are
averaged over cp in one flat all-reduce — beside dp_shard, of the FSDP shards the reduce-scatter
left (`held_grad_elements`), an HSDP over ("cp", "dp_shard") in effect. torchtitan shards over the
flattened dp_shard × cp instead (less memory, and no all-reduce); here the replicated-shard form
keeps each dimension's traffic on its own sub-mesh, as the prediction sums it: dp_shard's
all-gathers and reduce-scatters over dp_shard, cp's P2P hops and this all-reduce over cp.
"""

from __future__ import annotations

from typing import ClassVar

from parallab.core.costs import GRAD_BYTES
from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan, divisible, held_grad_elements
from parallab.core.problems import SpecProblem


class Context(Dimension):
    not_modelled: ClassVar[tuple[str, ...]] = ("ring attention's causal load imbalance",)
    name = "cp"
    title = "context parallel ring attention"
    dense_only = True
    composes_with = frozenset({"dp_shard"})

    def rules(self, draft: Draft) -> list[SpecProblem]:
        cp, zigzag = draft.layout.cp, draft.layout.zigzag
        what = "sequence length" + (" (zig-zag: 2 chunks a rank)" if zigzag else "")
        return divisible(
            ("workload", "seq_len"), what, draft.model.seq_len, "cp" if not zigzag else "2 × cp", cp * (2 if zigzag and cp > 1 else 1)
        )

    def comm(self, plan: Plan) -> list[CommItem]:
        lay, cfg = plan.layout, plan.model
        n = lay.cp
        if n == 1:
            return []
        block = plan.tokens_per_replica // n * cfg.hidden_size * 4
        p2p = cfg.num_layers * block * (2 * (n - 1) + 4 * (n - 1) + 2)
        hops = cfg.num_layers * plan.job.accum_steps * (2 * (n - 1) + 1)
        grads = held_grad_elements(plan.busiest_shapes("cp"), lay) * GRAD_BYTES
        return [
            CommItem("send", p2p, hops, 2, overlap=1.0),
            CommItem("recv", p2p, hops, 2, overlap=1.0),
            CommItem("all_reduce", grads, 1, n, lay.inner("cp")),
        ]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        n = plan.layout.cp
        if n == 1:
            return layouts
        from dataclasses import replace

        return [replace(a, tokens=a.tokens // n, head_tokens=a.head_tokens // n) for a in layouts]


DIMENSION = Context()
