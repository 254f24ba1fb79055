"""Query-string parsers that REST and the pages share, as FastAPI dependencies.

Every list route reads its whole query string as one `QueryParams` model
(`Annotated[Model, Query()]`), so the OpenAPI document lists each name with its bounds and enums,
and every route refuses the same way: a misspelt name is a 422 listing the names the route takes,
an enumerated value (a status, a source, a sort column) outside its set a 422 naming the parameter
and listing the valid values — never ignored: a list that silently ignores `?stratgy=ddp` or
`?status=bogus` answers a question nobody asked. HTML filter forms send an empty value for
"any": empty means unset.

The leaderboard page, its CSV/JSON exports and `GET /api/v1/leaderboard` all read their filters
through `LeaderboardQueryDep`, so they accept the same names and refuse the same values.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from fastapi import Depends, HTTPException, Query
from pydantic import Field, WithJsonSchema, field_validator

from backend.api.deps import SessionDep
from backend.models import RunSource, RunStatus
from backend.schemas.queries import QueryParams
from backend.services.auth import user_filter
from backend.services.leaderboard import MAX_PAGE, SORT_COLUMNS, Leaderboard, LeaderboardQuery, get_leaderboard
from parallab.core.result import MAX_RANKS
from parallab.core.spec import Checkpointing, Precision, StrategyName

MAX_OFFSET = 1_000_000


MAX_LIST_PAGE = 500
"""Most rows one page of a REST list gives."""


class RunFilters(QueryParams):
    """The runs list's filters, on the runs page and `GET /api/v1/runs` alike."""

    route: ClassVar[str] = "the runs list"

    status: RunStatus | None = None
    strategy: StrategyName | None = None
    user: str | None = Field(None, max_length=320, description="Who submitted or uploaded the runs (email).")
    tag: str | None = Field(None, max_length=64, description="Runs carrying this tag.")
    straggler: bool | None = Field(
        None, description="true: runs where a rank was named a straggler; false: analysed runs where none stood out."
    )
    q: str | None = Field(
        None, max_length=200, description="Search: runs whose name or model contains it (any case), or whose id starts with it."
    )
    cursor: str | None = Field(None, max_length=200, description="`next_cursor` of the previous page.")


class RunListParams(RunFilters):
    """`GET /api/v1/runs`: the page's filters, and by model, source and page size."""

    model: str | None = Field(None, max_length=64, description="Model preset.")
    source: RunSource | None = Field(None, description="form, api, cli or ci.")
    limit: int = Field(50, ge=1, le=MAX_LIST_PAGE)


class SweepListParams(QueryParams):
    """`GET /api/v1/sweeps`: newest first."""

    route: ClassVar[str] = "the sweeps list"

    limit: int = Field(50, ge=1, le=MAX_LIST_PAGE)


class SeriesListParams(QueryParams):
    """`GET /api/v1/series` takes no parameters (every series, latest result first)."""

    route: ClassVar[str] = "the series list"


class WorkerListParams(QueryParams):
    """`GET /api/v1/workers` takes no parameters (every worker, by pool)."""

    route: ClassVar[str] = "the workers list"


class LeaderboardParams(QueryParams):
    """The leaderboard's query parameters."""

    route: ClassVar[str] = "the leaderboard"

    model: str | None = Field(None, max_length=64, description="Model preset.")
    hardware: str | None = Field(None, max_length=200, description="Hardware key, e.g. `cpu` or `cuda:NVIDIA H100 80GB HBM3`.")
    strategy: StrategyName | None = None
    world_size: int | None = Field(None, ge=1, le=MAX_RANKS)
    source: RunSource | None = Field(None, description="form, api, cli or ci.")
    branch: str | None = Field(None, max_length=200)
    user: str | None = Field(None, max_length=320, description="Who submitted or uploaded the runs (email).")
    precision: Precision | None = Field(None, description="Recipe: fp32, bf16, fp16 or fp8.")
    activation_checkpointing: Checkpointing | None = Field(None, description="Recipe: none, selective, alternate or full.")
    grad_accumulation_steps: int | None = Field(None, ge=1, le=1 << 20, description="Recipe: accumulation micro-steps.")
    micro_batch_size: int | None = Field(None, ge=1, le=1 << 20, description="Recipe: sequences per forward on a rank.")
    group: Literal["workload", "shape", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size"] = Field(
        "workload",
        description="Rank within the same workload (recipe included), the same shape (every recipe competing), "
        "or one group per value of a recipe dimension.",
    )
    checks: Literal["all", "passed"] = Field(
        "all",
        description="`all`: runs that failed a correctness check (loss against the reference, gradient, replica) or do not "
        "carry one (not checked) are shown greyed with ⚑; `passed`: only runs with every check that applies present and "
        "passed are kept (in the configs' medians too).",
    )
    verified: bool = Field(
        False,
        description="Only runs the lab's own workers produced: every upload is left out, whatever checks it states "
        "(its checks are the uploader's word or not checked).",
    )
    runs: Literal["best", "all"] = Field(
        "best",
        description="One row per (strategy, world size) config — ranked by the median of its runs, with n and the "
        "median's 95% interval — or every run.",
    )
    sort: Annotated[str, WithJsonSchema({"type": "string", "enum": list(SORT_COLUMNS)})] | None = Field(
        None, max_length=64, description="Column to sort by (default: rank within each group)."
    )
    dir: Literal["asc", "desc"] = "desc"
    limit: int = Field(50, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Rows to skip (use the filters to narrow a long board).")
    cursor: str | None = Field(
        None,
        max_length=2000,
        description="`next_cursor` of the previous page (every run, sorted by a column): the page starts after it at a cost "
        "that does not grow with the depth; `offset` then only states the page's position.",
    )

    @field_validator("sort")
    @classmethod
    def _known_sort(cls, value: str | None) -> str | None:
        if value is not None and value not in SORT_COLUMNS:
            raise ValueError(f"{value!r} is not a column of the leaderboard; sort by one of: {', '.join(SORT_COLUMNS)}")
        return value


def leaderboard_query(params: Annotated[LeaderboardParams, Query()], session: SessionDep) -> LeaderboardQuery:
    """The service's query from the query string (a user by email)."""
    return LeaderboardQuery(
        user_id=user_filter(session=session, email=params.user),
        model=params.model,
        hardware_key=params.hardware,
        strategy=params.strategy,
        world_size=params.world_size,
        source=params.source,
        branch=params.branch,
        precision=params.precision,
        activation_checkpointing=params.activation_checkpointing,
        grad_accumulation_steps=params.grad_accumulation_steps,
        micro_batch_size=params.micro_batch_size,
        checks=params.checks,
        verified=params.verified,
        group=params.group,
        best_only=params.runs == "best",
        sort=params.sort,
        descending=params.dir == "desc",
        limit=params.limit,
        offset=params.offset,
        cursor=params.cursor,
    )


LeaderboardQueryDep = Annotated[LeaderboardQuery, Depends(leaderboard_query)]


def leaderboard_page(session: SessionDep, query: LeaderboardQueryDep) -> Leaderboard:
    """The board the query asks for; a cursor that does not fit it is the request's error (422 on `cursor`)."""
    try:
        return get_leaderboard(session=session, query=query)
    except ValueError as exc:
        raise HTTPException(422, detail=[{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]) from None


LeaderboardDep = Annotated[Leaderboard, Depends(leaderboard_page)]
