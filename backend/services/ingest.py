"""Put a result document into the database — the one path for worker runs and CI uploads.

All-or-nothing: the document, the summary columns, the per-rank and per-op rows and the traces
are written in the caller's single transaction; a bad document raises before anything is written.
A CI upload's summary and flags are not taken on trust: `checked_upload` recomputes them.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.metrics import INGEST_LATENCY
from backend.models import Run
from backend.services.errors import DomainError
from backend.services.hardware import record_profile
from backend.services.recipes import recipe_columns
from backend.store import references as references_store
from backend.store import runs as store
from parallab.core.checks import RUN_CHECKS, DocumentError, check_summary, not_checked, reference_key_of
from parallab.core.flags import failed_checks, prediction_flags
from parallab.core.recipes import RECIPE_DEFAULTS
from parallab.core.result import Flag, ResultDocument, Summary
from parallab.core.spec import key_fields, options_key

UPLOAD_SOURCE = "ci"
"""A run's `source` when it came in as an upload: every other source is a run of the lab's own workers."""


def workload_key(workload: dict[str, Any]) -> str:
    """A stable hash of the fields that make runs comparable (`WORKLOAD_KEY_FIELDS`, declared with
    each field in the core): steps, seed, name and tags don't change what is being measured.
    Stored keys must stay valid, so the hashing never changes: a field added later is hashed only
    when it is off its neutral value (`key_fields`)."""
    picked = key_fields(workload)
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:32]


def shape_key(workload: dict[str, Any]) -> str:
    """The workload key without the recipe dimensions: runs of every recipe of one workload."""
    picked = {k: v for k, v in key_fields(workload).items() if k not in RECIPE_DEFAULTS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:32]


def hardware_key(hardware: dict[str, Any]) -> str:
    """E.g. 'cpu:Intel(R) Xeon(R) Processor' or 'cuda:NVIDIA H100 80GB HBM3' — runs on different
    hardware are never ranked together. A job over several hosts adds its topology, nodes ×
    devices per host ('cuda:NVIDIA H100 80GB HBM3 [2x4]'): 2×4 is not 1×8. One-host
    keys are unchanged, so stored keys stay valid."""
    device = str(hardware.get("device") or "unknown")
    name = hardware.get("device_name")
    key = f"{device}:{name}" if name else device
    nodes, per_host = hardware.get("nodes"), hardware.get("devices_per_host")
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 1:
        topology = f" [{nodes}x{per_host}]" if isinstance(per_host, int) and not isinstance(per_host, bool) else f" [{nodes} nodes]"
        return key[: 200 - len(topology)] + topology
    return key[:200]  # the column holds 200


def summary_columns(doc: ResultDocument, *, uploaded: bool) -> dict[str, Any]:
    s = doc.summary
    return {
        "workload_key": workload_key(doc.workload),
        "shape_key": shape_key(doc.workload),
        "hardware_key": hardware_key(doc.hardware),
        "strategy_options": options_key(doc.strategy.options),
        "tokens_per_s": s.tokens_per_s,
        "step_time_median_s": s.step_time_s.median,
        "mfu": s.mfu,
        "peak_allocated_bytes_max": s.peak_allocated_bytes_max,
        "comm_time_fraction": s.comm_time_fraction,
        "exposed_comm_fraction": s.exposed_comm_fraction,
        "loss_max_rel_diff": s.loss_max_rel_diff_vs_reference,
        "branch": doc.source.branch if doc.source else None,
        "commit": doc.source.commit if doc.source else None,
        **recipe_columns(doc.workload, doc.strategy.model_dump()),
        **check_columns(doc, uploaded=uploaded),
        "straggler": None if s.stragglers is None else bool(s.stragglers),
    }


NOT_CHECKED = "?"
"""Marks a check the run does not carry in the check columns (`gradient?`): not passed, not failed."""
UPLOADED = "upload"
"""The stated-checks column of an upload that carries no check at all (a job that trains nothing):
an upload is never the lab's own run, so that column is never null for one."""


def check_columns(doc: ResultDocument, *, uploaded: bool) -> dict[str, str | None]:
    """The run's checks as the leaderboard filters read them, comma-separated (null when none).

    `checks_failed`: the checks it failed, then those it does not carry (`loss?`): `checks=passed`
    keeps a run only when every check that applies is present and passed. `checks_stated`: what
    the lab did not check itself — for an upload, the checks its uploader stated and those it
    does not carry (`gradient_check?`), never null (`UPLOADED`); null for the lab's own runs, so
    `verified=true` keeps exactly the runs a worker of the lab produced."""
    summary = doc.summary.model_dump(mode="json")
    missing = not_checked(doc)
    failed = failed_checks(summary, str(doc.workload.get("precision") or "fp32")) + [RUN_CHECKS[k] + NOT_CHECKED for k in missing]
    stated = [*dict.fromkeys(doc.summary.checks_stated), *(k + NOT_CHECKED for k in missing)] if uploaded else []
    if uploaded and not stated:
        stated = [UPLOADED]
    return {"checks_failed": ",".join(failed)[:64] or None, "checks_stated": ",".join(stated)[:64] or None}


def labelled(document: ResultDocument) -> ResultDocument:
    """The document with `summary.checks_not_checked` said by the lab (never as a document states it)."""
    summary = document.summary.model_copy(update={"checks_not_checked": not_checked(document)})
    return document.model_copy(update={"summary": summary})


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
    run's profile is kept for `pool`."""
    start = time.perf_counter()
    document = labelled(document)
    rank_rows, comm_rows = _rank_rows(document)
    columns = summary_columns(document, uploaded=run.source == UPLOAD_SOURCE)
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
    INGEST_LATENCY.observe(time.perf_counter() - start, source=run.source)


def with_lab_reference(session: Session, document: ResultDocument) -> tuple[ResultDocument, bool]:
    """The upload with the lab's own fp32 reference curve of its workload (`reference_curves`, on
    the document's device kind) in place of the one it states; (document, True) when the lab has
    one, else the document as it is and False (its reference is then the uploader's word)."""
    key = reference_key_of(document)
    device = document.hardware.get("device")
    row = references_store.get_curve(session, key, device) if key and isinstance(device, str) else None
    if row is None:
        return document, False
    stated = document.loss.reference or None
    loss = document.loss.model_copy(
        update={"reference": [float(x) for x in row.loss], "reference_source": "lab database", "stated_reference": stated}
    )
    return document.model_copy(update={"loss": loss}), True


def checked_upload(document: ResultDocument, *, lab_reference: bool = False) -> ResultDocument:
    """An upload as it is stored: its summary recomputed from its own ranks and its flags from its
    prediction by the one gap rule (`parallab.core.checks`, `parallab.core.flags`).

    A stated summary that disagrees with the ranks beyond float noise is refused: `DocumentError`
    (a 422 naming each field), never stored. Stated flags are not read: they are recomputed.
    What cannot be recomputed is labelled in `summary.checks_stated`: the gradient and replica
    checks, and the loss reference unless it is the lab's own (`lab_reference`); a check the
    upload does not carry, in `summary.checks_not_checked`.
    """
    checked = check_summary(document)
    if checked.problems:
        raise DocumentError(checked.problems)
    if not lab_reference:  # the uploader's own reference is the one it carries: nothing kept beside it
        document = document.model_copy(update={"loss": document.loss.model_copy(update={"stated_reference": None})})
    if document.loss.reference and not lab_reference:
        checked.summary["checks_stated"] = [*checked.summary.get("checks_stated", []), "loss_reference"]
    prediction = document.prediction.model_dump(mode="json", exclude_defaults=True)
    flags = (
        prediction_flags(
            prediction=prediction,
            summary=checked.summary,
            ranks=[r.model_dump(mode="json") for r in document.ranks],
            precision=str(document.workload.get("precision") or "fp32"),
        )
        if prediction
        else []
    )
    return labelled(
        document.model_copy(update={"summary": Summary.model_validate(checked.summary), "flags": [Flag.model_validate(f) for f in flags]})
    )


def ci_metadata(document: ResultDocument) -> dict[str, Any]:
    """The CI metadata an upload's run keeps beyond branch and commit."""
    source = document.source
    return {"repository": source.repository, "pr": source.pr, "ci_url": source.ci_url} if source is not None else {}


def config_key(document: ResultDocument) -> tuple[Any, ...]:
    """The leaderboard config a document's run ranks in (`leaderboard.CONFIG`'s columns, in order)."""
    return (workload_key(document.workload), hardware_key(document.hardware), document.strategy.name,
            document.strategy.world_size, options_key(document.strategy.options))  # fmt: skip


class IdempotencyConflict(DomainError, ValueError):
    """An Idempotency-Key already stored a different document (409)."""

    status_code = 409


def _canonical(value: Any, depth: int = 2) -> Iterator[str]:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"))` in pieces — the same text — one
    `json.dumps` per item of the top `depth` levels, so no single C call holds the GIL for a whole
    wide document (~12 ms) while the event loop waits."""
    if depth and isinstance(value, dict):
        yield "{"
        for i, key in enumerate(sorted(value)):
            yield ("," if i else "") + json.dumps(key) + ":"
            yield from _canonical(value[key], depth - 1)
        yield "}"
    elif depth and isinstance(value, list):
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield from _canonical(item, depth - 1)
        yield "]"
    else:
        yield json.dumps(value, sort_keys=True, separators=(",", ":"))


def document_sha256(document: ResultDocument) -> str:
    """A hash of the document's content (key order and whitespace of the upload don't matter):
    SHA-256 of its canonical JSON (sorted keys, no spaces), the same as ever, fed in pieces."""
    digest = hashlib.sha256()
    for piece in _canonical(document.model_dump(mode="json")):
        digest.update(piece.encode())
    return digest.hexdigest()


def _replay(run: Run, key: str, body_sha256: str) -> tuple[Run, bool]:
    """The run first stored under `key`, if this is the same document."""
    if run.idempotency_body_sha256 not in (None, body_sha256):
        raise IdempotencyConflict(
            f"Idempotency-Key {key!r} was already used for a different result document (run {run.id}); use a new key for a new result"
        )
    return run, False


def ingest_upload(
    session: Session, *, document: ResultDocument, idempotency_key: str | None, idempotency_owner: int = 0, user_id: int | None = None
) -> tuple[Run, bool]:
    """A CI upload becomes a finished run. Returns (run, created).

    The document is checked first (`checked_upload`: raises `DocumentError` before anything is
    written). A repeated key returns the first run, or raises IdempotencyConflict for a different
    document. A key is its owner's (`idempotency_owner`: the uploader's user id, 0 for none): the
    same key of another owner is another key. Concurrent uploads with one key race to insert it:
    the unique index lets one win and the others wait for it, fail on the key, roll back to a
    savepoint taken just before the insert (so a batch's earlier documents stay) and return the
    winner's run. A new run is stored with its uploader (`user_id`) and CI metadata, so its
    leaderboard row is written once, complete.
    """
    body_sha256 = document_sha256(document) if idempotency_key else None
    if idempotency_key and body_sha256:
        existing = store.get_run_by_idempotency_key(session, idempotency_key, idempotency_owner)
        if existing is not None:
            return _replay(existing, idempotency_key, body_sha256)
    document, lab_reference = with_lab_reference(session, document)
    document = checked_upload(document, lab_reference=lab_reference)
    spec = {
        "name": document.name,
        "workload": document.workload,
        "strategy": document.strategy.model_dump(),
        "trace": False,
        "tags": document.tags,
    }
    try:
        with session.begin_nested():
            run = store.add_run(
                session,
                Run(
                    name=document.name,
                    status="running",
                    source=UPLOAD_SOURCE,
                    spec=spec,
                    strategy=document.strategy.name,
                    world_size=document.strategy.world_size,
                    model=str(document.workload.get("model", "custom"))[:64],
                    idempotency_key=idempotency_key,
                    idempotency_owner=idempotency_owner if idempotency_key else None,
                    idempotency_body_sha256=body_sha256,
                    user_id=user_id,
                    **ci_metadata(document),
                    # written with the row: attach_result sets the same values, so no UPDATE for them
                    **summary_columns(document, uploaded=True),
                ),
            )
    except IntegrityError:
        winner = store.get_run_by_idempotency_key(session, idempotency_key, idempotency_owner) if idempotency_key else None
        if winner is None or body_sha256 is None or idempotency_key is None:
            raise
        return _replay(winner, idempotency_key, body_sha256)
    attach_result(session, run=run, document=document)
    return run, True
