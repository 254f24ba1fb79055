"""Every training strategy but the one-process reference on the ranks — the one-dimension presets
(`ddp`, `fsdp`, `tp`, `pp`, `ring`, `moe`), the composed ones and any `layout` — through one
composition of the dimensions' modules in one fixed order (torchtitan's).

1. the model is built (seeded, on CPU, identical everywhere; activation checkpointing and fp8 are
   applied as it is built, `workers.harness.main.new_model`, before any wrapper);
2. pp: keep this rank's stages' blocks, one model chunk per stage (`pipeline.chunks`: v under
   the interleaved schedules); steps 3–7 then apply to each chunk;
3. tp (+SP): the Megatron plan on the "tp" dim (`tensor_parallel.parallelize`);
4. ep: keep this rank's slice of every MoE layer's experts, route by all-to-all over "ep"
   (`expert_parallel.shard_experts`);
5. cp: every attention runs over the ring of "cp" (`ring_attention.parallelize`);
6. activation checkpointing: done at build (1.);
7. dp_shard: FSDP2 per block and the root over "dp_shard", or HSDP over the 2-D
   ("dp_replicate", "dp_shard") mesh when both are on (`fsdp.shard`) — an expert slice is sharded
   like any other tensor;
8. dp_replicate alone: DDP; beside tp or pp (no FSDP to reduce it): one flat all-reduce of the
   local gradient shards over "dp_replicate" after backward.

After backward, cp and ep average what they replicate over their own dim (`sync_grads`): cp every
gradient, ep the non-expert ones (its experts' gradients are divided by ep) — beside FSDP, the
shards its reduce-scatter left, so each dimension's traffic is on its own sub-mesh as
`parallab.core.dims` predicts it. The core composes cp and ep with dp_shard only so far.

A degree of 1 is a no-op: its dim is not in the mesh and its step is skipped. The pipeline
schedule is built last, over the stage module as the later steps left it (FSDP2's hooks run inside
the schedule's backward). Data is split over dp_replicate × dp_shard × ep (in mesh order); every
tp and pp rank of a data-parallel group sees the same rows, and every cp rank the same rows but
its own part of the sequence (`ring_attention.shard_sequence`, zig-zag when asked).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from parallab.core.dims import DIMENSIONS
from parallab.core.layout import MESH_ORDER, Layout
from parallab.core.strategies import REFERENCE_STRATEGY, TRAINING_STRATEGIES, get_descriptor
from parallab.core.strategies.layout import PresetOptions
from workers.harness.amp import Amp
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies import ddp, expert_parallel, fsdp, pipeline, ring_attention, tensor_parallel
from workers.strategies.base import Applied, MicroBatch, Strategy, flat_all_reduce_, local_grad, place

DATA_DIMS: tuple[str, ...] = tuple(name for name in MESH_ORDER if DIMENSIONS[name].splits_batch)
"""The dims whose ranks take different rows of the batch (dp_replicate, dp_shard, ep), in mesh
order: the digits of a rank's data-parallel index."""


@dataclass(frozen=True)
class ComposedApplied(Applied):
    """The module the optimizer trains, the layout it was built for, and the pipeline when there is one."""

    layout: Layout
    pipe: pipeline.PipelineApplied | None = None


def _coordinate(ctx: RunContext, name: str) -> tuple[int, int]:
    """(this rank's index, the size) on mesh dim `name`."""
    dim = ctx.mesh_dim(name)
    return dim.get_local_rank(), dim.size()


class Composed(Strategy[PresetOptions, ComposedApplied]):
    """The composition of the layout strategy `name`'s descriptor resolves to (one instance a name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def layout(self, ctx: RunContext, options: PresetOptions) -> Layout:
        layout = get_descriptor(self.name).layout(ctx.world_size, options)
        assert layout is not None, "a layout strategy trains"
        return layout

    def apply(self, model: Transformer, ctx: RunContext, options: PresetOptions) -> ComposedApplied:
        layout = self.layout(ctx, options)
        parts = {0: model}
        if layout.pp > 1:
            parts = pipeline.chunks(model, rank=_coordinate(ctx, "pp")[0], layout=layout)
        parts = {k: self._apply_chunk(chunk, ctx, layout) for k, chunk in parts.items()}
        if layout.pp > 1:
            pipe = pipeline.schedule(parts, ctx, layout)
            return ComposedApplied(model=pipe.model, layout=layout, pipe=pipe)
        trained: nn.Module = parts[0]
        if layout.on == ("dp_replicate",):
            trained = ddp.wrap(trained, ctx, group=ctx.mesh_dim("dp_replicate").get_group(), bucket_cap_mb=layout.bucket_cap_mb)
        return ComposedApplied(model=trained, layout=layout)

    @staticmethod
    def _apply_chunk(model: Transformer, ctx: RunContext, layout: Layout) -> Transformer:
        """Steps 3–7 on one model (a pipeline chunk, or the whole model): tp, ep, cp, FSDP/HSDP."""
        model = place(model, ctx.device)
        if layout.tp > 1:
            tensor_parallel.parallelize(model, ctx.mesh_dim("tp"), sequence_parallel=layout.sequence_parallel)
        if layout.ep > 1:
            expert_parallel.shard_experts(model, ctx.mesh_dim("ep").get_group())
        if layout.cp > 1:
            ring_attention.parallelize(model, ctx.mesh_dim("cp"), ctx.device, zigzag=layout.zigzag)
        if layout.dp_shard > 1:
            assert ctx.mesh is not None, "a sharded layout has a mesh"
            mesh = ctx.mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else ctx.mesh_dim("dp_shard")
            fsdp.shard(model, mesh, reshard_after_forward=layout.reshard_after_forward, mp_policy=fsdp.mixed_precision(ctx.precision))
        return model

    def data_rank(self, ctx: RunContext, options: PresetOptions) -> tuple[int, int]:
        """The data-parallel rank indexed over dp_replicate, dp_shard and ep in mesh order (every tp
        and pp rank of it alike; each ep rank is one of the reference's MoE routing groups)."""
        layout, index = self.layout(ctx, options), 0
        for name in DATA_DIMS:
            if layout.degrees[name] > 1:
                rank, size = _coordinate(ctx, name)
                index = index * size + rank
        return layout.dp, index

    def local_batch(
        self, inputs: torch.Tensor, labels: torch.Tensor, ctx: RunContext, options: PresetOptions, micro_step: int
    ) -> MicroBatch:
        """The rows of this rank's `data_rank`; under cp, this rank's part of the sequence of those rows."""
        batch, layout = super().local_batch(inputs, labels, ctx, options, micro_step), self.layout(ctx, options)
        if layout.cp > 1:
            batch = ring_attention.shard_sequence(batch, ctx.mesh_dim("cp"), zigzag=layout.zigzag)
        return batch

    def accumulate(self, applied: ComposedApplied, last: bool) -> AbstractContextManager[object]:
        if isinstance(applied.model, DistributedDataParallel) and not last:
            return applied.model.no_sync()
        return contextlib.nullcontext()

    def forward_backward(
        self, applied: ComposedApplied, batch: MicroBatch, ctx: RunContext, options: PresetOptions, amp: Amp
    ) -> torch.Tensor:
        if applied.pipe is not None:
            return pipeline.forward_backward(applied.pipe, batch, ctx, amp)
        return super().forward_backward(applied, batch, ctx, options, amp)

    def sync_grads(self, applied: ComposedApplied, ctx: RunContext, options: PresetOptions) -> None:
        """Lay every gradient out like its parameter (`tensor_parallel.lay_out_grads`: the
        vocab-parallel embedding's keeps its rows, SP's norm gradients are all-reduced over tp),
        average what ep and cp replicate over their dims, then, for replicas beside tp or pp,
        average the local gradient shards over "dp_replicate" in one flat all-reduce (FSDP/HSDP and
        DDP average their own)."""
        layout = applied.layout
        tensor_parallel.lay_out_grads(applied.model)
        with torch.no_grad():
            if layout.ep > 1:
                expert_parallel.average_grads(applied.model, ctx.mesh_dim("ep"))
            if layout.cp > 1:
                ring_attention.average_grads(applied.model, ctx.mesh_dim("cp"))
            if layout.dp_replicate == 1 or layout.dp_shard > 1 or isinstance(applied.model, DistributedDataParallel):
                return
            grads = [local_grad(p.grad) for p in applied.model.parameters() if p.grad is not None]
            flat_all_reduce_(grads, ctx.mesh_dim("dp_replicate").get_group(), scale=1.0 / layout.dp_replicate)

    def loss_weight(self, ctx: RunContext, options: PresetOptions) -> float:
        """Every rank holding a loss holds its replica's mean: all of them, or the last stages under a pipeline."""
        layout = self.layout(ctx, options)
        if layout.pp == 1:
            return 1.0 / ctx.world_size
        return layout.pp / ctx.world_size if pipeline.last_stage_holder(ctx, layout) else 0.0

    def progress_rank(self, ctx: RunContext, options: PresetOptions) -> int:
        """Under a pipeline, the rank holding the last stage in rank 0's replica (pp is the outermost
        mesh dim); else rank 0."""
        layout = self.layout(ctx, options)
        if layout.pp == 1 or ctx.mesh is None:
            return 0
        corner = (pipeline.last_stage_coordinate(layout),) + (0,) * (ctx.mesh.ndim - 1)
        return int(ctx.mesh.mesh[corner].item())


STRATEGIES: dict[str, Composed] = {name: Composed(name) for name in TRAINING_STRATEGIES if name != REFERENCE_STRATEGY}
"""Every name the registry maps here: each training strategy that is a layout."""
