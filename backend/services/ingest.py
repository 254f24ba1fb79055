"""Put a result document into the database — the one path for worker runs and CI uploads.

All-or-nothing: the document, the summary columns, the per-rank and per-op rows and the traces
are written in the caller's single transaction; a bad document raises before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run
from backend.services.hardware import record_profile
from backend.services.recipes import recipe_columns
from backend.store import runs as store
from parallab.core.recipes import RECIPE_DEFAULTS
from parallab.core.result import ResultDocument
from parallab.core.spec import WORKLOAD_KEY_FIELDS


def workload_key(workload: dict[str, Any]) -> str:
    """A stable hash of the fields that make runs comparable (`WORKLOAD_KEY_FIELDS`, declared with
    each field in the core): steps, seed, name and tags don't change what is being measured.
    Stored keys must stay valid, so the hashing never changes."""
    picked = {k: workload.get(k) for k in WORKLOAD_KEY_FIELDS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:32]


def shape_key(workload: dict[str, Any]) -> str:
    """The workload key without the recipe dimensions: runs of every recipe of one workload (issue 14)."""
    picked = {k: workload.get(k) for k in WORKLOAD_KEY_FIELDS if k not in RECIPE_DEFAULTS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:32]


def hardware_key(hardware: dict[str, Any]) -> str:
    """E.g. 'cpu:Intel(R) Xeon(R) Processor' or 'cuda:NVIDIA H100 80GB HBM3' — runs on different
    hardware are never ranked together."""
    device = str(hardware.get("device") or "unknown")
    name = hardware.get("device_name")
    return f"{device}:{name}"[:200] if name else device


def summary_columns(doc: ResultDocument) -> dict[str, Any]:
    s = doc.summary
    return {
        "workload_key": workload_key(doc.workload),
        "shape_key": shape_key(doc.workload),
        "hardware_key": hardware_key(doc.hardware),
        "tokens_per_s": s.tokens_per_s,
        "step_time_median_s": s.step_time_s.median,
        "mfu": s.mfu,
        "peak_allocated_bytes_max": s.peak_allocated_bytes_max,
        "comm_time_fraction": s.comm_time_fraction,
        "loss_max_rel_diff": s.loss_max_rel_diff_vs_reference,
        "branch": doc.source.branch if doc.source else None,
        "commit": doc.source.commit if doc.source else None,
        **recipe_columns(doc.workload, doc.strategy.model_dump()),
    }


def _rank_rows(doc: ResultDocument) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ranks: list[dict[str, Any]] = []
    comms: list[dict[str, Any]] = []
    for r in doc.ranks:
        ranks.append(
            {
                "rank": r.rank,
                "params_bytes": r.model_state_bytes.params,
                "grads_bytes": r.model_state_bytes.grads,
                "optimizer_bytes": r.model_state_bytes.optimizer,
                "peak_allocated_bytes": r.peak_allocated_bytes,
                "peak_rss_bytes": r.peak_rss_bytes,
                "step_time_median_s": statistics.median(r.step_times_s) if r.step_times_s else None,
                "comm_time_fraction": r.comm_time_fraction,
            }
        )
        comms.extend(
            {"rank": r.rank, "op": c.op, "count": c.count, "bytes": c.bytes, "time_s": c.time_s, "busbw_gbps": c.busbw_gbps} for c in r.comm
        )
    return ranks, comms


def attach_result(
    session: Session, *, run: Run, document: ResultDocument, traces: dict[int, bytes] | None = None, pool: str | None = None
) -> None:
    """Store `document` as `run`'s result and mark the run succeeded (caller commits); a calibrate
    run's profile is kept for `pool` (issue 14)."""
    rank_rows, comm_rows = _rank_rows(document)
    columns = summary_columns(document)
    store.store_result(
        session,
        run,
        document=document.model_dump(mode="json"),
        summary_columns=columns,
        rank_rows=rank_rows,
        comm_rows=comm_rows,
        traces=traces or {},
    )
    record_profile(session=session, run=run, document=document, pool=pool, key=columns["hardware_key"])
    store.set_status(session, run, "succeeded")


def ingest_upload(session: Session, *, document: ResultDocument, idempotency_key: str | None) -> tuple[Run, bool]:
    """A CI upload becomes a finished run. Returns (run, created); a repeated key returns the first run."""
    if idempotency_key:
        existing = store.get_run_by_idempotency_key(session, idempotency_key)
        if existing is not None:
            return existing, False
    spec = {
        "name": document.name,
        "workload": document.workload,
        "strategy": document.strategy.model_dump(),
        "trace": False,
        "tags": document.tags,
    }
    run = store.add_run(
        session,
        Run(
            name=document.name,
            status="running",
            source="ci",
            spec=spec,
            strategy=document.strategy.name,
            world_size=document.strategy.world_size,
            model=str(document.workload.get("model", "custom"))[:64],
            idempotency_key=idempotency_key,
        ),
    )
    attach_result(session, run=run, document=document)
    return run, True
