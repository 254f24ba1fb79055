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
rank's own chunk. The bytes are parallab's own ring's (K/V blocks h wide in fp32, what its ranks
send); a torchtitan run with grouped K/V heads in bf16 sends less, behind the same compute.

One hop per layer and backward is exposed: the last, which returns the accumulated dK/dV to the
block's owner. Ring attention overlaps a hop only with the attention of the block it runs beside
(Liu et al. 2023, Ring Attention with Blockwise Transformers, arXiv 2310.01889, §3: each host's
block computation overlaps sending its K/V to the next host); after the last block's backward
there is no attention left, and the dK/dV that hop carries is what the layer's input gradient
needs. torch's ring (torch/distributed/tensor/experimental/_attention.py,
`_templated_ring_attention_backward`, at torch 1963fc8 and since) waits for it after its loop
(`dkv_rotater.next_buffer()`), and parallab's own ring waits for it before returning
(`workers/strategies/ring_attention.py`). Its bytes are the rank's chunk's dK and dV in fp32 —
exactly what torch sends, which accumulates them in fp32 (`convert_to_f32`) for K/V after
`repeat_kv` (every query head, h/tp wide). parallab's own ring departs from the textbook in its
backward: K, V, dK and dV travel together after each block's gradients and are waited for at once,
so none of its n − 1 backward hops is hidden either; the planner prices the textbook's (torch's)
ring. On 4 CPU ranks of `small` (cp 4) its ranks spent 0.013–0.023 s of a ~0.5 s profiled step
in the sends' transfers: a small share of what such a run mispredicts (its unfused per-block
attention, 0.11–0.17 s of "attention" ops where DDP's fused kernel takes 0.02 s, is the most).

Beside a pipeline and tensor parallelism (torchtitan's 4D: pp × dp_shard × cp × tp) each cp rank
of a stage runs its sequence chunk through the stage's blocks: the ring passes the stage's layers'
K/V, of the rank's 1/tp of the heads, and TP's collectives and the stage's sends carry the chunk
(`Plan.tokens_per_rank`). Predicted only: parallab's ranks do not compose cp with pp or tp, so a
run asking for it is refused (`SpecProblem.predictable`) and a prediction says so.
"""

from __future__ import annotations

from typing import ClassVar

from parallab.core.costs import GRAD_BYTES
from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan, divisible, held_grad_elements
from parallab.core.layout import MeshAxisName
from parallab.core.problems import SpecProblem


class Context(Dimension):
    not_modelled: ClassVar[tuple[str, ...]] = ("ring attention's causal load imbalance",)
    name = MeshAxisName.CP.value
    title = "context parallel ring attention"
    dense_only = True
    composes_with = frozenset({MeshAxisName.DP_SHARD.value, MeshAxisName.PP.value, MeshAxisName.TP.value})

    def rules(self, draft: Draft) -> list[SpecProblem]:
        lay = draft.layout
        cp, zigzag = lay.cp, lay.zigzag
        what = "sequence length" + (" (zig-zag: 2 chunks a rank)" if zigzag else "")
        out = divisible(
            ("workload", "seq_len"), what, draft.model.seq_len, "cp" if not zigzag else "2 × cp", cp * (2 if zigzag and cp > 1 else 1)
        )
        beside = [f"{name}={lay.degrees[name]}" for name in ("pp", "tp") if lay.degrees[name] > 1]
        if beside:
            msg = f"cp={cp} beside {' × '.join(beside)} is not composed by the ranks yet (predicted only)"
            out.append(SpecProblem((*draft.loc, "cp"), msg, predictable=True))
        return out

    def comm(self, plan: Plan) -> list[CommItem]:
        lay, cfg = plan.layout, plan.model
        n = lay.cp
        if n == 1:
            return []
        layers = lay.most_layers(cfg.num_layers)  # a pipeline rank's blocks
        block = plan.tokens_per_rank * cfg.hidden_size // lay.tp * 4  # the rank's 1/tp of the heads
        passes = layers * plan.job.accum_steps * lay.microbatches  # one forward and one backward a pass
        behind = layers * block * (2 * (n - 1) + 4 * (n - 1))  # K, V forward; K, V, dK, dV backward
        last = layers * block * 2  # the last backward hop: dK, dV back to their owner, nothing left to hide it
        stride = lay.inner("cp")  # with tp inside, a cp group spans tp ranks (and nodes where tp fills one)
        ring = [
            *(CommItem(op, behind, passes * 2 * (n - 1), 2, stride, overlap=1.0) for op in ("send", "recv")),
            *(CommItem(op, last, passes, 2, stride, overlap=0.0) for op in ("send", "recv")),
        ]
        if lay.shard_over_cp:  # FSDP's reduce-scatter over dp_shard × cp already averaged them
            return ring
        grads = held_grad_elements(plan.busiest_shapes("cp"), lay) * GRAD_BYTES
        return [*ring, CommItem("all_reduce", grads, 1, n, lay.inner("cp"))]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        n = plan.layout.cp
        if n == 1:
            return layouts
        from dataclasses import replace

        return [
            replace(a, tokens=a.tokens // n, head_tokens=a.head_tokens // n, micro_tokens=a.micro_tokens and a.micro_tokens // n)
            for a in layouts
        ]


DIMENSION = Context()
