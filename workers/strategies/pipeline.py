"""The pp dimension (the `pp` preset, and every layout with pp; `compose` applies it): pipeline
parallelism over contiguous layer stages with `torch.distributed.pipelining`.

The model is cut into p·v stages (`Layout.stage_layer_ranges`; v virtual stages per rank under
the interleaved and ZB-V schedules, 1 otherwise) and each rank keeps the stages the schedule
places on it (`parallab.core.layout.rank_stages`: loop placement r, r+p, … or ZB-V's V), one
model chunk per stage (`chunks`: a copy of the built model per chunk past the first, `split` to
its blocks). The first stage also keeps the root modules the model family puts first (the
embedding), the last those it puts last (final norm, LM head); the others drop them, so blocks
keep their names: "layers.5" stays "layers.5", and a rank's chunks together (`held`) have the
plain model's parameter names for the optimizer and the gradient check. Each chunk is its own
`PipelineStage` (built by hand, no tracing) under one schedule over `microbatches` micro-batches
of every accumulation micro-step: `ScheduleGPipe` or `Schedule1F1B` over one stage,
`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble` or `ScheduleZBVZeroBubble` over the
rank's chunks. The schedule runs forward and backward itself, so `forward_backward` here replaces
the loop's, and runs it under `pipeline_comm()` so the profiler knows its P2P for the
pipeline's. While a profiler runs, each stage action — a micro-batch's forward on a chunk
(`PipelineStage.forward_one_chunk`), its backward (`backward_one_chunk`, and under the zero-bubble
schedules the weight half, `backward_weight_one_chunk`), the last stage's loss — is a profiler
range (`attribution.action_name`): a rank's bubble is its idle time between the pipeline's first
and last action, whichever of its chunks ran. The loss lives on the rank holding the last stage
(p−1, or 0 under ZB-V): each micro-batch's loss is scaled by its share of the step, and
`compose.loss_weight` gives that rank its replica's whole loss.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle, _PipelineSchedule
from torch.distributed.pipelining.stage import _PipelineStageBase

from parallab.core.families import family_of
from parallab.core.layout import Layout, last_stage_rank, rank_stages
from workers.harness.amp import Amp
from workers.harness.attribution import action_name, pipeline_comm
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, MicroBatch

SCHEDULES: dict[str, type[_PipelineSchedule]] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "interleaved_zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
}
"""torch's class for each schedule the core knows (`parallab.core.layout.SCHEDULES`; a test holds the keys equal)."""
STAGE_ACTIONS = {"forward_one_chunk": "forward", "backward_one_chunk": "backward", "backward_weight_one_chunk": "weight"}
"""The `PipelineStage` methods the schedules call once per micro-batch and chunk (first argument:
the micro-batch's index), and the action each is; the zero-bubble schedules split a backward into
its input half (`backward_one_chunk(full_backward=False)`) and its weight half, both work a bubble
does not count (torch 2.13, torch/distributed/pipelining/schedules.py: `stage.forward_one_chunk(mb_index, ...)`)."""
Fn = TypeVar("Fn", bound=Callable[..., Any])


def _profiled_action(kind: str, fn: Fn, *, indexed: bool = True) -> Fn:
    """`fn` inside a profiler range named for the action while a profiler runs; as is otherwise."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.autograd._profiler_enabled():
            return fn(*args, **kwargs)
        with torch.profiler.record_function(action_name(kind, int(args[0]) if indexed else None)):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def mark_actions(stage: PipelineStage) -> PipelineStage:
    """Make the stage's forward and backward of each micro-batch show in a profile as its actions."""
    for method, kind in STAGE_ACTIONS.items():
        setattr(stage, method, _profiled_action(kind, getattr(stage, method)))
    return stage


@dataclass
class LossScale:
    """The fp16 loss scale the schedule's loss function applies (set before each schedule step)."""

    value: float = 1.0


@dataclass(frozen=True)
class PipelineApplied(Applied):
    """The rank's module(s), its schedule, and the loss scale the schedule's loss function reads."""

    schedule: _PipelineSchedule
    loss_scale: LossScale
    first: bool
    """This rank holds the first stage: the schedule's step takes the inputs here."""
    last: bool
    """This rank holds the last stage: the targets go here, and the losses come back."""


class Chunks(nn.Module):
    """A rank's model chunks as one module for the optimizer, the loop and the checks: their
    parameters under the plain model's names (the chunks hold disjoint blocks and roots)."""

    def __init__(self, chunks: list[nn.Module]) -> None:
        super().__init__()
        self.chunks = nn.ModuleList(chunks)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        for chunk in self.chunks:
            yield from chunk.named_parameters(prefix, recurse, remove_duplicate)


def held(parts: Mapping[int, nn.Module]) -> nn.Module:
    """The module a rank trains: its one stage, or its chunks together (`Chunks`)."""
    return next(iter(parts.values())) if len(parts) == 1 else Chunks(list(parts.values()))


def _pp_rank(ctx: RunContext) -> tuple[int, int]:
    mesh = ctx.mesh_dim("pp")
    return mesh.get_local_rank(), mesh.size()


def split(model: Transformer, *, stage: int, stages: int, layers: range) -> Transformer:
    """Keep this stage's blocks (`layers`) and the root modules the model puts on it (the first
    stage's: the embedding; the last's: final norm and head; `Transformer.pipeline_split`, its
    family's or a lab's spec's); the others become None where they are held (a dotted path,
    "model.norm", names the library model's attribute)."""
    ends = model.pipeline_split()
    keep = {str(i) for i in layers}
    blocks = model.get_submodule(ends.blocks)
    assert isinstance(blocks, nn.ModuleDict), "a model keeps its blocks in a ModuleDict"
    for name in list(blocks.keys()):
        if name not in keep:
            del blocks[name]
    dropped = (ends.first_stage if stage != 0 else ()) + (ends.last_stage if stage != stages - 1 else ())
    for path in dropped:  # a module path: "norm" on the root, or "model.norm" inside the library's model
        parent, _, name = path.rpartition(".")
        holder = model.get_submodule(parent)
        assert isinstance(getattr(holder, name, None), nn.Module), f"{family_of(model.cfg).name} declares no module {path!r} to drop"
        setattr(holder, name, None)
    return model


def chunks(model: Transformer, *, rank: int, layout: Layout) -> dict[int, Transformer]:
    """This pp rank's stages → their modules, each `split` from the built model (a copy per stage
    but the last one held: every rank built the same seeded model, so the copies are identical)."""
    mine = rank_stages(rank, layout.pp, layout.virtual_stages, layout.schedule)
    ranges = layout.stage_layer_ranges(model.cfg.num_layers)
    out = {}
    for i, k in enumerate(mine):
        source = model if i == len(mine) - 1 else copy.deepcopy(model)
        out[k] = split(source, stage=k, stages=layout.stages, layers=ranges[k])
    return out


def schedule(parts: Mapping[int, nn.Module], ctx: RunContext, layout: Layout) -> PipelineApplied:
    """The `PipelineStage` of every chunk over the "pp" mesh dim and the layout's schedule over
    them, on chunks already split, placed (and sharded by the dimensions applied after the split)."""
    # Each micro-batch's loss carries its share 1/(microbatches × accumulation) itself, and the
    # schedule's own scale_grads stays off: it rescales *all* held grads at every step() and so
    # would shrink the earlier accumulation micro-steps' gradients again.
    # fp16: the loop's loss scale must reach the backward the schedule runs, so loss_fn reads it.
    m = layout.microbatches
    share = 1.0 / (ctx.accum_steps * m)
    scale = LossScale()

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) * (share * scale.value)

    loss_fn = _profiled_action("loss", loss, indexed=False)
    group = ctx.mesh_dim("pp").get_group()
    stages: list[_PipelineStageBase] = [
        mark_actions(PipelineStage(module, k, layout.stages, ctx.device, group=group)) for k, module in sorted(parts.items())
    ]
    kind = SCHEDULES[layout.schedule]
    if issubclass(kind, PipelineScheduleSingle):
        assert len(stages) == 1, "a single-stage schedule runs one stage per rank"
        steps: _PipelineSchedule = kind(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    else:
        assert issubclass(kind, PipelineScheduleMulti), f"{kind.__name__} is a single- or a multi-stage schedule"
        steps = kind(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    return PipelineApplied(model=held(parts), schedule=steps, loss_scale=scale, first=0 in parts, last=layout.stages - 1 in parts)


def last_stage_holder(ctx: RunContext, layout: Layout) -> bool:
    """Whether this rank holds the last stage (its loss is the replica's)."""
    return _pp_rank(ctx)[0] == last_stage_coordinate(layout)


def last_stage_coordinate(layout: Layout) -> int:
    """The pp index of the rank holding the last stage (the progress rank's coordinate)."""
    return last_stage_rank(layout.pp, layout.virtual_stages, layout.schedule)


def forward_backward(applied: PipelineApplied, batch: MicroBatch, ctx: RunContext, amp: Amp) -> torch.Tensor:
    """One accumulation micro-step through the schedule; the stage's summed loss (zero off the last stage)."""
    applied.loss_scale.value = amp.scale
    losses: list[torch.Tensor] = []
    target = batch.labels if applied.last else None
    with amp.autocast(), pipeline_comm():
        if applied.first:
            applied.schedule.step(batch.inputs, target=target, losses=losses, return_outputs=False)
        else:
            applied.schedule.step(target=target, losses=losses, return_outputs=False)
    if not applied.last:
        return torch.zeros((), device=ctx.device)
    return torch.stack([loss.detach() for loss in losses]).sum() / amp.scale
