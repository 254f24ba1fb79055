"""SQL for the leaderboard and the scaling page — only the indexed summary columns of `runs`.

Never loads result documents: with 10,000 runs the leaderboard is one windowed query over the
denormalised columns (MLflow's `latest_metrics` lesson), plus a look-up of the few specs shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, distinct, func, literal, select
from sqlalchemy.orm import Session

from backend.models import Run

# Columns a leaderboard row carries, in display order.
ROW_COLUMNS = (
    "id",
    "name",
    "model",
    "strategy",
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
    # issue 14: the recipe dimensions
    "shape_key",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
)
SORTABLE = frozenset(ROW_COLUMNS) | {"rank", "config_runs"}
RECIPE_FILTERS = ("precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
FILTERS = ("model", "hardware_key", "strategy", "world_size", "source", "branch", "user_id", *RECIPE_FILTERS)
GROUPINGS = ("workload", "shape", *RECIPE_FILTERS)
"""How runs are grouped for ranking: `workload` — the same workload key (recipe included: only
identical workloads compete); `shape` — the same model shape and batch, every recipe competing;
a recipe dimension — within a shape, one group per value of that dimension (issue 14)."""

CONFIG = ("workload_key", "hardware_key", "strategy", "world_size")
RECIPE_CONFIG = ("shape_key", "hardware_key", "strategy", "world_size", *RECIPE_FILTERS)


def partition(group: str) -> tuple[str, ...]:
    """The columns that make one ranking group under `group` (see GROUPINGS)."""
    if group == "workload":
        return ("workload_key", "hardware_key")
    if group == "shape":
        return ("shape_key", "hardware_key")
    return ("shape_key", "hardware_key", group)


def _conditions(filters: dict[str, Any]) -> list[ColumnElement[bool]]:
    """Finished runs with a throughput and a workload key, the filters applied."""
    conds: list[ColumnElement[bool]] = [Run.status == "succeeded", Run.tokens_per_s.is_not(None), Run.workload_key.is_not(None)]
    for name in FILTERS:
        value = filters.get(name)
        if value is not None and value != "":
            conds.append(getattr(Run, name) == value)
    return conds


def leaderboard_rows(
    session: Session,
    *,
    filters: dict[str, Any],
    best_only: bool,
    sort: str | None,
    descending: bool,
    limit: int,
    offset: int,
    group: str = "workload",
) -> tuple[list[dict[str, Any]], int]:
    """A page of leaderboard rows (each ranked within its workload × hardware group) and the total.

    Each (workload, hardware, strategy, world size) is aggregated once (its best throughput and
    how many runs it has — a hash aggregate over the summary columns, no sort of every run); the
    runs are joined back to it, and only then ranked within their group.
    """
    conds = _conditions(filters)
    config = CONFIG if group == "workload" else RECIPE_CONFIG
    if group != "workload":
        conds.append(Run.shape_key.is_not(None))
    config_cols = [getattr(Run, c) for c in config]
    configs = (
        select(*config_cols, func.max(Run.tokens_per_s).label("best_tps"), func.count().label("config_runs"))
        .where(*conds)
        .group_by(*config_cols)
        .subquery("configs")
    )
    # micro_batch_size may be null (CI uploads that no longer resolve): match nulls with nulls there
    on = [getattr(Run, c) == configs.c[c] if c in CONFIG else getattr(Run, c).is_not_distinct_from(configs.c[c]) for c in config]
    if best_only:
        on.append(Run.tokens_per_s == configs.c.best_tps)
    joined = (
        select(
            *(getattr(Run, c) for c in ROW_COLUMNS),
            configs.c.config_runs,
            # two runs of one config with exactly the same throughput: keep one
            func.row_number().over(partition_by=config_cols, order_by=Run.id).label("tie") if best_only else literal(1).label("tie"),
        )
        .join(configs, and_(*on))
        .where(*conds)
    ).subquery("joined")
    parts = [joined.c[c] for c in partition(group)]
    scored = (
        select(
            joined,
            func.rank().over(partition_by=parts, order_by=joined.c.tokens_per_s.desc()).label("rank"),
            func.count().over(partition_by=parts).label("group_size"),
        )
        .where(joined.c.tie == 1)
        .subquery("scored")
    )
    order: list[ColumnElement] = []
    if sort in SORTABLE and sort is not None:
        column = scored.c[sort]
        order.append((column.desc() if descending else column.asc()).nulls_last())
    order += [scored.c.model, *(scored.c[c] for c in partition(group)), scored.c.rank, scored.c.id]
    page = select(scored, func.count().over().label("total")).order_by(*order).limit(limit).offset(offset)
    rows = [dict(r._mapping) for r in session.execute(page)]
    for row in rows:
        row.pop("tie", None)
    total = rows[0]["total"] if rows else session.execute(select(func.count()).select_from(scored)).scalar_one()
    return rows, total


def specs(session: Session, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The job specs of a few runs (for group labels): small JSON, never result documents."""
    if not run_ids:
        return {}
    return {run_id: spec for run_id, spec in session.execute(select(Run.id, Run.spec).where(Run.id.in_(list(run_ids))))}


def filter_values(session: Session) -> dict[str, list[Any]]:
    """Distinct values of each filter over ranked runs, for the filter menus (one scan, not one per filter)."""
    columns = [getattr(Run, name) for name in FILTERS]
    combos = session.execute(select(*columns).distinct().where(Run.status == "succeeded", Run.tokens_per_s.is_not(None))).all()
    return {name: sorted({row[i] for row in combos if row[i] is not None}) for i, name in enumerate(FILTERS)}


def workload_groups(session: Session) -> list[dict[str, Any]]:
    """Every (workload, hardware) group: its size, how many world sizes, and one run to label it."""
    query = (
        select(
            Run.workload_key,
            Run.hardware_key,
            func.min(Run.model).label("model"),
            func.count().label("runs"),
            func.count(distinct(Run.world_size)).label("world_sizes"),
            func.min(Run.id).label("sample_id"),
        )
        .where(Run.status == "succeeded", Run.tokens_per_s.is_not(None), Run.workload_key.is_not(None))
        .group_by(Run.workload_key, Run.hardware_key)
        .order_by(func.count(distinct(Run.world_size)).desc(), func.count().desc(), Run.workload_key)
    )
    return [dict(r._mapping) for r in session.execute(query)]


def scaling_points(session: Session, *, workload_key: str, hardware_key: str) -> list[dict[str, Any]]:
    """Best tokens/s per (strategy, world size) within one group."""
    query = (
        select(Run.strategy, Run.world_size, func.max(Run.tokens_per_s).label("tokens_per_s"), func.count().label("runs"))
        .where(Run.status == "succeeded", Run.tokens_per_s.is_not(None), Run.workload_key == workload_key, Run.hardware_key == hardware_key)
        .group_by(Run.strategy, Run.world_size)
        .order_by(Run.strategy, Run.world_size)
    )
    return [dict(r._mapping) for r in session.execute(query)]
