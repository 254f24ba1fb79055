"""The leaderboard's maintained table: one narrow row per ranked run (issue 12).

A run is ranked when it succeeded with a throughput and a workload key. Its row copies the
columns the leaderboard shows, filters and sorts on from `runs` — written in the same
transaction as the run's status (`backend.store.leaderboard.sync_entry`), removed with the run.
The leaderboard and the scaling page read only this table: a sort of 100,000 of these rows
reads a few MB, not the runs' specs and jobs.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base


class LeaderboardEntry(Base):
    __tablename__ = "leaderboard_entries"

    id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, doc="The run's id.")
    name: Mapped[str | None] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(32))
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

    __table_args__ = (
        # rank within a group (a count of the faster runs), best per config, the scaling page
        Index("ix_leaderboard_entries_workload", "workload_key", "hardware_key", "tokens_per_s"),
        Index("ix_leaderboard_entries_shape", "shape_key", "hardware_key", "tokens_per_s"),
        # runs per config (strategy × world size within a group)
        Index("ix_leaderboard_entries_config", "workload_key", "hardware_key", "strategy", "world_size"),
        Index("ix_leaderboard_entries_user", "user_id"),
    )
