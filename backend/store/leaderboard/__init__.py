"""SQL for the leaderboard and the scaling page: the maintained narrow tables, never result documents.

Split by job: `board` (what a row, a config, a filter and a grouping are), `maintain` (the
entries, cells and counts kept in step with the runs by the store functions that write runs, in
their transaction), `query` (the pages read from them) and `dialect` (the plans and locks that
differ between Postgres and SQLite). The names callers use are here.
"""

from backend.store.leaderboard.board import (
    CELL_ATTRIBUTES,
    CONFIG,
    COUNT_KEY,
    ENTRY_COLUMNS,
    FILTERS,
    GROUPINGS,
    RECIPE_CONFIG,
    SORTABLE,
    SUBSETS,
    Board,
    partition,
    subset_of,
)
from backend.store.leaderboard.dialect import rank_band, rank_band_rows
from backend.store.leaderboard.maintain import (
    config_figures,
    counts_of,
    eligible,
    follow_run,
    forget_run,
    grouped_by_config,
    lock_cells,
    rank_marks,
    rebuild,
    runs_by_config,
    subset_cells,
)
from backend.store.leaderboard.query import (
    filter_values,
    keyset_sort,
    leaderboard_rows,
    page_columns,
    page_key,
    scaling_points,
    specs,
    straggler_counts,
    workload_groups,
)

__all__ = [
    "CELL_ATTRIBUTES",
    "CONFIG",
    "COUNT_KEY",
    "ENTRY_COLUMNS",
    "FILTERS",
    "GROUPINGS",
    "RECIPE_CONFIG",
    "SORTABLE",
    "SUBSETS",
    "Board",
    "config_figures",
    "counts_of",
    "eligible",
    "filter_values",
    "follow_run",
    "forget_run",
    "grouped_by_config",
    "keyset_sort",
    "leaderboard_rows",
    "lock_cells",
    "page_columns",
    "page_key",
    "partition",
    "rank_band",
    "rank_band_rows",
    "rank_marks",
    "rebuild",
    "runs_by_config",
    "scaling_points",
    "specs",
    "straggler_counts",
    "subset_cells",
    "subset_of",
    "workload_groups",
]
