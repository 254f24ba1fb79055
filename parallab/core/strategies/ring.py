"""`ring`: context parallelism — the sequence sharded over a ring, K/V passed around, causal.

Everything outside attention is replicated; each rank's loss covers its 1/n of the tokens, and
the gradients are averaged over the ring in one all-reduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import GRAD_BYTES
from parallab.core.families import param_counts
from parallab.core.layout import Layout
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import ActivationLayout, CommItem, Draft, MeshDim, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class RingOptions(StrategyOptions):
    zigzag: bool = Field(False, description="Load-balanced causal sharding: each rank holds chunks i and 2n−1−i.")


class Ring(StrategyDescriptor[RingOptions]):
    name = "ring"
    title = "context parallel ring attention"
    options_model = RingOptions
    dense_only = True
    plan_options = ({"zigzag": False}, {"zigzag": True})

    def layout(self, world_size: int, options: RingOptions) -> Layout:
        return Layout(cp=world_size, zigzag=options.zigzag)

    def mesh(self, world_size: int, options: RingOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("cp", world_size),)

    def rules(self, draft: Draft[RingOptions]) -> list[SpecProblem]:
        zigzag = draft.options.zigzag
        what = "sequence length" + (" (zig-zag needs 2 × ring size)" if zigzag else "")
        return divides(("workload", "seq_len"), draft.model.seq_len, draft.world_size * (2 if zigzag else 1), what)

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """K/V of the local sequence slice, fp32: forward n−1 hops of [k, v]; backward n−1 hops of
        [k, v, dk, dv] and a last hop returning [dk, dv] to the owner. Then one gradient all-reduce."""
        cfg, n = job.model, job.world_size
        block = job.global_batch_size * (cfg.seq_len // n) * cfg.hidden_size * 4
        p2p = cfg.num_layers * block * (2 * (n - 1) + 4 * (n - 1) + 2)
        return {"send": p2p, "recv": p2p, "all_reduce": param_counts(cfg).total * GRAD_BYTES}

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        """K/V hops (the next block's transfer starts before this block's attention: overlapped),
        per layer and micro-step; then one flat gradient all-reduce after backward (exposed)."""
        comm, n = self.comm_bytes_per_step(job), job.world_size
        hops = job.model.num_layers * job.accum_steps * (2 * (n - 1) + 1)
        return [
            CommItem("send", comm["send"], hops, 2, overlap=1.0),
            CommItem("recv", comm["recv"], hops, 2, overlap=1.0),
            CommItem("all_reduce", comm["all_reduce"], 1, n),
        ]

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        tokens = job.micro_batch_size * job.model.seq_len // job.world_size
        return ActivationLayout(tokens=tokens, layers=job.model.num_layers, head_tokens=tokens)


DESCRIPTOR = Ring()
