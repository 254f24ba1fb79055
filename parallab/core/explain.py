"""`parallab plan --explain`: one configuration's predicted step and memory, decomposed.

The step: compute by op class (the device profile's terms, `parallab.core.gpu_time`; one line on
hardware without a profile), the communication of each mesh dimension with the share it exposes,
the bubble and the optimizer — each with its formula and the profile entry it used. The memory:
the reserved peak by category (`parallab.core.reserved`), or the prediction's allocated parts on
hardware without a profile. The lines add up to the estimate's step and the row's memory.
"""

from __future__ import annotations

from typing import Any

from parallab.core.costs import activation_dtype_bytes
from parallab.core.dims import APPLY_ORDER, compose
from parallab.core.jobs import ResolvedJob
from parallab.core.plan_hardware import Hardware
from parallab.core.planner import compute_seconds, estimate_step_time, fsdp_overhead_seconds, item_seconds, profile_terms
from parallab.core.prediction import predict
from parallab.core.reserved import reserved_memory
from parallab.core.run_recipe import PARALLAB, RunRecipe


def _comm_lines(job: ResolvedJob, hw: Hardware, compute: float, recipe: RunRecipe) -> list[dict[str, Any]]:
    """Per mesh dimension: its collectives' time and what of it stays exposed (`planner.item_seconds`)."""
    if job.world_size <= 1:
        return []
    layout = job.descriptor.layout(job.world_size, job.options)
    if layout is not None:
        plan = compose(job, layout).plan
        groups = [(dim.name, dim.comm(plan)) for dim in APPLY_ORDER]
    else:
        groups = [(job.strategy, job.descriptor.comm_items(job))]
    lines, hidden_want = [], 0.0
    for name, all_items in groups:
        timed = [(i, got) for i in all_items if (got := item_seconds(job, hw, i, recipe)) is not None]
        if not timed:
            continue
        seconds = exposed = 0.0
        for _, (t, shown, want) in timed:
            seconds += t
            exposed += shown
            hidden_want += want
        ops = ", ".join(sorted({i.op for i, _ in timed}))
        fused = "; async TP: a fused call shows what exceeds (n − 1)/n of its GEMMs" if any(i.pipelined for i, _ in timed) else ""
        lines.append(
            {
                "name": f"communication: {name} ({ops})",
                "seconds": exposed,
                "formula": f"Σ calls × (latency + bytes × busbw factor / link) = {seconds:.4g} s, of which exposed (not overlapped){fused}",
                "entry": "catalogue intra/inter-node bandwidth × link efficiency",
            }
        )
    overflow = max(0.0, hidden_want - compute)
    if overflow > 0:
        lines.append(
            {
                "name": "communication: overlap beyond compute",
                "seconds": overflow,
                "formula": "overlappable time − compute",
                "entry": "-",
            }
        )
    return lines


def _logits_gradient_formula(job: ResolvedJob, recipe: RunRecipe) -> str:
    """The logits' gradient as `activations.head_bytes_per_token` counts it: fp32, or the logits'
    own dtype under a compiled loss; V/tp wide under loss parallel."""
    nbytes = activation_dtype_bytes(job.workload.precision) if recipe.compiled_loss else 4
    width = "V/tp" if recipe.loss_parallel_at(job.degrees["tp"]) else "V"
    return f"{nbytes} B × {width} per token of one micro-batch"


def explain(job: ResolvedJob, hw: Hardware, recipe: RunRecipe = PARALLAB) -> dict[str, Any]:
    """The step and the memory of `job` on `hw` under `recipe`, term by term (module docstring)."""
    estimate = estimate_step_time(job, hw, recipe)
    terms = [t.as_dict() for t in profile_terms(job, hw, recipe=recipe)]
    if not terms:
        compute = compute_seconds(job, hw, recipe=recipe)
        terms = [{"name": "compute", "seconds": compute, "formula": "GEMMs at peak × efficiency + memory-bound ops", "entry": "datasheet"}]
    fsdp = fsdp_overhead_seconds(job, hw)
    if fsdp > 0:
        terms.append(
            {"name": "FSDP2's copies and hooks", "seconds": fsdp, "formula": "groups × micro-steps × per group", "entry": "fsdp_overhead"}
        )
    step = [
        *({**t, "name": f"compute: {t['name']}"} for t in terms),
        *_comm_lines(job, hw, estimate.compute_s, recipe),
        {"name": "pipeline bubble", "seconds": estimate.bubble_s, "formula": "(compute + exposed) × b/(1 − b)", "entry": "-"},
        {
            "name": "optimizer (AdamW)",
            "seconds": estimate.optimizer_s,
            "formula": "28 B × local params / bandwidth",
            "entry": "memory_bound",
        },
    ]
    prediction = predict(job, recipe=recipe)
    device_profile = hw.device_profile
    if device_profile is not None:
        memory = reserved_memory(job, prediction, device_profile)
    else:
        state = sum(prediction["model_state_bytes_per_rank"].values())
        act, temp = prediction["activation_bytes_per_rank"], prediction["backward_temporary_bytes_per_rank"]
        memory = [
            {"name": "model state", "bytes": state, "formula": "params + grads + optimizer", "entry": "-"},
            {"name": "activations", "bytes": act, "formula": "Korthikanti et al. 2022, counted for this model", "entry": "-"},
            {"name": "logits' gradient", "bytes": temp, "formula": _logits_gradient_formula(job, recipe), "entry": "-"},
            {"name": "allocated peak", "bytes": state + act + temp, "formula": "sum", "entry": "-"},
        ]
    return {"step_s": estimate.step_s, "tokens_per_s": estimate.tokens_per_s, "step": step, "memory": memory}
