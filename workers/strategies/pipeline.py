"""`pp`: pipeline parallelism over contiguous layer stages with `torch.distributed.pipelining`.

Stage s keeps blocks [s·L/p, (s+1)·L/p); the first stage also keeps the embedding, the last the
final norm and the LM head (the others drop them, so blocks keep their names: "layers.5" stays
"layers.5"). Each rank builds its own `PipelineStage` by hand (no tracing) and a
`ScheduleGPipe` or `Schedule1F1B` over `microbatches` micro-batches of every accumulation
micro-step. The schedule runs forward and backward itself, so this module replaces the loop's
`forward_backward`. The loss lives on the last stage: each micro-batch's loss is
scaled by its share of the step, and `loss_weight` gives the last stage the whole global loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def _stage(ctx: Any) -> tuple[int, int]:
    return ctx.mesh.get_local_rank(), ctx.mesh.size()


def apply(model: nn.Module, ctx: Any, options: dict[str, Any]) -> nn.Module:
    stage, stages = _stage(ctx)
    per = len(model.layers) // stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != stages - 1:
        model.norm = None
        model.output = None
    model = model.to(ctx.device)
    # Each micro-batch's loss carries its share 1/(microbatches × accumulation) itself, and the
    # schedule's own scale_grads stays off: it rescales *all* held grads at every step() and so
    # would shrink the earlier accumulation micro-steps' gradients again.
    # fp16: the loop's loss scale must reach the backward the schedule runs, so loss_fn reads it.
    share = 1.0 / (ctx.accum_steps * options["microbatches"])
    scale = model.__dict__["pipeline_loss_scale"] = [1.0]

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) * (share * scale[0])

    pipe_stage = PipelineStage(model, stage, stages, ctx.device, group=ctx.mesh.get_group())
    # Kept off the module's attribute table (a plain dict) so parameters() never sees it twice.
    model.__dict__["pipeline_schedule"] = SCHEDULES[options["schedule"]](pipe_stage, n_microbatches=options["microbatches"], loss_fn=loss_fn, scale_grads=False)
    return model


def forward_backward(model: nn.Module, batch: Any, ctx: Any, options: dict[str, Any], run: Any) -> torch.Tensor:
    stage, stages = _stage(ctx)
    schedule = model.__dict__["pipeline_schedule"]
    model.__dict__["pipeline_loss_scale"][0] = run.scale
    losses: list[torch.Tensor] = []
    last = stage == stages - 1
    target = batch.labels if last else None
    with run.autocast():
        if stage == 0:
            schedule.step(batch.inputs, target=target, losses=losses, return_outputs=False)
        else:
            schedule.step(target=target, losses=losses, return_outputs=False)
    if not last:
        return torch.zeros((), device=ctx.device)
    return torch.stack([loss.detach() for loss in losses]).sum() / run.scale


def loss_weight(ctx: Any, options: dict[str, Any]) -> float:
    stage, stages = _stage(ctx)
    return 1.0 if stage == stages - 1 else 0.0


def progress_rank(ctx: Any, options: dict[str, Any]) -> int:
    """The last stage writes the live progress: it is the one with a loss to show."""
    return ctx.mesh.mesh.flatten()[-1].item()
