"""`pp`: pipeline parallelism over contiguous layer stages with `torch.distributed.pipelining`.

Stage s keeps the blocks the descriptor's stage layout gives it (`stage_layers`: [s·L/p,
(s+1)·L/p)); the first stage also keeps the root modules the model family puts first (the
embedding), the last those it puts last (final norm, LM head); the others drop them, so blocks
keep their names: "layers.5" stays "layers.5". Each rank builds
its own `PipelineStage` by hand (no tracing) and a `ScheduleGPipe` or `Schedule1F1B` over
`microbatches` micro-batches of every accumulation micro-step. The schedule runs forward and
backward itself, so this module replaces the loop's `forward_backward`, and runs it under
`pipeline_comm()` so the profiler knows its P2P for the pipeline's. While a profiler runs, each
stage action — a micro-batch's forward (`PipelineStage.forward_one_chunk`), its backward
(`backward_one_chunk`), the last stage's loss — is a profiler range (`attribution.action_name`):
the bubble is the stage's idle time between its first and last action. The loss lives
on the last stage: each micro-batch's loss is scaled by its share of the step, and `loss_weight`
gives the last stage the whole global loss.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from parallab.core.families import family_of
from parallab.core.strategies import get_descriptor
from parallab.core.strategies.pp import PPOptions
from workers.harness.amp import Amp
from workers.harness.attribution import action_name, pipeline_comm
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, MicroBatch, Strategy

SCHEDULES: dict[str, type[PipelineScheduleSingle]] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
STAGE_ACTIONS = {"forward_one_chunk": "forward", "backward_one_chunk": "backward"}
"""The `PipelineStage` methods every schedule calls once per micro-batch (first argument: its
index), and the action each is. Both schedules call them on the stage (torch 2.13,
torch/distributed/pipelining/schedules.py: `self._stage.forward_one_chunk(i, ...)`)."""
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
    """The stage's module, its schedule, and the loss scale the schedule's loss function reads."""

    schedule: PipelineScheduleSingle
    loss_scale: LossScale
    stage: int
    stages: int

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1


def _stage(ctx: RunContext) -> tuple[int, int]:
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


def schedule(model: Transformer, ctx: RunContext, *, stage: int, stages: int, kind: str, microbatches: int) -> PipelineApplied:
    """The stage's `PipelineStage` over the "pp" mesh dim and its schedule, on a model already
    split, placed (and sharded by the dimensions applied after the split)."""
    # Each micro-batch's loss carries its share 1/(microbatches × accumulation) itself, and the
    # schedule's own scale_grads stays off: it rescales *all* held grads at every step() and so
    # would shrink the earlier accumulation micro-steps' gradients again.
    # fp16: the loop's loss scale must reach the backward the schedule runs, so loss_fn reads it.
    share = 1.0 / (ctx.accum_steps * microbatches)
    scale = LossScale()

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) * (share * scale.value)

    loss_fn = _profiled_action("loss", loss, indexed=False)
    pipe_stage = mark_actions(PipelineStage(model, stage, stages, ctx.device, group=ctx.mesh_dim("pp").get_group()))
    steps = SCHEDULES[kind](pipe_stage, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=False)
    return PipelineApplied(model=model, schedule=steps, loss_scale=scale, stage=stage, stages=stages)


def forward_backward(applied: PipelineApplied, batch: MicroBatch, ctx: RunContext, amp: Amp) -> torch.Tensor:
    """One accumulation micro-step through the schedule; the stage's summed loss (zero off the last stage)."""
    applied.loss_scale.value = amp.scale
    losses: list[torch.Tensor] = []
    target = batch.labels if applied.last else None
    with amp.autocast(), pipeline_comm():
        if applied.stage == 0:
            applied.schedule.step(batch.inputs, target=target, losses=losses, return_outputs=False)
        else:
            applied.schedule.step(target=target, losses=losses, return_outputs=False)
    if not applied.last:
        return torch.zeros((), device=ctx.device)
    return torch.stack([loss.detach() for loss in losses]).sum() / amp.scale


class Pipeline(Strategy[PPOptions, PipelineApplied]):
    name = "pp"

    def apply(self, model: Transformer, ctx: RunContext, options: PPOptions) -> PipelineApplied:
        stage, stages = _stage(ctx)
        layout = get_descriptor(self.name).stage_layers(model.cfg, stages, options)
        assert layout is not None, "the pp descriptor lays out stages"
        model = split(model, stage=stage, stages=stages, layers=layout[stage]).to(ctx.device)
        return schedule(model, ctx, stage=stage, stages=stages, kind=options.schedule, microbatches=options.n_microbatches)

    def forward_backward(self, applied: PipelineApplied, batch: MicroBatch, ctx: RunContext, options: PPOptions, amp: Amp) -> torch.Tensor:
        return forward_backward(applied, batch, ctx, amp)

    def loss_weight(self, ctx: RunContext, options: PPOptions) -> float:
        stage, stages = _stage(ctx)
        return 1.0 if stage == stages - 1 else 0.0

    def progress_rank(self, ctx: RunContext, options: PPOptions) -> int:
        """The last stage writes the live progress: it is the one with a loss to show."""
        return int(ctx.mesh_dim("pp").mesh.flatten()[-1].item())


STRATEGY = Pipeline()
