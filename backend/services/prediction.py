"""What theory predicts for a job, from its config alone (`parallab plan`, stored with each run).

First version: model-state bytes per rank by the ZeRO paper's formulas. Communication volume,
activation memory and the pipeline bubble follow (issue 4).
"""

from __future__ import annotations

from typing import Any

from backend.services.validation import ResolvedJob
from backend.workload import param_counts

# Bytes per parameter of (params, grads, optimizer state).
_FP32_ADAM = (4, 4, 8)
_MIXED_ADAM = (2, 2, 12)  # K = 12: fp32 master copy, momentum and variance


def predict(job: ResolvedJob) -> dict[str, Any]:
    """The `prediction` block of a result document."""
    psi = param_counts(job.model).total
    p, g, k = _FP32_ADAM if job.spec.workload.precision == "fp32" else _MIXED_ADAM
    n = job.world_size
    shard = {"fsdp": n, "hybrid": n, "tp": n, "pp": n}.get(job.strategy, 1)
    return {
        "model_state_bytes_per_rank": {"params": p * psi // shard, "grads": g * psi // shard, "optimizer": k * psi // shard},
        "comm_bytes_per_step": {},
    }
