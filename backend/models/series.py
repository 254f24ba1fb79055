"""CI benchmark series and their regression verdicts.

A series is one benchmark's history: the same workload, strategy and options, and hardware,
from one repository, on one branch. Series that differ only in branch form a *family*; a
series' baseline is the last `window` results of the family's series on `baseline_branch`.
Each result on a series gets one verdict per metric, kept with the band it was judged
against, so the history page draws what was decided at the time. A regressed verdict is an
alert; dismissing it as a false positive is kept on the row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, JSONDoc, utcnow

VERDICTS = ("improved", "unchanged", "regressed", "no_baseline")


class Series(Base):
    __tablename__ = "series"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, doc="Hash of the family and the branch: stable, so CI can link to it.")
    family: Mapped[str] = mapped_column(String(32), doc="Hash of everything but the branch.")
    repository: Mapped[str | None] = mapped_column(String(500))
    branch: Mapped[str] = mapped_column(String(200))
    workload_key: Mapped[str] = mapped_column(String(64))
    hardware_key: Mapped[str] = mapped_column(String(200))
    strategy: Mapped[str] = mapped_column(String(32))
    world_size: Mapped[int] = mapped_column(Integer)
    options: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    model: Mapped[str] = mapped_column(String(64))
    label: Mapped[str] = mapped_column(String(300), doc="A readable name of the workload (preset, shape, batch, precision).")
    # How new results are judged (per series; defaults in services.regression.DEFAULTS).
    test: Mapped[str] = mapped_column(String(16), doc="t_test or mad.")
    window: Mapped[int] = mapped_column(Integer, doc="K: how many of the latest baseline results form the baseline.")
    baseline_branch: Mapped[str] = mapped_column(String(200))
    alpha: Mapped[float] = mapped_column(Float, doc="t_test: one-sided significance level.")
    mad_k: Mapped[float] = mapped_column(Float, doc="mad: the band is median ± k·MAD (MAD scaled to σ for normal noise).")
    min_change: Mapped[float] = mapped_column(Float, doc="Relative changes smaller than this are never flagged, whatever the test says.")
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), doc="The owner: whose upload started it. Only the owner or an admin changes it."
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, doc="When its latest result came.")

    __table_args__ = (Index("ix_series_family_branch", "family", "branch"),)


class SeriesVerdict(Base):
    """One metric of one result on a series, judged against that series' baseline at the time."""

    __tablename__ = "series_verdicts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    series_id: Mapped[str] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    metric: Mapped[str] = mapped_column(String(32))
    value: Mapped[float] = mapped_column(Float)
    verdict: Mapped[str] = mapped_column(String(16), doc="improved, unchanged, regressed or no_baseline.")
    change: Mapped[float | None] = mapped_column(Float, doc="(value − baseline centre) / baseline centre.")
    baseline_center: Mapped[float | None] = mapped_column(Float, doc="Mean (t_test) or median (mad) of the baseline.")
    lower: Mapped[float | None] = mapped_column(Float, doc="The band: values below it are flagged (improved or regressed by direction).")
    upper: Mapped[float | None] = mapped_column(Float)
    baseline_n: Mapped[int] = mapped_column(Integer)
    baseline_branch: Mapped[str] = mapped_column(String(200))
    test: Mapped[str] = mapped_column(String(16))
    threshold: Mapped[float] = mapped_column(Float, doc="alpha for t_test, k for mad.")
    p_value: Mapped[float | None] = mapped_column(Float, doc="t_test: one-sided p-value in the worse direction.")
    dismissed: Mapped[bool] = mapped_column(Boolean, default=False, doc="An alert marked a false positive.")
    dismissed_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    dismissed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dismiss_note: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("run_id", "metric", name="uq_series_verdicts_run_metric"),
        Index("ix_series_verdicts_series_metric", "series_id", "metric"),
    )


class SeriesCounters(Base):
    """The exact counters of one result on a series (`parallab.core.counters`), and how they differ
    from the baseline result's: the result it was compared with and every change, with its size."""

    __tablename__ = "series_counters"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    series_id: Mapped[str] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"))
    config_key: Mapped[str] = mapped_column(
        String(64), doc="Hash of the workload, strategy, options and hardware: only equal keys compare."
    )
    counters: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    baseline_run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), doc="The baseline series' latest result of the same config at upload (None: first)."
    )
    changes: Mapped[list[dict[str, Any]]] = mapped_column(JSONDoc, doc="[{counter, category, old, new, delta, change_pct}] by counter.")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (Index("ix_series_counters_series_config", "series_id", "config_key", "created_at"),)


class SeriesAccept(Base):
    """An intended change of one counter to one value, accepted for a series' family: a result whose
    counter changed to this value is no longer reported as changed."""

    __tablename__ = "series_accepts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    family: Mapped[str] = mapped_column(String(32), index=True)
    series_id: Mapped[str] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"), doc="The series it was accepted on.")
    counter: Mapped[str] = mapped_column(String(200))
    value: Mapped[float] = mapped_column(Float, doc="The counter's new value that is intended.")
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (UniqueConstraint("family", "counter", "value", name="uq_series_accepts_family_counter_value"),)
