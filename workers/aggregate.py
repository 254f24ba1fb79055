"""Merge the ranks' records into one result document.

Runs in the worker (or `parallab bench`) after torchrun exits. Pure Python, no torch: the ranks
wrote JSON, this reads it. The record each rank writes, ``rank{r}.json`` in the run directory:

- ``rank``, ``model_state_bytes`` {params, grads, optimizer}, ``peak_allocated_bytes``,
  ``peak_reserved_bytes``, ``peak_rss_bytes``, ``step_times_s`` (measured steps),
  ``comm`` (per-step CommOp dicts), ``comm_time_fraction``, ``bubble_fraction``,
  ``memory_breakdown``, ``moe`` — as in `RankResult`;
- ``timeline``: events of the profiled steps (rank, op, start_us, dur_us, bytes);
- rank 0 also: ``loss`` {values, reference}, ``hardware``, ``environment``, ``collectives``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backend.schemas.result import SCHEMA_VERSION, ResultDocument
from backend.services import metrics
from backend.services.prediction import predict
from backend.services.validation import ResolvedJob
from backend.workload import model_flops_per_token

RANK_RESULT_KEYS = (
    "rank", "model_state_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes",
    "step_times_s", "comm", "comm_time_fraction", "bubble_fraction", "memory_breakdown", "moe",
)


def read_rank_records(run_dir: Path, world_size: int) -> list[dict[str, Any]]:
    """Each rank's record, in rank order; a missing one means that rank died before the end."""
    records = []
    for rank in range(world_size):
        path = run_dir / f"rank{rank}.json"
        if not path.exists():
            raise FileNotFoundError(f"rank {rank} wrote no record ({path.name})")
        records.append(json.loads(path.read_text()))
    return records


def build_result(job: ResolvedJob, records: list[dict[str, Any]]) -> ResultDocument:
    """The result document of a finished job from its ranks' records."""
    lead = records[0]
    ranks = [{k: r[k] for k in RANK_RESULT_KEYS if k in r} for r in records]
    hardware = lead.get("hardware", {})
    loss = lead.get("loss") or {"values": [], "reference": None}
    training = job.strategy != "collectives"
    tokens_per_step = job.global_batch_size * job.model.seq_len if training else 0
    summary = metrics.summarize(
        ranks=ranks,
        tokens_per_step=tokens_per_step,
        samples_per_step=job.global_batch_size if training else 0,
        flops_per_token=model_flops_per_token(job.model) if training else None,
        device_name=hardware.get("device_name"),
        world_size=job.world_size,
        loss=loss,
    )
    timeline = [event for r in records for event in r.get("timeline", [])]
    prediction = predict(job) if training else {}
    flags = metrics.prediction_flags(prediction=prediction, summary=summary, ranks=ranks, precision=job.spec.workload.precision) if training else []
    return ResultDocument.model_validate(
        {
            "schema_version": SCHEMA_VERSION,
            "name": job.spec.name,
            "workload": job.workload_document(),
            "strategy": job.strategy_document(),
            "hardware": hardware,
            "environment": lead.get("environment", {}),
            "summary": summary,
            "ranks": ranks,
            "loss": loss,
            "prediction": prediction,
            "flags": flags,
            "timeline": timeline,
            "collectives": lead.get("collectives", []),
            "tags": job.spec.tags,
        }
    )
