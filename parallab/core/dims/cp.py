"""cp: context parallelism — the sequence split over a ring, K/V passed around (ring attention).

Alone (the `ring` preset) or beside dp_shard (`composes_with`): every cp rank of a data-parallel
group takes the same rows and its own chunk of the sequence, so its parameters are replicated over
cp and each rank's loss covers 1/cp of the group's tokens. After backward the gradients are
averaged over cp in one flat all-reduce — beside dp_shard, of the FSDP shards the reduce-scatter
left (`held_grad_elements`), an HSDP over ("cp", "dp_shard") in effect. torchtitan shards over the
flattened dp_shard × cp instead (its `dp_shard_cp` mesh: less memory, and no all-reduce), which
the planner predicts under `shard_over_cp` (parallab's ranks run the replicated form): FSDP's
all-gathers and reduce-scatters then span dp_shard × cp and this all-reduce is gone.
The K/V exchange is counted as ring hops, overlapped with the next chunk's attention; torchtitan's
default rotate method all-gathers the same (n − 1)/n of K/V per pass instead, also behind the
rank's own chunk.
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
        ring = [CommItem("send", p2p, hops, 2, overlap=1.0), CommItem("recv", p2p, hops, 2, overlap=1.0)]
        if lay.shard_over_cp:  # FSDP's reduce-scatter over dp_shard × cp already averaged them
            return ring
        grads = held_grad_elements(plan.busiest_shapes("cp"), lay) * GRAD_BYTES
        return [*ring, CommItem("all_reduce", grads, 1, n, lay.inner("cp"))]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        n = plan.layout.cp
        if n == 1:
            return layouts
        from dataclasses import replace

        return [replace(a, tokens=a.tokens // n, head_tokens=a.head_tokens // n) for a in layouts]


DIMENSION = Context()
