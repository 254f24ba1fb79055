"""API views of runs (apart from the ORM models)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class RunSummary(BaseModel):
    """A run as list pages show it: no result document, just the indexed summary columns."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str | None
    status: str
    source: str
    strategy: str
    world_size: int
    model: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, Any] | None
    tokens_per_s: float | None
    step_time_median_s: float | None
    mfu: float | None
    peak_allocated_bytes_max: int | None
    loss_max_rel_diff: float | None
    branch: str | None
    commit: str | None
    pool: str | None = None
    """The pool it was queued on (issue 13)."""
    host: str | None = None
    """node 0's host, once a worker claimed it."""


class RunRead(RunSummary):
    """A run with its spec, its error (with the log tail) and, once done, its result document."""

    model_config = ConfigDict(from_attributes=False)

    spec: dict[str, Any]
    error: str | None
    cancel_requested: bool
    result: dict[str, Any] | None = None


class RunList(BaseModel):
    items: list[RunSummary]
    next_cursor: str | None
    limit: int


class TokenCreated(BaseModel):
    token: str
    scopes: list[str]
