"""The leaderboard's vocabulary: the columns a row carries, what one config is, the filters and
groupings, and the conditions and tallies that the maintained tables and the queries share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ClauseElement,
    ColumnElement,
    Integer,
    and_,
    cast,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from backend.models import LeaderboardCell as Cell
from backend.models import LeaderboardCount as Count
from backend.models import LeaderboardEntry as Entry

# Columns a leaderboard row carries, in display order.
ROW_COLUMNS = (
    "id",
    "name",
    "model",
    "strategy",
    "strategy_options",
    "world_size",
    "workload_key",
    "hardware_key",
    "tokens_per_s",
    "mfu",
    "peak_allocated_bytes_max",
    "step_time_median_s",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "source",
    "branch",
    "commit",
    "created_at",
    "user_id",
    # The recipe dimensions
    "shape_key",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
    # The correctness checks it failed and those its uploader stated (comma-separated, or null)
    "checks_failed",
    "checks_stated",
)
SORTABLE = frozenset(ROW_COLUMNS) - {"checks_failed", "checks_stated", "strategy_options"} | {"rank", "config_runs"}
RECIPE_FILTERS = ("precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
FILTERS = ("model", "hardware_key", "strategy", "world_size", "source", "branch", "user_id", *RECIPE_FILTERS)
GROUPINGS = ("workload", "shape", *RECIPE_FILTERS)
"""How runs are grouped for ranking: `workload` — the same workload key (recipe included: only
identical workloads compete); `shape` — the same model shape and batch, every recipe competing;
a recipe dimension — within a shape, one group per value of that dimension."""

CONFIG = ("workload_key", "hardware_key", "strategy", "world_size", "strategy_options")
"""One config: its runs share a workload, hardware, strategy, world size and the strategy's options as
measured (FSDP resharding or not, a pipeline's schedule, virtual stages and micro-batches: each
its own row, median and n; the CI series keep the workload key alone)."""
KEYED = frozenset(CONFIG) | {"shape_key"}
"""Columns compared with `=` (never null on a ranked run, and indexed); the others null-safely."""
ENTRY_COLUMNS = tuple(c.name for c in Entry.__table__.columns)
CELL_ATTRIBUTES = ("model", "shape_key", *RECIPE_FILTERS)
"""What a config's cell carries besides its key and counts (the same for each of its runs)."""
CELL_FILTERS = frozenset({"model", "hardware_key", "strategy", "world_size", *RECIPE_FILTERS})
"""Filters the cells can answer; under the others (source, branch, user) the sizes come from the
counts and a config's figures from its filtered runs."""
CHECK_FILTERS = ("checks", "verified")
"""Filters on a run's checks (`checks="passed"`: every check that applies present and passed, none
failed or missing; `verified=True`: produced by the lab's own worker — ingest never leaves an
upload's `checks_stated` null). The cells answer them too: a config has a cell per subset they
can keep (`SUBSETS`)."""
SUBSETS: dict[str, tuple[bool, bool]] = {
    "all": (False, False),
    "passed": (True, False),
    "verified": (False, True),
    "passed_verified": (True, True),
}
"""A config's cells, each over a subset of its runs: (only runs that failed no check, only runs
whose checks the lab made itself). A subset with no runs has no cell."""
COUNT_KEY = (*CONFIG, *CELL_ATTRIBUTES, "source", "branch", "user_id", "checks_failed", "checks_stated")
"""What one `leaderboard_counts` row counts the runs of: a config and every run column a filter reads."""
SORT_WORK_MEM = "64MB"
RECIPE_CONFIG = ("shape_key", "hardware_key", "strategy", "world_size", "strategy_options", *RECIPE_FILTERS)


def partition(group: str) -> tuple[str, ...]:
    """The columns that make one ranking group under `group` (see GROUPINGS)."""
    if group == "workload":
        return ("workload_key", "hardware_key")
    if group == "shape":
        return ("shape_key", "hardware_key")
    return ("shape_key", "hardware_key", group)


def subset_of(filters: dict[str, Any]) -> str:
    """The cells' subset that holds the runs the check filters keep."""
    wanted = (filters.get("checks") == "passed", bool(filters.get("verified")))
    return next(name for name, rule in SUBSETS.items() if rule == wanted)


def conditions(filters: dict[str, Any], table: Any = Entry) -> list[ColumnElement[bool]]:
    """The filters applied to ranked runs (the table holds only those) or to cells."""
    conds: list[ColumnElement[bool]] = []
    for name in FILTERS:
        if name not in filters:
            continue
        value = filters.get(name)
        if value is not None and value != "":
            conds.append(getattr(table, name) == value)
    if filters.get("checks") == "passed":
        conds.append(table.checks_failed.is_(None))
    if filters.get("verified"):
        conds.append(table.checks_stated.is_(None))
    return conds


def match(a: Any, b: Any, columns: Sequence[str]) -> list[ColumnElement[bool]]:
    """Equality on `columns` between two tables; recipe dimensions may be null (CI uploads that no
    longer resolve): null matches null there (not indexable, so only on columns after the keys)."""
    return equals(a, columns, [getattr(b, c) for c in columns])


@dataclass(frozen=True)
class Board:
    """One request for leaderboard rows: what the planners, counts and orders share."""

    filters: dict[str, Any]
    group: str
    sort: str | None
    descending: bool
    limit: int
    offset: int
    after: tuple[Any, ...] | None = None
    """The page starts after the run with this `page_key` (keyset pagination), not at `offset`."""

    @property
    def conds(self) -> list[ColumnElement[bool]]:
        """The competing runs (see `entry_conditions`)."""
        return entry_conditions(self.filters, self.group)

    @property
    def cellable(self) -> bool:
        """Whether the cells answer every filter (CELL_FILTERS and the check filters), so the configs' figures and sizes come from them."""
        return {n for n, v in self.filters.items() if v is not None and v != ""} <= CELL_FILTERS | set(CHECK_FILTERS)

    @property
    def group_cols(self) -> tuple[str, ...]:
        return partition(self.group)

    @property
    def config(self) -> tuple[str, ...]:
        """The columns of one config: strategy and world size within a workload, or within a shape and recipe."""
        return CONFIG if self.group == "workload" else RECIPE_CONFIG


def group_order(rows: Any, group_cols: Sequence[str]) -> list[ColumnElement]:
    """The board's order after its sort column: model, then the group (nulls last on every database)."""
    return [rows.model, *(getattr(rows, c).asc().nulls_last() for c in group_cols)]


def direction(column: Any, descending: bool) -> ColumnElement:
    """A sort column's order: nulls last either way, on every database (group columns sort
    ascending, nulls last too: SQLite would put them first, Postgres' index order is the same)."""
    return (column.desc() if descending else column.asc()).nulls_last()


def entry_conditions(filters: dict[str, Any], group: str, table: Any = Entry) -> list[ColumnElement[bool]]:
    """The runs that compete under `filters` and `group` (a shape-based group needs a shape)."""
    return [*conditions(filters, table), *([] if group == "workload" else [table.shape_key.is_not(None)])]


def cell_conditions(filters: dict[str, Any], group: str) -> list[ColumnElement[bool]]:
    """The cells that hold the runs `entry_conditions` keeps, when every filter is a cell's
    (CELL_FILTERS; the check filters choose the subset)."""
    kept = {k: v for k, v in filters.items() if k in CELL_FILTERS}
    return [*entry_conditions(kept, group, Cell), Cell.subset == subset_of(filters)]


def equals(table: Any, columns: Sequence[str], values: Sequence[Any]) -> list[ColumnElement[bool]]:
    """Equality with given values on `columns`, null-safe off the keyed columns (as `match`): a value
    compares with `=` and a missing one with IS NULL — what IS NOT DISTINCT FROM means, in the form a
    btree index matches (Postgres neither estimates nor index-scans IS NOT DISTINCT FROM: a recipe
    config's runs by throughput were a scan of every entry at 1,000,000 runs)."""
    return [_equal(getattr(table, c), v, keyed=c in KEYED) for c, v in zip(columns, values, strict=True)]


def _equal(column: Any, value: Any, *, keyed: bool) -> ColumnElement[bool]:
    if not keyed and value is None:
        return column.is_(None)  # type: ignore[no-any-return]
    if not keyed and (isinstance(value, ClauseElement) or hasattr(value, "__clause_element__")):
        return column.is_not_distinct_from(value)  # type: ignore[no-any-return]  # another row's column: it may be null
    return column == value  # type: ignore[no-any-return]


def any_of(table: Any, columns: Sequence[str], keys: Iterable[Sequence[Any]]) -> ColumnElement[bool]:
    """Rows whose `columns` equal one of `keys` (`equals` each)."""
    return or_(*(and_(*equals(table, columns, key)) for key in keys))


def tallied_sizes(
    session: Session, board: Board, columns: Sequence[str], only: set[tuple[Any, ...]] | None = None
) -> dict[tuple[Any, ...], int]:
    """How many competing runs each value of `columns` (a group or a config) has, summed from the
    cells or the counts (`tally_source`); `only` restricts it to a few values. A page reads them all:
    a few hundred cells or a few thousand counts summed by one statement whose text never changes
    costs less than building and sending a condition per value on the page."""
    source, conds = tally_source(board)
    cols = [getattr(source, c) for c in columns]
    which = [] if only is None else [any_of(source, columns, only)]
    query = select(*cols, cast(func.sum(source.runs), Integer)).where(*conds, *which)
    return {tuple(r[:-1]): int(r[-1]) for r in session.execute(query.group_by(*cols))}


def tally_source(board: Board) -> tuple[Any, list[ColumnElement[bool]]]:
    """Where the board's run counts are summed from, and which of its rows: the cells when they
    answer every filter (a few hundred rows), else the counts (a few thousand: every filter is a
    counts column) — never the runs."""
    if board.cellable:
        return Cell, cell_conditions(board.filters, board.group)
    return Count, entry_conditions(board.filters, board.group, Count)
