"""CI uploads: one result document or a batch, all or nothing, judged against its series.

Each document goes through the one ingest path (`services.ingest.ingest_upload`); the run then
records who uploaded it and its CI metadata, joins its series, and gets its verdicts — all in
the caller's one transaction, so a batch with one bad document stores nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from backend.models import Run, Series, SeriesVerdict
from backend.services import exact_gates
from backend.services import series as series_service
from backend.services.auth import Principal
from backend.services.errors import DomainError, validation_detail
from backend.services.ingest import config_key, ingest_upload
from backend.services.json_body import JSONNumberTooLong, parse_json
from backend.store import leaderboard as leaderboard_store
from backend.store import runs as runs_store
from parallab.core.result import ResultDocument

MAX_BATCH = 100


class UploadInvalid(DomainError, ValueError):
    """The body is not a result document or a list of them; `detail` is FastAPI's 422 shape (answered capped)."""

    status_code = 422

    def __init__(self, detail: list[dict[str, Any]]):
        self.detail = detail
        super().__init__(detail[0]["msg"] if detail else "invalid upload")

    def http_detail(self) -> Any:
        return validation_detail(self.detail)


class UploadRaced(DomainError):
    """A concurrent upload took a row this one needed first (nothing of this one was stored): retry it (503, Retry-After: 1)."""

    status_code = 503

    def __init__(self) -> None:
        super().__init__("a concurrent upload conflicted with this one and nothing was stored; retry with the same Idempotency-Key")

    def http_headers(self) -> dict[str, str] | None:
        return {"Retry-After": "1"}


@dataclass
class Uploaded:
    run: Run
    created: bool
    verdicts: list[SeriesVerdict]
    changes: list[dict[str, Any]] = field(default_factory=list)
    """Exact counters that differ from the baseline result's (`services.exact_gates`), each marked accepted or not."""

    @property
    def regressed(self) -> bool:
        """An alert that nobody dismissed."""
        return any(v.verdict == "regressed" and not v.dismissed for v in self.verdicts)

    @property
    def changed(self) -> bool:
        """An exact counter changed, and nobody accepted the change."""
        return any(not c["accepted"] for c in self.changes)


def _errors(exc: ValidationError, prefix: list[Any]) -> list[dict[str, Any]]:
    return [{"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors(include_url=False, include_input=False)]


def parse_documents(body: bytes) -> tuple[list[ResultDocument], bool]:
    """(documents, whether the body was a batch): one JSON object, or a list of 1–MAX_BATCH of them.

    One document is parsed and validated in one pass by pydantic-core (no Python dict in between),
    which refuses nesting deeper than its limit as not JSON; a batch (and a body that is
    not JSON, for the standard parser's message) is read with the one bounded parse first
    (`json_body.parse_json`), to count and index its documents."""
    if not body.lstrip().startswith(b"["):
        try:
            return [ResultDocument.model_validate_json(body)], False
        except ValidationError as exc:
            if not any(e["type"] == "json_invalid" for e in exc.errors(include_url=False, include_input=False)):
                raise UploadInvalid(_errors(exc, ["body"])) from None
            # not JSON: the same message as a batch's (and as before), from the standard parser
    try:
        data = parse_json(body)
    except JSONNumberTooLong as exc:  # JSON, but a number no field could hold: named where it is
        raise UploadInvalid([{"loc": ["body", *exc.loc], "msg": str(exc), "type": "int_too_long"}]) from None
    except ValueError as exc:
        raise UploadInvalid([{"loc": ["body"], "msg": f"not JSON: {exc}", "type": "json_invalid"}]) from None
    batch = isinstance(data, list)
    items = data if batch else [data]
    if batch and not 1 <= len(items) <= MAX_BATCH:
        raise UploadInvalid(
            [{"loc": ["body"], "msg": f"a batch holds 1 to {MAX_BATCH} result documents; got {len(items)}", "type": "value_error"}]
        )
    documents: list[ResultDocument] = []
    errors: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        prefix: list[Any] = ["body", i] if batch else ["body"]
        try:
            documents.append(ResultDocument.model_validate(item))
        except ValidationError as exc:
            errors += _errors(exc, prefix)
    if errors:
        raise UploadInvalid(errors)
    return documents, batch


def _key(idempotency_key: str | None, index: int, batch: bool) -> str | None:
    """Each document of a batch gets its own key derived from the request's (a retried batch stores nothing twice)."""
    if not idempotency_key or not batch:
        return idempotency_key
    return f"{idempotency_key[:190]}#{index}"


def upload_results(
    *, session: Session, documents: list[ResultDocument], batch: bool, idempotency_key: str | None, principal: Principal
) -> list[Uploaded]:
    """Store the documents as finished runs, join them to their series and judge them (caller commits).

    The locks that order uploads of one config or series are taken in one order by every upload:
    the configs' leaderboard cells first, sorted, before anything is written (storing each run
    maintains its config's cells under that lock), then the series rows, written in one flush at
    the end (nothing else is flushed behind the caller's back while the runs are joined and
    judged: the judging reads only earlier results), all held until the commit."""
    stored: list[tuple[Run, bool, ResultDocument]] = []
    joined: list[Series] = []  # held here, so judging finds them in the session (its map is weak)
    leaderboard_store.lock_cells(session, [config_key(d) for d in documents])
    with session.no_autoflush:
        for i, document in enumerate(documents):
            run, created = ingest_upload(
                session=session,
                document=document,
                idempotency_key=_key(idempotency_key, i, batch),
                idempotency_owner=principal.user_id or 0,  # a token without a user: one shared owner
                user_id=principal.user_id,
            )
            stored.append((run, created, document))
        new = [(run, doc) for run, created, doc in stored if created]
        # one lock order for every upload: the configs' cells (sorted, taken above), then the series (sorted)
        for run, document in sorted(new, key=lambda upload: series_service.series_id_of(session, upload[0], upload[1]) or ""):
            series = series_service.join_series(session=session, run=run, document=document)
            if series is not None:
                joined.append(series)
        rows = series_service.judgements(session=session, uploads=new)
        gates = exact_gates.gate_rows(session=session, uploads=new)
    session.flush()
    added = series_service.add_verdicts(session=session, rows=rows)
    exact_gates.add_rows(session=session, rows=gates)
    session.flush()
    replayed = [run.id for run, created, _ in stored if not created]
    verdicts = series_service.verdicts_for_runs(session=session, run_ids=replayed) if replayed else {}
    for v in added:
        verdicts.setdefault(v.run_id, []).append(v)
    changes = exact_gates.changes_for_runs(session=session, run_ids=[run.id for run, _, _ in stored])
    return [Uploaded(run, created, verdicts.get(run.id, []), changes.get(run.id, [])) for run, created, _ in stored]


def stored_uploads(*, session: Session, stored: list[tuple[str, bool]]) -> list[Uploaded]:
    """The uploads already committed as `stored` ((run id, created) in the request's order), read
    back with their verdicts: the answer of an upload whose first answer failed after its commit."""
    runs = {run_id: runs_store.get_run(session, run_id) for run_id, _ in stored}
    verdicts = series_service.verdicts_for_runs(session=session, run_ids=list(runs))
    changes = exact_gates.changes_for_runs(session=session, run_ids=list(runs))
    out = []
    for run_id, created in stored:
        run = runs[run_id]
        if run is None:
            raise LookupError(f"run {run_id} was committed but is not there")
        out.append(Uploaded(run, created, verdicts.get(run_id, []), changes.get(run_id, [])))
    return out
