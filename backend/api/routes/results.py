"""REST: CI uploads of result documents (token with scope `upload`, Idempotency-Key honoured)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request, Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from backend.api.deps import CanUpload, SessionDep, SettingsDep
from backend.api.routes.runs import run_read
from backend.schemas.runs import RunRead
from backend.services.ingest import ingest_upload
from parallab.core.result import ResultDocument

router = APIRouter(prefix="/results", tags=["results"])


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=f"result documents are limited to {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=f"result documents are limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RunRead,
    dependencies=[CanUpload],
    openapi_extra={"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResultDocument"}}}}},
)
async def upload_result(
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> RunRead:
    """Store a result document as a finished run. A repeated Idempotency-Key returns the first run (200).

    The document is checked against itself before anything is stored: its `summary` is recomputed
    from its own `ranks[]`, `loss`, workload and hardware (the worker's formulas), and a stated
    field that disagrees — beyond a relative 1e-6 for rates, times, fractions and losses, ±1 byte
    for byte counts — refuses the upload with 422, one detail per field (`loc`
    `["body", "summary", <field>]`, the stated and recomputed values in `msg`). FLOPs per token,
    TFLOP/s and MFU are recomputed with the server's formulas and replace what was stated. `flags`
    are never taken as stated: they are recomputed from the document's `prediction` and the checked
    summary by the one 10% gap rule.
    """
    body = await read_limited_body(request, settings.max_upload_bytes)
    try:
        document = ResultDocument.model_validate_json(body)
    except ValidationError as exc:
        detail = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors(include_url=False, include_input=False)
        ]
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail) from None

    def _write() -> RunRead:  # database work off the event loop
        run, created = ingest_upload(session=session, document=document, idempotency_key=idempotency_key)
        session.commit()
        if not created:
            response.status_code = status.HTTP_200_OK
        return run_read(run)

    return await run_in_threadpool(_write)


@router.get("/schema")
def result_schema() -> dict[str, Any]:
    """The result document's JSON Schema (the contract CI uploads are checked against)."""
    return ResultDocument.model_json_schema()
