"""What theory predicts for a job, from its config alone (`parallab plan`, stored with each run).

The strategies' descriptors hold their own cost formulas (`parallab.core.strategies.*`); this
module puts them together into the result document's `prediction` block. Each formula says which
recipe it is for:

Model state per rank (`model_state_bytes_per_rank`, the max over ranks) = the rank's local
parameter elements × bytes per element of (params, grads, optimizer) of what the harness runs:
4+4+8 in every precision — fp32 AdamW, and bf16/fp16 as torch autocast with fp32 master weights
(`precision_recipe` says which). The ZeRO paper's table (`zero_stages_bytes_per_rank`) keeps the
paper's own mixed-precision recipe, 2+2+12 (`zero_stages_recipe`): a reference, not what runs.

Communication per step (`comm_bytes_per_step`, the max over ranks per op, nccl-tests' buffer
convention as measured): each descriptor's `comm_bytes_per_step`. Gradients travel in fp32
(autocast keeps fp32 grads); activations in the precision's bytes, except ring attention's K/V
(always fp32) and the pipeline's residual stream (fp32 under autocast).
`wire_bytes_per_step`: what a ring implementation sends per rank, by op — each op's buffer ×
the busbw factor of its own process group (hybrid: TP's ops over tp ranks, FSDP's over dp).

Activations (`activation_bytes_per_rank`, the rank that holds the most): Korthikanti et al.
2022's count, made for our model (`parallab.core.activations`: no dropout, flash-style SDPA,
fp32 norms and residual, SwiGLU) per recomputation mode, × the micro-batches in flight, + the LM
head where it lives, at the step's peak. `activations` holds the parts, one layer's kept bytes in
the run's mode (`per_layer_bytes`) and the paper's own figure for the same layer and mode beside.
The logits' gradient, made in backward, is a temporary: `backward_temporary_bytes_per_rank`,
beside the activations (the memory fit adds it), not among them.

Memory over the step (`memory_curve`): what each kind of rank holds by category, for the
predicted curve a run page draws over the measured timeline (`parallab.core.memory_curve`).
"""

from __future__ import annotations

from typing import Any

from parallab.core.accuracy import accuracy_of
from parallab.core.activations import (
    checkpoint_input_bytes,
    head_bytes_per_token,
    korthikanti_layer_bytes,
    layer_terms,
    loss_backward_temporaries,
    per_token_bytes,
    selective_kept_bytes,
    weight_copy_bytes,
)
from parallab.core.costs import precision_recipe, state_bytes_per_param, zero_paper_bytes_per_param, zero_paper_recipe
from parallab.core.dims.pp import pipeline_facts
from parallab.core.families import model_flops_per_token, param_counts
from parallab.core.jobs import ResolvedJob
from parallab.core.memory_curve import inputs_for
from parallab.core.plan_hardware import Hardware
from parallab.core.planner import estimate_step_time
from parallab.core.run_recipe import PARALLAB, RunRecipe
from parallab.core.strategies.base import ActivationLayout

GB = 1e9


def zero_stages(psi: int, n: int, precision: str = "bf16") -> dict[str, int]:
    """The ZeRO paper's per-rank model-state bytes, baseline and stages 1–3, for Ψ params on N ranks,
    in the paper's recipe (`zero_paper_bytes_per_param`: 2+2+12 for 16-bit training)."""
    p, g, k = zero_paper_bytes_per_param(precision)
    return {
        "baseline": (p + g + k) * psi,
        "stage1": p * psi + g * psi + k * psi // n,
        "stage2": p * psi + (g + k) * psi // n,
        "stage3": (p + g + k) * psi // n,
    }


def model_state_per_rank(job: ResolvedJob) -> dict[str, int]:
    """{params, grads, optimizer} bytes of the rank that holds the most, in the recipe that runs."""
    p, g, k = state_bytes_per_param(job.workload.precision)
    most = max(job.descriptor.param_elements_per_rank(job))
    return {"params": p * most, "grads": g * most, "optimizer": k * most}


def layout_activations(job: ResolvedJob, layout: ActivationLayout, recipe: RunRecipe = PARALLAB) -> dict[str, Any]:
    """The activation bytes of one kind of rank, by part (see `parallab.core.activations`), under
    `recipe` (`parallab.core.run_recipe`): with loss parallel the head's output is sharded over the
    vocabulary under tensor parallelism, so its log-softmax and the logits' gradient are V/tp wide
    on each rank; its selective policy says what selective recomputation keeps; a compiled loss
    keeps the logits and makes their gradient in their dtype, no fp32 tensor."""
    cfg, wl = job.model, job.workload
    mode = wl.activation_checkpointing
    p16 = not layout.weight_copies  # FSDP computes with its 16-bit param_dtype: no autocast copies, a 16-bit stream
    terms = layer_terms(cfg, wl.precision, tp=layout.tp, sequence_parallel=layout.sequence_parallel, params_16bit=p16)
    per_token = per_token_bytes(terms, "none")
    kept_head, head_grad = head_bytes_per_token(
        cfg, wl.precision, params_16bit=p16, tp=layout.tp, sequence_parallel=layout.sequence_parallel, compiled_loss=recipe.compiled_loss
    )
    loss_parallel = recipe.loss_parallel_at(layout.tp)
    if loss_parallel:
        vocab_part = 4 * cfg.vocab_size  # the fp32 log-softmax, and the logits' gradient, V wide
        kept_head -= vocab_part - vocab_part / layout.tp
        head_grad /= layout.tp
    head = layout.head_tokens * kept_head
    # the logits' gradient is made in backward: a temporary beside the activations, not one of them
    logits_gradient = layout.micro * head_grad if layout.head_tokens else 0
    input_bytes = checkpoint_input_bytes(
        cfg, tp=layout.tp, sequence_parallel=layout.sequence_parallel, precision=wl.precision, params_16bit=p16
    )
    if mode == "none":
        kept_per_token = per_token
    elif mode == "selective":
        kept_per_token = selective_kept_bytes(
            cfg, wl.precision, tp=layout.tp, sequence_parallel=layout.sequence_parallel, params_16bit=p16, policy=recipe.selective_policy
        )
    else:
        kept_per_token = input_bytes
    kept = layout.held_layers * layout.tokens * kept_per_token
    # Under recomputation the step's peak is one of two moments, never both: the head's backward
    # (every block's kept set, the head's activations and the logits' gradient) or a block's
    # recomputation after the head's tensors are freed (every kept set and that block's full set,
    # less its own kept set). The activations at the peak are those of the larger moment.
    recomputing = layout.micro * max(per_token - kept_per_token, 0.0) if mode != "none" else 0.0
    at_head = recomputing <= head + logits_gradient
    blocks = kept + (0.0 if at_head else recomputing)
    head_at_peak, temporaries = (head, logits_gradient) if at_head else (0, 0)
    copies = layout.layers * weight_copy_bytes(cfg, wl.precision, tp=layout.tp, experts_local=layout.experts_local)
    copies = copies if layout.weight_copies else 0
    return {
        "rank": layout.name,
        "blocks": int(blocks),
        "weight_copies": int(copies),
        "head": int(head_at_peak),
        "total": int(blocks + copies + head_at_peak),
        "logits_gradient": int(temporaries),
        "loss_backward_temporaries": loss_backward_temporaries(loss_parallel=loss_parallel, compiled_loss=recipe.compiled_loss),
        "per_layer_bytes": int(layout.micro * kept_per_token),
        "recomputed_layer_bytes": int(layout.micro * per_token),
        "peak_at": "head backward" if at_head else "a block's recomputation",
        "microbatches_in_flight": layout.tokens // max(layout.micro, 1),
        "layers": layout.layers,
    }


def activation_prediction(job: ResolvedJob, recipe: RunRecipe = PARALLAB) -> dict[str, Any]:
    """The activation estimate of the rank that holds the most, its parts, and the paper's per-layer
    figure for the same micro-batch (16-bit GPT with dropout and materialised scores)."""
    layouts = job.descriptor.activation_layouts(job)
    ranks = [layout_activations(job, layout, recipe) for layout in layouts]
    most = max(range(len(ranks)), key=lambda i: ranks[i]["total"] + ranks[i]["logits_gradient"])
    layout, cfg = layouts[most], job.model
    paper = korthikanti_layer_bytes(
        s=cfg.seq_len,
        b=max(layout.micro // cfg.seq_len, 1),
        h=cfg.hidden_size,
        a=cfg.num_heads,
        t=layout.tp,
        sequence_parallel=layout.sequence_parallel,
        recompute=job.workload.activation_checkpointing,
    )
    return {
        **ranks[most],
        "recompute": job.workload.activation_checkpointing,
        "paper_per_layer_bytes": int(paper),
        "formula": "Korthikanti et al. 2022, counted for this model (parallab.core.activations)",
    }


def predict(job: ResolvedJob, hardware: Hardware | None = None, recipe: RunRecipe = PARALLAB) -> dict[str, Any]:
    """The `prediction` block of a result document ({} for job kinds that train nothing); with
    `hardware`, also the estimated step time (`step_time_s`, `parallab.core.planner`), its error
    band, what it does not model and whether it lies in a validated regime (`parallab.core.accuracy`).
    `recipe`: how the head's loss runs and what selective recomputation keeps (`parallab.core.run_recipe`)."""
    if not job.trains:
        return {}
    precision = job.workload.precision
    psi = param_counts(job.model).total
    p, g, k = state_bytes_per_param(precision)
    activations = activation_prediction(job, recipe)
    distributed = job.world_size > 1
    out: dict[str, Any] = {
        "model_state_bytes_per_rank": model_state_per_rank(job),
        "precision_recipe": precision_recipe(precision),
        "comm_bytes_per_step": job.descriptor.comm_bytes_per_step(job) if distributed else {},
        "wire_bytes_per_step": job.descriptor.wire_bytes_per_step(job) if distributed else {},
        "activation_bytes_per_rank": activations["total"],
        "backward_temporary_bytes_per_rank": activations["logits_gradient"],
        "activations": activations,
        "bubble_fraction": job.descriptor.bubble_fraction(job),
        "flops_per_token": model_flops_per_token(job.model),
        "params_total": psi,
        "bytes_per_param": {"params": p, "grads": g, "optimizer": k},
        "zero_stages_bytes_per_rank": zero_stages(psi, max(job.dp_degree, 1), precision),
        "zero_stages_recipe": zero_paper_recipe(precision),
    }
    layout = job.descriptor.layout(job.world_size, job.options)
    if layout is not None and (pipeline := pipeline_facts(layout)) is not None:
        out["pipeline"] = pipeline
    if job.descriptor.stage_layers(job.model, job.world_size, job.options) is not None:
        out["model_state_bytes_per_stage"] = [
            {"params": p * e, "grads": g * e, "optimizer": k * e} for e in job.descriptor.param_elements_per_rank(job)
        ]
    kinds = [layout_activations(job, lay, recipe) for lay in job.descriptor.activation_layouts(job)]
    states = out.get("model_state_bytes_per_stage") or [out["model_state_bytes_per_rank"]]
    out["memory_curve"] = [c.model_dump() for c in inputs_for(job, states, kinds)]
    if hardware is not None:
        estimate = estimate_step_time(job, hardware, recipe)
        out.update(step_time_s=estimate.step_s, step_time_estimate=estimate.as_dict())
        out.update(accuracy_of(job, hardware, recipe))
    return out
