"""All SQL that reads and writes runs, their results, ranks, comm rows, and traces (tokens: store.accounts).

Services call these; routes never touch the session directly. Bulk rows go in with one batched
insert per table. Callers own the transaction (one write, one transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, insert, null, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from backend.models import CommMetric, RankMetric, Run, RunResult, RunResultPart, RunTag, RunTrace, utcnow
from backend.store import leaderboard, result_parts
from parallab.core import hangs


def add_run(session: Session, run: Run) -> Run:
    """Store a run and the tags its spec carries (`run_tags`)."""
    session.add(run)
    session.flush()
    spec_tags = (run.spec or {}).get("tags") if isinstance(run.spec, dict) else None
    if spec_tags:
        set_tags(session, run.id, [t for t in spec_tags if isinstance(t, str)])
    return run


def set_tags(session: Session, run_id: str, tags: Sequence[str]) -> None:
    """Replace a run's tags (duplicates once, in the order given)."""
    session.execute(delete(RunTag).where(RunTag.run_id == run_id))
    wanted = list(dict.fromkeys(tags))
    if wanted:
        session.execute(insert(RunTag), [{"run_id": run_id, "tag": t} for t in wanted])


def tags_of(session: Session, run_ids: Sequence[str]) -> dict[str, list[str]]:
    """Each run's tags, sorted (runs without any are absent)."""
    out: dict[str, list[str]] = {}
    if not run_ids:
        return out
    for run_id, tag in session.execute(select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(list(run_ids))).order_by(RunTag.tag)):
        out.setdefault(run_id, []).append(tag)
    return out


def all_tags(session: Session, limit: int = 200) -> list[str]:
    """The tags in use, most used first (the runs list's tag filter)."""
    count = func.count().label("n")
    rows = session.execute(select(RunTag.tag, count).group_by(RunTag.tag).order_by(count.desc(), RunTag.tag).limit(limit))
    return [tag for tag, _ in rows]


def get_run(session: Session, run_id: str) -> Run | None:
    return session.get(Run, run_id)


def get_run_for_update(session: Session, run_id: str) -> Run | None:
    """The run row, locked on Postgres so two workers can't both start it."""
    return session.execute(select(Run).where(Run.id == run_id).with_for_update()).scalar_one_or_none()


def get_run_by_idempotency_key(session: Session, key: str, owner: int) -> Run | None:
    """The run `owner` stored under `key` (another owner's key of the same text is not theirs)."""
    return session.execute(select(Run).where(Run.idempotency_owner == owner, Run.idempotency_key == key)).scalar_one_or_none()


def list_runs(
    session: Session,
    *,
    limit: int,
    before: tuple[datetime, str] | None = None,
    status: str | None = None,
    strategy: str | None = None,
    model: str | None = None,
    source: str | None = None,
    user_id: int | None = None,
    tag: str | None = None,
    search: str | None = None,
    straggler: bool | None = None,
) -> list[Run]:
    """Newest first; keyset paging on (created_at, id) so pages stay fast with many runs. `tag`:
    runs carrying it; `search`: runs whose name or model contains it (any case) or whose id
    starts with it."""
    query = select(Run).order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
    if before is not None:
        created, run_id = before
        query = query.where((Run.created_at < created) | ((Run.created_at == created) & (Run.id < run_id)))
    for column, value in ((Run.status, status), (Run.strategy, strategy), (Run.model, model), (Run.source, source), (Run.user_id, user_id)):
        if value is not None:
            query = query.where(column == value)
    if tag is not None:
        query = query.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
    if straggler is not None:  # runs not analysed (null) match neither
        query = query.where(Run.straggler.is_(straggler))
    if search is not None:
        pattern = "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        named = func.lower(Run.name).like(pattern, escape="\\") | func.lower(Run.model).like(pattern, escape="\\")
        query = query.where(named | Run.id.startswith(search.lower(), autoescape=True))
    return list(session.execute(query).scalars())


def get_runs(session: Session, run_ids: Sequence[str]) -> list[Run]:
    rows = {r.id: r for r in session.execute(select(Run).where(Run.id.in_(list(run_ids)))).scalars()}
    return [rows[i] for i in run_ids if i in rows]


def get_documents(session: Session, run_ids: Sequence[str], *, parts: Sequence[str] = result_parts.PARTS) -> dict[str, dict[str, Any]]:
    """The result documents of these runs, with only the heavy `parts` (result_parts.PARTS) put
    back: `parts=()` reads the light documents alone."""
    rows = session.execute(select(RunResult.run_id, RunResult.document).where(RunResult.run_id.in_(list(run_ids))))
    docs = {run_id: doc for run_id, doc in rows}
    return with_parts(session, docs, parts) if parts else docs


def with_parts(session: Session, documents: dict[str, dict[str, Any]], parts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """These (light) documents with their stored heavy `parts` put back (a document without a
    stored part is left as it is)."""
    if not documents or not parts:
        return documents
    query = select(RunResultPart.run_id, RunResultPart.part, RunResultPart.data).where(
        RunResultPart.run_id.in_(list(documents)), RunResultPart.part.in_(list(parts))
    )
    found: dict[str, list[tuple[str, bytes]]] = {}
    for run_id, part, data in session.execute(query):
        found.setdefault(run_id, []).append((part, data))
    return {run_id: result_parts.merge(doc, found[run_id]) if run_id in found else doc for run_id, doc in documents.items()}


def get_document(session: Session, run_id: str, *, omit: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, int]] | None:
    """A run's result document without the top-level keys in `omit`, and how many items each omitted
    heavy part held (its bytes never leave the database); None when the run has no result.
    Two statements: the light document, then every part's size with the data of the wanted ones."""
    document = session.execute(select(RunResult.document).where(RunResult.run_id == run_id)).scalar_one_or_none()
    if document is None:
        return None
    wanted = [p for p in result_parts.PARTS if p not in omit]
    data = case((RunResultPart.part.in_(wanted), RunResultPart.data), else_=None) if wanted else null()
    rows = session.execute(select(RunResultPart.part, RunResultPart.items, data).where(RunResultPart.run_id == run_id)).all()
    document = result_parts.merge(document, [(part, packed) for part, _, packed in rows if packed is not None])
    items = {part: n for part, n, _ in rows}
    lengths = {key: int(items.get(key) or len(document.get(key) or [])) for key in omit}
    return {k: v for k, v in document.items() if k not in omit}, lengths


def get_timeline(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Only the `timeline` of a run's result document (empty without one)."""
    query = select(RunResultPart.data).where(RunResultPart.run_id == run_id, RunResultPart.part == "timeline")
    data = session.execute(query).scalar_one_or_none()
    return result_parts.unpack(data) if data is not None else []


def set_status(session: Session, run: Run, status: str, *, error: str | None = None) -> None:
    """The one write of a run's status (a stored result's success included): the leaderboard's
    row, cells and counts follow when the run is ranked before or after it (`leaderboard.follow_run`)."""
    was_ranked = run.status == "succeeded"
    run.status = status
    now = utcnow()
    if status == "running":
        run.started_at = now
    if status in ("succeeded", "failed", "cancelled"):
        run.finished_at = now
    if error is not None:
        run.error = error
    if was_ranked or status == "succeeded":
        leaderboard.follow_run(session, run, was_ranked=was_ranked)


def set_progress(session: Session, run_id: str, progress: dict[str, Any]) -> None:
    session.execute(update(Run).where(Run.id == run_id).values(progress=progress))


def cancel_requested(session: Session, run_id: str) -> bool:
    return bool(session.execute(select(Run.cancel_requested).where(Run.id == run_id)).scalar_one_or_none())


def store_result(
    session: Session,
    run: Run,
    *,
    document: dict[str, Any],
    summary_columns: dict[str, Any],
    rank_rows: list[dict[str, Any]],
    comm_rows: list[dict[str, Any]],
    traces: dict[int, bytes],
) -> None:
    """The result document and its rows — one batched insert per table, caller's transaction."""
    for key, value in summary_columns.items():
        setattr(run, key, value)
    light, parts = result_parts.split(document)
    result = RunResult(run_id=run.id, schema_version=document["schema_version"], document=light)
    session.add(result)
    session.flush()
    set_committed_value(result, "document", document)  # the whole document in memory, its heavy parts stored apart
    set_committed_value(run, "result", result)  # `run.result` without reading the document back
    if parts:
        session.execute(insert(RunResultPart), part_rows(run.id, parts))
    if rank_rows:
        session.execute(insert(RankMetric), [{"run_id": run.id, **row} for row in rank_rows])
    if comm_rows:
        session.execute(insert(CommMetric), [{"run_id": run.id, **row} for row in comm_rows])
    if traces:
        session.execute(insert(RunTrace), [{"run_id": run.id, "rank": r, "data": data} for r, data in traces.items()])


def part_rows(run_id: str, parts: dict[str, result_parts.Part]) -> list[dict[str, Any]]:
    """The `run_result_parts` rows of one document's heavy parts (as `result_parts.split` gave them)."""
    return [{"run_id": run_id, "part": key, "items": items, "data": data} for key, (items, data) in parts.items()]


FLIGHT_RECORDER_PART = "flight_recorder"
"""The `run_result_parts` row of a failed run's flight-recorder dumps and their analysis (a run
with no result document holds it alone; never merged into a document)."""


def set_flight_recorder(session: Session, run_id: str, value: dict[str, Any]) -> None:
    """Keep a failed run's flight-recorder dumps (`{"report": …, "dumps": {rank: …}}`), replacing any
    kept before — caller's transaction."""
    session.execute(delete(RunResultPart).where(RunResultPart.run_id == run_id, RunResultPart.part == FLIGHT_RECORDER_PART))
    dumps = value.get("dumps") or {}
    row = {
        "run_id": run_id,
        "part": FLIGHT_RECORDER_PART,
        "items": sum(d is not None for d in dumps.values()),
        "data": result_parts.pack(value),
    }
    session.execute(insert(RunResultPart), [row])


NODE_FLIGHT_PART = "flight_node"
"""The `run_result_parts` rows of the dumps a gang's other nodes handed on (`flight_node1`, …),
read by node 0 when the run fails and merged into `flight_recorder`."""


def add_node_flight(session: Session, run_id: str, node_rank: int, files: dict[int, str]) -> None:
    """Keep the dumps node `node_rank` of a gang handed on (`{global rank: dump text}`) — caller's transaction."""
    part = f"{NODE_FLIGHT_PART}{node_rank}"
    session.execute(delete(RunResultPart).where(RunResultPart.run_id == run_id, RunResultPart.part == part))
    value = {str(rank): text for rank, text in files.items()}
    session.execute(insert(RunResultPart), [{"run_id": run_id, "part": part, "items": len(value), "data": result_parts.pack(value)}])


def node_flight(session: Session, run_id: str) -> dict[int, str]:
    """Every dump the other nodes of a gang handed on, by global rank."""
    query = select(RunResultPart.data).where(RunResultPart.run_id == run_id, RunResultPart.part.startswith(NODE_FLIGHT_PART))
    out: dict[int, str] = {}
    for data in session.execute(query).scalars():
        value = result_parts.unpack(data)
        if isinstance(value, dict):
            out.update({int(rank): str(text) for rank, text in value.items() if text is not None})
    return out


def merge_late_flight(session: Session, run_id: str, *, world_size: int, files: dict[int, str]) -> None:
    """A node's dumps that came after its run had already ended failed: merged into the dumps the
    run kept (a rank's own dump never replaced) and every rank analysed again — caller's transaction."""
    before = get_flight_recorder(session, run_id)
    merged: dict[int, str | None] = hangs.kept_files(before) if before is not None else {}
    new = {rank: text for rank, text in files.items() if merged.get(rank) is None}
    if not new:  # every one already kept: nothing to analyse again
        return
    value = hangs.kept({**merged, **new}, world_size=world_size, run=run_id)
    if value is not None:
        set_flight_recorder(session, run_id, value)


def flight_recorder_dumps(session: Session, run_id: str) -> int | None:
    """How many ranks' dumps a failed run kept (None: it kept no flight recorder), without reading them."""
    query = select(RunResultPart.items).where(RunResultPart.run_id == run_id, RunResultPart.part == FLIGHT_RECORDER_PART)
    return session.execute(query).scalar_one_or_none()


def get_flight_recorder(session: Session, run_id: str) -> dict[str, Any] | None:
    query = select(RunResultPart.data).where(RunResultPart.run_id == run_id, RunResultPart.part == FLIGHT_RECORDER_PART)
    data = session.execute(query).scalar_one_or_none()
    value = result_parts.unpack(data) if data is not None else None
    return value if isinstance(value, dict) else None


def get_trace(session: Session, run_id: str, rank: int) -> bytes | None:
    return session.execute(select(RunTrace.data).where(RunTrace.run_id == run_id, RunTrace.rank == rank)).scalar_one_or_none()


def trace_ranks(session: Session, run_id: str) -> list[int]:
    return list(session.execute(select(RunTrace.rank).where(RunTrace.run_id == run_id).order_by(RunTrace.rank)).scalars())


def count_active_runs(session: Session, user_id: int) -> int:
    """Runs of `user_id` that are queued or running."""
    query = select(func.count()).select_from(Run).where(Run.user_id == user_id, Run.status.in_(("queued", "running")))
    return session.execute(query).scalar_one()


def count_runs(session: Session) -> int:
    return session.execute(select(func.count()).select_from(Run)).scalar_one()


def delete_run(session: Session, run_id: str) -> None:
    leaderboard.forget_run(session, run_id)  # its entry and its config's cells and counts, in this transaction
    session.execute(delete(Run).where(Run.id == run_id))


def latest_reproduction(session: Session, upload_id: str) -> Run | None:
    """The newest lab run that re-ran the upload `upload_id` (`Run.reproduces_id`), if any."""
    query = select(Run).where(Run.reproduces_id == upload_id).order_by(Run.created_at.desc(), Run.id.desc()).limit(1)
    return session.execute(query).scalar_one_or_none()
