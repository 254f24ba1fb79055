"""The leaderboard's maintained table: one narrow row per ranked run.

A run is ranked when it succeeded with a throughput and a workload key. Its row copies the
columns the leaderboard shows, filters and sorts on from `runs` — written in the same
transaction as the run's status (`backend.store.leaderboard.follow_run`, called by the store
function that writes it), removed with the run (`forget_run`).
The leaderboard and the scaling page read only this table: a sort of 100,000 of these rows
reads a few MB, not the runs' specs and jobs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base

FILTERED = [
    "id",
    "model",
    "strategy",
    "world_size",
    "source",
    "branch",
    "user_id",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
]
"""What a group's index carries besides its key: the columns the board filters and reads by."""
GROUPED = ["shape_key", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size"]
"""What a sort index carries besides its order: the columns of the shape and recipe groupings,
which the board's order puts after the model (migration 0013), so that a page of every run
grouped by shape is still an index-only read."""


class LeaderboardEntry(Base):
    __tablename__ = "leaderboard_entries"

    id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, doc="The run's id.")
    name: Mapped[str | None] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(32))
    strategy_options: Mapped[str] = mapped_column(String(200), default="", server_default="", doc="As the run's (migration 0025).")
    world_size: Mapped[int] = mapped_column(Integer)
    workload_key: Mapped[str] = mapped_column(String(64))
    hardware_key: Mapped[str | None] = mapped_column(String(200))
    shape_key: Mapped[str | None] = mapped_column(String(64))
    tokens_per_s: Mapped[float] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    peak_allocated_bytes_max: Mapped[int | None] = mapped_column(BigInteger)
    step_time_median_s: Mapped[float | None] = mapped_column(Float)
    comm_time_fraction: Mapped[float | None] = mapped_column(Float)
    exposed_comm_fraction: Mapped[float | None] = mapped_column(Float)
    loss_max_rel_diff: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))
    branch: Mapped[str | None] = mapped_column(String(200))
    commit: Mapped[str | None] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    precision: Mapped[str | None] = mapped_column(String(8))
    activation_checkpointing: Mapped[str | None] = mapped_column(String(16))
    grad_accumulation_steps: Mapped[int | None] = mapped_column(Integer)
    micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    checks_failed: Mapped[str | None] = mapped_column(String(64), doc="As the run's (migration 0019).")
    checks_stated: Mapped[str | None] = mapped_column(String(64), doc="As the run's (migration 0019).")
    straggler: Mapped[bool | None] = mapped_column(Boolean, doc="As the run's (migration 0029).")

    __table_args__ = (
        # rank within a group (a count of the faster runs), best per config, the scaling page
        # (Postgres: covering the filter columns, so a filtered read of a group's range is index-only; migration 0013)
        Index("ix_leaderboard_entries_workload", "workload_key", "hardware_key", "tokens_per_s", postgresql_include=FILTERED),
        Index("ix_leaderboard_entries_shape", "shape_key", "hardware_key", "tokens_per_s", postgresql_include=FILTERED),
        # runs per config (strategy × world size within a group), and a config's runs by throughput
        Index(
            "ix_leaderboard_entries_config",
            "workload_key",
            "hardware_key",
            "strategy",
            "world_size",
            "strategy_options",  # migration 0025: options split configs
            "tokens_per_s",  # migration 0022: a key, so a rank's count between two marks is a range
            postgresql_include=["id", "model", "source", "branch", "user_id"],
        ),
        Index("ix_leaderboard_entries_user", "user_id"),
        # the filter menus' distinct values (a skip scan each)
        Index("ix_leaderboard_entries_source", "source"),
        Index("ix_leaderboard_entries_branch", "branch"),
        # the every-run board's default order (model, group, rank, id)
        Index("ix_leaderboard_entries_default", "model", "workload_key", "hardware_key", tokens_per_s.desc(), "id"),
        # a recipe config's runs by throughput (a page of every run grouped by shape or a recipe
        # dimension, sorted by runs per config; migration 0031)
        Index(
            "ix_leaderboard_entries_recipe_config",
            "shape_key",
            "hardware_key",
            "strategy",
            "world_size",
            "strategy_options",
            "precision",
            "activation_checkpointing",
            "grad_accumulation_steps",
            "micro_batch_size",
            tokens_per_s.desc(),
            "id",
        ),
    )


SORTED_COLUMNS = (
    "tokens_per_s",
    "mfu",
    "step_time_median_s",
    "peak_allocated_bytes_max",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "created_at",
    # migration 0012: the label columns the board also sorts by
    "strategy",
    "precision",
    "source",
    "branch",
)
"""The every-run board's sorts that have an index in each direction, in the board's whole order
(the column, nulls last; then model, workload, hardware, throughput descending, id): a page,
however deep, is an index-only scan, never a sort of every run. Other sorts sort the narrow rows."""

for _name in SORTED_COLUMNS:
    _column = getattr(LeaderboardEntry, _name)
    _tail: tuple[Any, ...] = (
        LeaderboardEntry.model,
        LeaderboardEntry.workload_key,
        LeaderboardEntry.hardware_key,
        *([LeaderboardEntry.tokens_per_s.desc()] if _name != "tokens_per_s" else []),  # tied on it already
        LeaderboardEntry.id,
    )
    # (SQLite has no NULLS LAST in an index: migration 0010 leaves it out there; embedded labs are small)
    _covered = [c for c in GROUPED if c != _name]
    Index(f"ix_leaderboard_entries_{_name}_desc", _column.desc().nulls_last(), *_tail, postgresql_include=_covered)
    Index(f"ix_leaderboard_entries_{_name}_asc", _column.asc().nulls_last(), *_tail, postgresql_include=_covered)


class ConfigColumns:
    """A config's key and attributes (the same for each of its runs), as each of the tables kept
    per config carries them, under a surrogate id (the rows are rewritten whenever one of the
    config's runs changes), first in each table's columns as in its migration."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, sort_order=-1)
    workload_key: Mapped[str] = mapped_column(String(64), sort_order=-1)
    hardware_key: Mapped[str | None] = mapped_column(String(200), sort_order=-1)
    strategy: Mapped[str] = mapped_column(String(32), sort_order=-1)
    world_size: Mapped[int] = mapped_column(Integer, sort_order=-1)
    strategy_options: Mapped[str] = mapped_column(String(200), default="", server_default="", doc="Migration 0025: options split configs.")
    model: Mapped[str] = mapped_column(String(64), sort_order=-1)
    shape_key: Mapped[str | None] = mapped_column(String(64), sort_order=-1)
    precision: Mapped[str | None] = mapped_column(String(8), sort_order=-1)
    activation_checkpointing: Mapped[str | None] = mapped_column(String(16), sort_order=-1)
    grad_accumulation_steps: Mapped[int | None] = mapped_column(Integer, sort_order=-1)
    micro_batch_size: Mapped[int | None] = mapped_column(Integer, sort_order=-1)


class LeaderboardCell(ConfigColumns, Base):
    """One (workload, hardware, strategy, world size) config over one subset of its runs: how many
    ranked runs it has, its best and median throughput — recomputed from `leaderboard_entries`
    whenever one of its runs changes, in the same transaction, so the best-per-config board never
    aggregates every run.

    A config has one cell per non-empty subset (`backend.store.leaderboard.SUBSETS`, migration
    0020): all its runs, those that passed their checks, those whose checks the lab made itself
    (none stated by an uploader), and both — so the board's check filters read cells too."""

    __tablename__ = "leaderboard_cells"

    runs: Mapped[int] = mapped_column(Integer)
    best_tokens_per_s: Mapped[float] = mapped_column(Float)
    # migration 0019: the config's figure — the median over its runs with its order-statistic
    # interval (`parallab.core.stats.median_ranks`) — and the run at the median that stands for it
    median_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    interval_low: Mapped[float | None] = mapped_column(Float)
    interval_high: Mapped[float | None] = mapped_column(Float)
    interval_coverage: Mapped[float | None] = mapped_column(Float)
    median_run_id: Mapped[str | None] = mapped_column(String(32))
    failed_runs: Mapped[int] = mapped_column(Integer, default=0, doc="Its runs that failed a correctness check.")
    stated_runs: Mapped[int] = mapped_column(Integer, default=0, doc="Its runs whose checks the uploader stated.")
    subset: Mapped[str] = mapped_column(String(16), default="all", server_default="all", doc="Which of the config's runs it counts.")
    # migration 0022: [throughput, runs faster than it] at evenly spaced positions of its runs
    # (`backend.store.leaderboard.rank_marks`), so a run's rank reads only the runs up to the next mark
    marks: Mapped[list[list[float]] | None] = mapped_column(JSON)
    # migration 0029: of the config's ranked runs (whatever the subset), those the straggler
    # analysis covered and those with a rank named, so a page flags its rows without counting runs
    straggler_runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    straggler_analysed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (UniqueConstraint("workload_key", "hardware_key", "strategy", "world_size", "strategy_options", "subset"),)


class LeaderboardCount(ConfigColumns, Base):
    """How many ranked runs of one config share one source, branch, uploader and pair of check
    outcomes (migration 0021): every count the every-run board plans a page from — group sizes,
    config sizes, the total — is a sum over these few thousand rows whatever the filters, never a
    count of the runs they keep. Rewritten with the config's cells, under the same lock."""

    __tablename__ = "leaderboard_counts"

    source: Mapped[str] = mapped_column(String(16))
    branch: Mapped[str | None] = mapped_column(String(200))
    user_id: Mapped[int | None] = mapped_column(Integer)
    checks_failed: Mapped[str | None] = mapped_column(String(64))
    checks_stated: Mapped[str | None] = mapped_column(String(64))
    runs: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_leaderboard_counts_config", "workload_key", "hardware_key", "strategy", "world_size"),)
