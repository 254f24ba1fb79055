"""The planner's memory model drawn over a step: what each phase should hold, by category.

The measured timeline (`ranks[i].memory_timeline`) names its phases after the modules the
harness marks: `forward layers.0`, `backward layers.3`, `forward output`, `optimizer`, ...
This module predicts, for each of those phases, the bytes live at the phase's highest point, from
the textbook and the run's config alone — never fitted to a measurement:

- **Model state is constant**: the rank's parameters and optimizer state (ZeRO's Ψ-terms, in the
  recipe that runs), the optimizer's moments absent until the optimizer first steps (step 0).
- **Gradients** are freed by `zero_grad(set_to_none=True)` and come back module by module through
  the backward (last block first), all of them held at the optimizer.
- **Activations** accumulate one block's kept set per block through the forward (Korthikanti et
  al.'s count, `parallab.core.activations`), the LM head's on top; the backward frees them block
  by block. Each block's backward begins with its own kept set and every earlier block's alive.
  A pipeline stage holds its other micro-batches in flight (their every block's kept set) beside
  the one it is computing, in every phase of the passes; a recomputation phase holds a block's
  full set again.
- **FSDP** (sharded data parallelism) holds the root group's parameters gathered through the
  whole forward and backward, and one block's unsharded parameters in its forward; in its backward
  two blocks' (its own and the prefetched next one) and the block's unsharded gradients before
  the reduce-scatter — as communication buffers.
- **DDP** (replicated data parallelism) holds its gradient buckets, a flat copy of every gradient,
  for the whole step — as communication buffers.
- The logits' gradient is a temporary of the head's backward; nothing else is predicted there.

`curve` is pure; `inputs_for` reads a resolved job once (`parallab.core.prediction` stores the
inputs in the prediction block as `memory_curve`, one entry per kind of rank, so a run page
draws the curve from the document alone).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from parallab.core.families import model_tensors
from parallab.core.jobs import ResolvedJob

CATEGORIES = ("params", "grads", "optimizer", "activations", "comm_buffers", "temporaries", "other")
"""The measured timeline's categories (`parallab.core.result.MEMORY_TIMELINE_CATEGORIES`), in order."""
_LAYER = re.compile(r"\.(\d+)$")


class CurveInputs(BaseModel):
    """What one kind of rank holds, in bytes, as the memory model sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field("", description="Which rank this is, when ranks differ (a pipeline stage).")
    params: int = Field(ge=0)
    grads: int = Field(ge=0)
    optimizer: int = Field(ge=0)
    layers: int = Field(ge=0, description="Blocks on the rank.")
    layer_grad_bytes: int = Field(0, ge=0, description="One block's gradients on the rank.")
    root_grads: dict[str, int] = Field(
        default_factory=dict, description="The gradients of the modules outside the blocks, by module path (embeddings, norm, head)."
    )
    activation_per_layer: int = Field(ge=0, description="One block's kept activations for one micro-batch.")
    recomputed_layer: int = Field(0, ge=0, description="One block's full activation set (what a recomputation rebuilds).")
    microbatches: int = Field(1, ge=1, description="Micro-batches in flight on the rank.")
    head: int = Field(0, ge=0, description="The LM head's kept activations (0 off the last stage).")
    logits_gradient: int = Field(0, ge=0)
    gathered_root: int = Field(0, ge=0, description="FSDP: the root group's unsharded parameters.")
    gathered_layer: int = Field(0, ge=0, description="FSDP: one block's unsharded parameters.")
    unsharded_layer_grads: int = Field(0, ge=0, description="FSDP: one block's gradients before the reduce-scatter.")
    buckets: int = Field(0, ge=0, description="DDP: the gradient buckets (a flat copy of every gradient).")


class PredictedPhase(BaseModel):
    """A phase's predicted highest point: the categories sum to `allocated`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    phase: str
    allocated: int
    categories: dict[str, int]


def classify(phase: str) -> tuple[str, str, int | None]:
    """(kind, module, block index) of a measured phase name: kind is the first word ('forward',
    'backward', 'recompute', 'optimizer', 'zero_grad', 'after', 'step'); the index is the module
    path's trailing number (`layers.3` -> 3), None for a root module or a non-module phase."""
    kind, _, module = phase.partition(" ")
    found = _LAYER.search(module)
    return kind, module, int(found.group(1)) if found else None


def curve(inputs: CurveInputs, phases: Sequence[str], *, step: int = 1) -> list[PredictedPhase]:
    """The predicted highest point of each phase in `phases` (the measured order) on a rank
    described by `inputs`, in optimizer step `step` (0: before the moments exist)."""
    kinds = [classify(p) for p in phases]
    blocks = sorted({i for k, _, i in kinds if i is not None and k in ("forward", "backward", "recompute")})
    local = {b: j for j, b in enumerate(blocks)}
    n = len(blocks) or inputs.layers
    fwd = [j for j, (k, _, i) in enumerate(kinds) if k == "forward" and i is not None]
    last_block = fwd[-1] if fwd else len(phases)
    head_side = {m for j, (k, m, i) in enumerate(kinds) if k == "forward" and i is None and j > last_block}
    head_phase = max((j for j, (k, m, _) in enumerate(kinds) if k == "forward" and m in head_side), default=None)
    first_forward = next((j for j, (k, _, _) in enumerate(kinds) if k == "forward"), len(phases))
    first_backward = next((j for j, (k, _, _) in enumerate(kinds) if k == "backward"), len(phases))
    optimizer_at = next((j for j, (k, _, _) in enumerate(kinds) if k == "optimizer"), len(phases))
    zeroed_at = next((j for j, p in enumerate(phases) if p == "after zero_grad"), None)
    earlier = (inputs.microbatches - 1) * n * inputs.activation_per_layer  # other micro-batches in flight
    every_block = earlier + n * inputs.activation_per_layer
    out: list[PredictedPhase] = []
    grads_back = 0  # gradients the backward has made so far
    for j, (kind, module, index) in enumerate(kinds):
        c = dict.fromkeys(CATEGORIES, 0)
        c["params"] = inputs.params
        c["optimizer"] = inputs.optimizer if step > 0 or j >= optimizer_at else 0
        c["comm_buffers"] = inputs.buckets
        if kind == "backward":
            grads_back += inputs.layer_grad_bytes if index is not None else _root_grads(inputs.root_grads, module)
            grads_back = min(grads_back, inputs.grads)
        if first_backward <= j < optimizer_at:
            c["grads"] = grads_back
        elif j >= optimizer_at or step > 0 and (zeroed_at is None or j < zeroed_at):
            c["grads"] = inputs.grads
        if index is not None and kind in ("forward", "backward", "recompute"):
            c["activations"] = earlier + (local[index] + 1) * inputs.activation_per_layer
            if kind == "recompute":
                c["activations"] += inputs.recomputed_layer - inputs.activation_per_layer
        elif kind == "forward" and j > last_block:
            c["activations"] = every_block + (inputs.head if j == head_phase else 0)
        elif kind == "backward" and module in head_side:
            c["activations"] = every_block + inputs.head
        elif kind in ("forward", "backward"):  # the embeddings: only the other micro-batches' blocks
            c["activations"] = earlier
        if j == first_backward and module in head_side:
            c["temporaries"] = inputs.logits_gradient
        if first_forward <= j < optimizer_at:
            c["comm_buffers"] += inputs.gathered_root
            if index is not None:
                c["comm_buffers"] += (
                    inputs.gathered_layer if kind != "backward" else 2 * inputs.gathered_layer + inputs.unsharded_layer_grads
                )
        out.append(PredictedPhase(phase=phases[j], allocated=sum(c.values()), categories=c))
    return out


def _root_grads(root: dict[str, int], module: str) -> int:
    """The gradients a root module's backward makes: its own tensors' (and those of modules under it)."""
    return sum(v for m, v in root.items() if m == module or m.startswith(module + "."))


def gaps(measured: Sequence[dict[str, Any]], predicted: Sequence[PredictedPhase]) -> list[dict[str, Any]]:
    """Per phase: the measured highest point (of `measured`, points with `phase` and `allocated`)
    minus the predicted one, in bytes and as a share of the prediction, in the phases' order."""
    highest: dict[str, int] = {}
    for m in measured:
        highest[m["phase"]] = max(highest.get(m["phase"], m["allocated"]), m["allocated"])
    out = []
    for p in predicted:
        if p.phase in highest:
            gap = highest[p.phase] - p.allocated
            out.append(
                {
                    "phase": p.phase,
                    "measured": highest[p.phase],
                    "predicted": p.allocated,
                    "gap": gap,
                    "share": gap / p.allocated if p.allocated else None,
                }
            )
    return out


def largest_gap(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The phase where measurement and model part most (largest |gap|; the first of equals)."""
    return max(rows, key=lambda r: abs(r["gap"]), default=None)


def gap_sentence(row: dict[str, Any] | None) -> str:
    """'largest gap: +1.25 MiB (12.0 %) in backward layers.2' (the measurement above the model: +)."""
    if row is None:
        return "no phase to compare"
    share = f" ({row['share'] * 100:+.1f} %)" if row["share"] is not None else ""
    return f"largest gap: {row['gap'] / 2**20:+.2f} MiB{share} in {row['phase']}"


def _elements(job: ResolvedJob, stage_layers: range | None) -> tuple[int, dict[str, int]]:
    """(one block's, the root modules' by module path) parameter elements of one rank, full size
    (before sharding over data parallel ranks, after tensor parallelism's split)."""
    layout = job.descriptor.layout(job.world_size, job.options)
    tp = layout.tp if layout is not None else 1
    block: dict[int, int] = {}
    root: dict[str, int] = {}
    for t in model_tensors(job.model):
        n = 1
        for d in t.shape:
            n *= d
        n //= tp if t.tp_dim is not None else 1
        if t.layer is not None:
            if stage_layers is None or t.layer in stage_layers:
                block[t.layer] = block.get(t.layer, 0) + n
        else:
            module = t.name.rsplit(".", 1)[0]
            root[module] = root.get(module, 0) + n
    return max(block.values(), default=0), root


def inputs_for(job: ResolvedJob, state: Sequence[dict[str, int]], activations: Sequence[dict[str, Any]]) -> list[CurveInputs]:
    """The inputs of each kind of rank: `state` ({params, grads, optimizer} bytes) and
    `activations` (`parallab.core.prediction.layout_activations`) one entry per kind, in the
    descriptor's order (a pipeline's stages first to last)."""
    from parallab.core.costs import state_bytes_per_param

    layout = job.descriptor.layout(job.world_size, job.options)
    _, g_bytes, _ = state_bytes_per_param(job.workload.precision)
    shard = layout.fsdp_shards if layout is not None else 1
    p_bytes = 2 if job.workload.precision in ("bf16", "fp16") else 4  # FSDP gathers in its param_dtype: the precision's
    replicated = layout is not None and layout.dp_replicate > 1
    stages = len(activations)
    out = []
    for k, (st, act) in enumerate(zip(state if len(state) == stages else [state[0]] * stages, activations, strict=True)):
        ranges = layout.stage_layer_ranges(job.model.num_layers) if layout is not None and layout.pp > 1 else None
        block, root = _elements(job, ranges[k] if ranges is not None and len(ranges) == stages else None)
        if stages > 1:  # a pipeline: the embeddings live on the first stage, the norm and head on the last
            embeds = {m: v for m, v in root.items() if "embed" in m}
            root = embeds if k == 0 else {m: v for m, v in root.items() if m not in embeds} if k == stages - 1 else {}
        out.append(
            CurveInputs(
                name=str(act.get("rank") or ""),
                params=st["params"],
                grads=st["grads"],
                optimizer=st["optimizer"],
                layers=int(act["layers"]),
                layer_grad_bytes=g_bytes * block // shard,
                root_grads={m: g_bytes * v // shard for m, v in root.items()},
                activation_per_layer=int(act["per_layer_bytes"]),
                recomputed_layer=int(act["recomputed_layer_bytes"]),
                microbatches=max(int(act["microbatches_in_flight"]), 1),
                head=int(act["head"]) if act["head"] else 0,
                logits_gradient=int(act["logits_gradient"]),
                gathered_root=p_bytes * sum(root.values()) if shard > 1 else 0,
                gathered_layer=p_bytes * block if shard > 1 else 0,
                unsharded_layer_grads=g_bytes * block if shard > 1 else 0,
                buckets=st["grads"] if replicated else 0,
            )
        )
    return out


def for_rank(curves: Sequence[dict[str, Any]], rank: int, world_size: int) -> CurveInputs | None:
    """The stored inputs (`prediction.memory_curve`) of global rank `rank`: one kind for every rank,
    or one per pipeline stage with the pipeline the outermost dimension of the rank mesh; None
    where there are none or they are not valid inputs."""
    if not curves or not isinstance(curves, list):
        return None
    per_stage = max(world_size // len(curves), 1)
    try:
        return CurveInputs.model_validate(curves[min(max(rank, 0) // per_stage, len(curves) - 1)])
    except ValueError:  # a document's block that is not the model's inputs (an upload's own, say): no curve
        return None
