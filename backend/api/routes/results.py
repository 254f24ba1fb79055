"""REST: CI uploads of result documents (token with scope `upload`, Idempotency-Key honoured)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from backend.api.deps import CanUpload, SessionDep, SettingsDep
from backend.api.ratelimit import UploadRateLimit
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
    dependencies=[CanUpload, UploadRateLimit],
    openapi_extra={"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResultDocument"}}}}},
)
async def upload_result(
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> RunRead:
    """Store a result document as a finished run. A repeated Idempotency-Key returns the first run (200);
    the same key with a different document is refused (409). Rate-limited per token (429)."""
    body = await read_limited_body(request, settings.max_upload_bytes)
    try:
        document = ResultDocument.model_validate_json(body)
    except ValidationError as exc:  # the app's 422 handler caps what it echoes
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_input=False)]
        raise RequestValidationError(errors) from None

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
