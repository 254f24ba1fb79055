"""REST: CI uploads of result documents (token with scope `upload`, Idempotency-Key honoured).

The body is one result document or a batch (a JSON list of them, stored all or nothing). The
answer carries each result's verdicts on its CI series.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request, Response, status
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.api.body import read_limited_body
from backend.api.deps import SessionDep, SettingsDep, UploaderDep
from backend.api.ratelimit import UploadRateLimit
from backend.api.routes.runs import run_read
from backend.api.upload_pool import upload_pool
from backend.schemas.runs import CounterChange, UploadBatchRead, UploadRead, Verdict
from backend.services import series as series_service
from backend.services.auth import ANONYMOUS, Principal
from backend.services.uploads import Uploaded, UploadRaced, parse_documents, stored_uploads, upload_results
from parallab.core.result import ResultDocument

router = APIRouter(prefix="/results", tags=["results"])
log = logging.getLogger(__name__)


def upload_read(uploaded: Uploaded) -> UploadRead:
    """The stored upload as the uploader reads it back (an upload carries no worker's error: any is shortened)."""
    return UploadRead(
        **run_read(uploaded.run, ANONYMOUS).model_dump(),
        verdicts=[Verdict.model_validate(series_service.verdict_dict(v)) for v in uploaded.verdicts],
        regressed=uploaded.regressed,
        changes=[CounterChange.model_validate(c) for c in uploaded.changes],
        changed=uploaded.changed,
    )


def released_uploader(session: SessionDep, principal: UploaderDep) -> Principal:
    """The uploader, once its token check's connection is back in the pool: an upload that waits for
    a thread holds none (run in the thread pool, as closing the session rolls back)."""
    session.close()
    return principal


ReleasedUploader = Annotated[Principal, Depends(released_uploader)]


def upload_answer(uploaded: list[Uploaded], *, batch: bool, headers: dict[str, str]) -> Response:
    """201 when any document was stored now, 200 when all were stored before (a replayed key)."""
    items = [upload_read(u) for u in uploaded]
    answer = (
        UploadBatchRead(items=items, regressed=any(i.regressed for i in items), changed=any(i.changed for i in items))
        if batch
        else items[0]
    )
    out = Response(
        content=answer.model_dump_json(),
        status_code=status.HTTP_201_CREATED if any(u.created for u in uploaded) else status.HTTP_200_OK,
        media_type="application/json",
    )
    out.headers.update(headers)
    return out


def answer_read_back(session: Session, stored: list[tuple[str, bool]], *, batch: bool, headers: dict[str, str]) -> Response:
    """The answer of committed uploads whose first answer failed, built from a fresh read of their
    runs; if even that fails, a 503 naming the runs (a retry under the same key answers them), never a 500."""
    session.close()
    try:
        return upload_answer(stored_uploads(session=session, stored=stored), batch=batch, headers=headers)
    except Exception:
        ids = [run_id for run_id, _ in stored]
        log.exception("upload of runs %s committed but no answer could be built", ids)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"stored as run(s) {', '.join(ids)}, but the answer failed; retry with the same Idempotency-Key for it",
            headers={"Retry-After": "1"},
        ) from None


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=UploadRead | UploadBatchRead,
    dependencies=[UploadRateLimit],
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/ResultDocument"},
                            {"type": "array", "items": {"$ref": "#/components/schemas/ResultDocument"}, "minItems": 1, "maxItems": 100},
                        ]
                    }
                }
            }
        }
    },
)
async def upload_result(
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: ReleasedUploader,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Store a result document (or a batch, all or nothing) as finished runs, judged against their
    CI series. A repeated Idempotency-Key returns the first upload (200); the same key with a
    different document is refused (409). Rate-limited per token (429). While this server's upload
    threads and their queue are full, refused at once with 503 and Retry-After (nothing stored):
    retry under the same Idempotency-Key, which never stores twice.

    Each document is checked against itself before anything is stored: its `summary` is recomputed
    from its own `ranks[]`, `loss`, workload and hardware (the worker's formulas), and a stated
    field that disagrees — beyond a relative 1e-6 for rates, times, fractions and losses, ±1 byte
    for byte counts — refuses the upload with 422, one detail per field (`loc`
    `["body", "summary", <field>]`, the stated and recomputed values in `msg`). FLOPs per token,
    TFLOP/s and MFU are recomputed with the server's formulas and replace what was stated. `flags`
    are never taken as stated: they are recomputed from the document's `prediction` and the checked
    summary by the one 10% gap rule.
    """
    body = await read_limited_body(request, settings.server.max_upload_bytes)
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}  # the rate limit's

    def _write() -> Response:
        # Parsing, checks, database work and the answer's JSON all happen here, in the bounded pool:
        # the event loop only moves bytes (an async route's returned model would be validated and
        # serialised on the loop itself).
        documents, batch = parse_documents(body)
        try:
            uploaded = upload_results(
                session=session, documents=documents, batch=batch, idempotency_key=idempotency_key, principal=principal
            )
            session.commit()
        except IntegrityError:
            # Another upload won a race this one's savepoints do not cover: nothing of this one is
            # stored, and a retry under the same key finds the winner's run.
            session.rollback()
            raise UploadRaced() from None
        stored = [(u.run.id, u.created) for u in uploaded]
        try:
            return upload_answer(uploaded, batch=batch, headers=headers)
        except Exception:
            # Stored and committed: the client must get its run, not a 500 it would retry blind.
            log.exception("upload of runs %s committed but its answer failed; answering from a fresh read", [i for i, _ in stored])
        return answer_read_back(session, stored, batch=batch, headers=headers)

    pool = upload_pool(threads=settings.server.upload_concurrency, queue=settings.server.upload_queue)
    return await pool.run(_write, retry_after_s=settings.server.upload_retry_after_s)


@router.get("/schema")
def result_schema() -> dict[str, Any]:
    """The result document's JSON Schema (the contract CI uploads are checked against)."""
    return ResultDocument.model_json_schema()
