"""Runs, their result documents, per-rank rows, per-op communication rows and traces.

The columns that list pages and the leaderboard sort and filter on (tokens/s, peak memory,
MFU, workload key, hardware key) are denormalised onto `runs` and indexed — MLflow's
`latest_metrics` lesson. The document is kept as JSON in `run_results`, its heavy parts
(timeline, per-step arrays) compressed in `run_result_parts`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from backend.models.auth import User
from backend.models.base import Base, JSONDoc, new_id, utcnow

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
RunSource = Literal["form", "api", "cli", "ci"]
"""Where a run came from: the job form, the REST API, the `parallab` CLI, or an uploaded result (CI)."""
RUN_SOURCES: tuple[str, ...] = get_args(RunSource)
FINISHED_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    source: Mapped[str] = mapped_column(String(16), index=True, doc="form, api, cli or ci")
    spec: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    job: Mapped[dict[str, Any] | None] = mapped_column(
        JSONDoc, doc="The ResolvedJob, frozen at submission; the worker and ranks read it (null for CI uploads)."
    )
    error: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, doc="Latest progress line from rank 0.")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    idempotency_owner: Mapped[int | None] = mapped_column(
        Integer, doc="Whose Idempotency-Key this is: the uploading token's user (0: a token without one). Keys are unique per owner."
    )

    # Denormalised from spec/result for list pages and the leaderboard.
    strategy: Mapped[str] = mapped_column(String(32), index=True)
    strategy_options: Mapped[str] = mapped_column(
        String(200),
        default="",
        server_default="",
        doc="The strategy's options as measured (`backend.services.ingest.options_key`): a leaderboard config's part (migration 0025).",
    )
    world_size: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(64), index=True)
    workload_key: Mapped[str | None] = mapped_column(String(64), doc="Hash of what must match for runs to be ranked together.")
    hardware_key: Mapped[str | None] = mapped_column(String(200))
    branch: Mapped[str | None] = mapped_column(String(200))
    commit: Mapped[str | None] = mapped_column(String(80))
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    step_time_median_s: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    peak_allocated_bytes_max: Mapped[int | None] = mapped_column(BigInteger)
    comm_time_fraction: Mapped[float | None] = mapped_column(Float)
    loss_max_rel_diff: Mapped[float | None] = mapped_column(Float)
    # Accounts and CI series: who submitted or uploaded the run, the CI series it
    # belongs to, and the rest of the CI metadata of an upload (branch and commit are above).
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)
    series_id: Mapped[str | None] = mapped_column(ForeignKey("series.id", ondelete="SET NULL"))
    repository: Mapped[str | None] = mapped_column(String(500))
    pr: Mapped[int | None] = mapped_column(Integer)
    ci_url: Mapped[str | None] = mapped_column(String(500))
    # Communication no compute overlaps / step time (summary.exposed_comm_fraction)
    exposed_comm_fraction: Mapped[float | None] = mapped_column(Float)
    # The hash of the document first uploaded with `idempotency_key` (a replay must match it).
    idempotency_body_sha256: Mapped[str | None] = mapped_column(String(64))
    # The recipe dimensions, for the leaderboard's and compare page's filters, and the sweep a run belongs to.
    precision: Mapped[str | None] = mapped_column(String(8))
    activation_checkpointing: Mapped[str | None] = mapped_column(String(16))
    grad_accumulation_steps: Mapped[int | None] = mapped_column(Integer)
    micro_batch_size: Mapped[int | None] = mapped_column(Integer, doc="Sequences per forward on a rank (pp: per pipeline micro-batch).")
    sweep_id: Mapped[str | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), index=True)
    shape_key: Mapped[str | None] = mapped_column(String(64), doc="workload_key without the recipe: runs of every recipe of one workload.")
    checks_failed: Mapped[str | None] = mapped_column(
        String(64), doc="The correctness checks it failed (loss, gradient, replica; comma-separated), null when none did."
    )
    checks_stated: Mapped[str | None] = mapped_column(
        String(64), doc="Checks kept as the uploader stated them (`summary.checks_stated`, comma-separated), null when the lab made them."
    )
    straggler: Mapped[bool | None] = mapped_column(
        Boolean, doc="A rank was named a straggler (`summary.stragglers`); false: none stood out; null: not analysed (migration 0028)."
    )

    # Where it runs and who holds its lease (the worker's heartbeat is the lease).
    pool: Mapped[str | None] = mapped_column(String(64), index=True, doc="The pool it was queued on.")
    reproduces_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"),
        index=True,
        doc="The upload this lab run re-ran (`POST /runs/{id}/reproduce`, migration 0023); null for every other run.",
    )
    worker_id: Mapped[str | None] = mapped_column(
        String(32), doc="The worker that claimed it (node 0's); its heartbeat is the run's lease."
    )
    host: Mapped[str | None] = mapped_column(String(200), doc="node 0's host")

    user: Mapped[User | None] = relationship(lazy="selectin")
    result: Mapped[RunResult | None] = relationship(back_populates="run", cascade="all, delete-orphan", uselist=False)
    ranks: Mapped[list[RankMetric]] = relationship(back_populates="run", cascade="all, delete-orphan", order_by="RankMetric.rank")

    __table_args__ = (
        Index("ix_runs_leaderboard", "workload_key", "hardware_key", "tokens_per_s"),
        Index("ix_runs_status_created", "status", "created_at"),
        Index("ix_runs_shape_group", "shape_key", "hardware_key", "tokens_per_s"),
        # a series' latest runs, newest first (CI judging; migration 0014)
        Index("ix_runs_series_created", "series_id", "created_at", "id"),
        # an Idempotency-Key is its owner's: two users may use the same key (migration 0015)
        UniqueConstraint("idempotency_owner", "idempotency_key", name="uq_runs_idempotency_owner_key"),
    )


class RunResult(Base):
    """The whole result document of a finished run, and its size-capped traces."""

    __tablename__ = "run_results"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    schema_version: Mapped[int] = mapped_column(Integer)
    document: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="result")


class RunResultPart(Base):
    """A heavy part of a result document (its timeline, a per-step array of every rank), taken out
    of `run_results.document` and stored compressed (`backend.store.result_parts`): the pages that
    show a summary never read it."""

    __tablename__ = "run_result_parts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    part: Mapped[str] = mapped_column(String(32), primary_key=True, doc="the document key it came from")
    items: Mapped[int] = mapped_column(Integer, doc="how many items it holds (events, or steps over every rank)")
    data: Mapped[bytes] = mapped_column(LargeBinary, doc="its JSON, zlib-compressed")


class RankMetric(Base):
    __tablename__ = "rank_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    params_bytes: Mapped[int] = mapped_column(BigInteger)
    grads_bytes: Mapped[int] = mapped_column(BigInteger)
    optimizer_bytes: Mapped[int] = mapped_column(BigInteger)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    step_time_median_s: Mapped[float | None] = mapped_column(Float)
    comm_time_fraction: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="ranks")


class CommMetric(Base):
    __tablename__ = "comm_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    op: Mapped[str] = mapped_column(String(32))
    count: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    time_s: Mapped[float] = mapped_column(Float)
    busbw_gbps: Mapped[float | None] = mapped_column(Float)


class RunTrace(Base):
    """One rank's gzipped Chrome trace (size-capped), served for Perfetto."""

    __tablename__ = "run_traces"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunTag(Base):
    """One of a run's tags (written from its spec when stored, edited on the run page): a row each,
    so the runs list filters by tag on an index."""

    __tablename__ = "run_tags"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
