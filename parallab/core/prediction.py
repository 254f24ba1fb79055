"""What theory predicts for a job, from its config alone (`parallab plan`, stored with each run).

The strategies' descriptors hold their own cost formulas (`parallab.core.strategies.*`); this
module puts them together into the result document's `prediction` block:

Model state per rank (`model_state_bytes_per_rank`, the max over ranks) = the rank's local
parameter elements × bytes per element of (params, grads, optimizer): fp32 AdamW 4+4+8; mixed
precision (bf16/fp16) the ZeRO paper's 2+2+12 (K = 12: fp32 master, momentum, variance). Note
that torch autocast — what the harness uses — keeps fp32 params and grads, i.e. 4+4+8: the same
16 bytes per parameter split differently, so flags compare the mixed-precision total only.

Communication per step (`comm_bytes_per_step`, the max over ranks per op, nccl-tests' buffer
convention as measured): each descriptor's `comm_bytes_per_step`. Gradients travel in fp32
(autocast keeps fp32 grads); activations in the precision's bytes, except ring attention's K/V
(always fp32) and the pipeline's residual stream (fp32 under autocast).

Activations (`activation_bytes_per_rank`) are an estimate, not exact: per block and token the
tensors autograd saves — ≈ 10·h (norm in/out, q, k, v, attention out, residual, ffn norm) + 4·f
(w1, w3, silu, product) elements, attention by a flash-style kernel (no T² term, as torch's
CPU/GPU SDPA) — plus fp32 logits and their gradient where the head lives. Full activation
checkpointing keeps each block's input plus one block's full set; `selective` is counted as none.
The descriptor says how its activations lie on a rank (`activation_layout`).
"""

from __future__ import annotations

from typing import Any

from parallab.core.costs import activation_dtype_bytes, state_bytes_per_param
from parallab.core.jobs import ResolvedJob
from parallab.core.model import model_flops_per_token, param_counts
from parallab.core.planner import Hardware, estimate_step_time

GB = 1e9


def zero_stages(psi: int, n: int, precision: str = "bf16") -> dict[str, int]:
    """The ZeRO paper's per-rank model-state bytes: baseline and stages 1–3 for Ψ params on N ranks."""
    p, g, k = state_bytes_per_param(precision)
    return {
        "baseline": (p + g + k) * psi,
        "stage1": p * psi + g * psi + k * psi // n,
        "stage2": p * psi + (g + k) * psi // n,
        "stage3": (p + g + k) * psi // n,
    }


def model_state_per_rank(job: ResolvedJob) -> dict[str, int]:
    """{params, grads, optimizer} bytes of the rank that holds the most."""
    p, g, k = state_bytes_per_param(job.workload.precision)
    most = max(job.descriptor.param_elements_per_rank(job))
    return {"params": p * most, "grads": g * most, "optimizer": k * most}


def activation_bytes_per_rank(job: ResolvedJob) -> int:
    """Estimate of the activations one rank holds at its peak (see the module docstring)."""
    cfg, wl = job.model, job.workload
    layout = job.descriptor.activation_layout(job)
    act = activation_dtype_bytes(wl.precision)
    h = cfg.hidden_size
    f = cfg.ffn_hidden_size * (cfg.top_k * cfg.capacity_factor if cfg.is_moe else 1)
    per_token = 6 * h + (4 * h + 4 * f) / layout.tp
    if layout.sequence_parallel:
        per_token = (10 * h + 4 * f) / layout.tp
    head = layout.head_tokens * cfg.vocab_size * 4 * 2
    if wl.activation_checkpointing == "full":
        blocks = layout.tokens * (h * layout.layers + per_token) * act
    else:
        blocks = layout.tokens * per_token * layout.layers * act
    return int(blocks + head)


def predict(job: ResolvedJob, hardware: Hardware | None = None) -> dict[str, Any]:
    """The `prediction` block of a result document ({} for job kinds that train nothing); with
    `hardware`, also the estimated step time (`step_time_s`, `parallab.core.planner`)."""
    if not job.trains:
        return {}
    precision = job.workload.precision
    psi = param_counts(job.model).total
    p, g, k = state_bytes_per_param(precision)
    out: dict[str, Any] = {
        "model_state_bytes_per_rank": model_state_per_rank(job),
        "comm_bytes_per_step": job.descriptor.comm_bytes_per_step(job) if job.world_size > 1 else {},
        "activation_bytes_per_rank": activation_bytes_per_rank(job),
        "bubble_fraction": job.descriptor.bubble_fraction(job),
        "flops_per_token": model_flops_per_token(job.model),
        "params_total": psi,
        "bytes_per_param": {"params": p, "grads": g, "optimizer": k},
        "zero_stages_bytes_per_rank": zero_stages(psi, max(job.dp_degree, 1), precision),
    }
    if job.descriptor.stage_layers(job.model, job.world_size, job.options) is not None:
        out["model_state_bytes_per_stage"] = [
            {"params": p * e, "grads": g * e, "optimizer": k * e} for e in job.descriptor.param_elements_per_rank(job)
        ]
    if hardware is not None:
        estimate = estimate_step_time(job, hardware)
        out.update(step_time_s=estimate.step_s, step_time_estimate=estimate.as_dict())
    return out
