"""`hybrid`: a 2-D mesh ("dp", "tp") — tensor parallel inside each dp group, then FSDP over dp.

The one descriptor that composes others, in the fixed order the rank side applies them (TP first,
then FSDP over the TP-local shards): its rules and costs are TP's and FSDP's, on their mesh dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import activation_dtype_bytes, chunk, gathered_param_bytes, model_tensors, numel, tp_local
from parallab.core.problems import SpecProblem
from parallab.core.strategies.base import ActivationLayout, CommItem, Draft, MeshDim, StrategyDescriptor, StrategyOptions
from parallab.core.strategies.fsdp import fsdp_comm, fsdp_items
from parallab.core.strategies.tp import tp_comm, tp_items, tp_rules

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class HybridOptions(StrategyOptions):
    tp: int = Field(2, ge=1, le=1024, description="Tensor-parallel degree (inner mesh dim); FSDP runs over world_size / tp.")
    reshard_after_forward: bool = Field(True, description="FSDP over dp: True ≈ ZeRO-3, False ≈ ZeRO-2.")
    sequence_parallel: bool = Field(False, description="TP with sequence parallel norms and residual.")


class Hybrid(StrategyDescriptor[HybridOptions]):
    name = "hybrid"
    title = "TP × FSDP on a 2-D mesh"
    options_model = HybridOptions
    dense_only = True

    def mesh(self, world_size: int, options: HybridOptions) -> tuple[MeshDim, ...]:
        """dp outer, tp inner: TP wants the closer ranks."""
        return (MeshDim("dp", max(world_size // options.tp, 1)), MeshDim("tp", options.tp))

    def rules(self, draft: Draft[HybridOptions]) -> list[SpecProblem]:
        world, tp = draft.world_size, draft.options.tp
        loc = ("strategy", "options", "tp")
        out = []
        if world % tp:
            out.append(SpecProblem(loc, f"mesh tp={tp} × dp does not make world size {world}"))
        elif tp < 2 or world // tp < 2:
            out.append(SpecProblem(loc, f"hybrid needs tp ≥ 2 and dp ≥ 2; tp={tp} on {world} ranks gives dp={world // tp}"))
        return out + tp_rules(draft.model, tp, sequence_parallel=draft.options.sequence_parallel)

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        tp = self.opts(job).tp
        dp = job.world_size // tp
        return [sum(numel(chunk(tp_local(t, tp), 0, dp)) for t in model_tensors(job.model))]

    def comm_groups(self, job: ResolvedJob) -> list[tuple[dict[str, int], int]]:
        """TP's ops over the tp ranks of a dp group, FSDP's over the dp ranks holding one TP shard."""
        opts = self.opts(job)
        tp, dp = opts.tp, job.world_size // opts.tp
        precision = job.workload.precision
        tensor = tp_comm(job.model, job.tokens_per_replica, activation_dtype_bytes(precision), sequence_parallel=opts.sequence_parallel)
        fsdp = fsdp_comm(
            model_tensors(job.model),
            dp,
            reshard_after_forward=opts.reshard_after_forward,
            param_bytes=gathered_param_bytes(precision),
            local=lambda t: tp_local(t, tp),
        )
        return [(tensor, tp), (fsdp, dp)]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        out: dict[str, int] = {}
        for by_op, _group in self.comm_groups(job):
            for op, nbytes in by_op.items():
                out[op] = out.get(op, 0) + nbytes
        return dict(sorted(out.items()))

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        """TP's calls on the tp group (adjacent ranks), FSDP's on the dp group (ranks tp apart)."""
        opts = self.opts(job)
        tp, dp, precision = opts.tp, job.world_size // opts.tp, job.workload.precision
        sp = opts.sequence_parallel
        tp_bytes = tp_comm(job.model, job.tokens_per_replica, activation_dtype_bytes(precision), sequence_parallel=sp)
        fsdp_bytes = fsdp_comm(
            model_tensors(job.model),
            dp,
            reshard_after_forward=opts.reshard_after_forward,
            param_bytes=gathered_param_bytes(precision),
            local=lambda t: tp_local(t, tp),
        )
        return tp_items(tp_bytes, job.model, micro_steps=job.accum_steps, sequence_parallel=sp, n=tp) + fsdp_items(
            fsdp_bytes, groups=job.model.num_layers + 1, reshard_after_forward=opts.reshard_after_forward, n=dp, stride=tp
        )

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        opts = self.opts(job)
        tokens = job.micro_batch_size * job.model.seq_len
        return ActivationLayout(
            tokens=tokens,
            layers=job.model.num_layers,
            head_tokens=tokens,
            tp=opts.tp,
            sequence_parallel=opts.sequence_parallel,
            weight_copies=False,  # FSDP over dp gathers 16-bit weights (its param_dtype)
        )


DESCRIPTOR = Hybrid()
