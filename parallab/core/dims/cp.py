"""cp: context parallelism — the sequence split over a ring, K/V passed around (ring attention).

Rules and costs of the ring on its own; on the rank side it runs alone for now (the `ring`
preset): composing it with the data dimensions (FSDP over dp_shard × cp, as torchtitan does) is
refused at resolution until the rank module can.
"""

from __future__ import annotations

from parallab.core.costs import GRAD_BYTES, numel
from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan, divisible
from parallab.core.problems import SpecProblem


class Context(Dimension):
    name = "cp"
    title = "context parallel ring attention"
    dense_only = True

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
        grads = sum(numel(s) for s in plan.busiest_shapes("cp")) * GRAD_BYTES
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
