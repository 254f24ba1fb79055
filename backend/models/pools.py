"""Pools that are declared rather than registered, and the runs an outside scheduler holds.

A `celery` pool exists because its workers register (backend.models.workers). A `slurm` pool has
no worker: an admin declares it with the settings every `sbatch` of its jobs carries, and its
`parallab slurm-agent` submits the pool's queued runs. Each submitted run gets an `EngineJob`: the
scheduler's job id, its state and reason as last seen, and where its output goes, so the agent
(or a restarted one) knows what it submitted and the run page can say where the job stands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, JSONDoc, utcnow


class Pool(Base):
    """A declared pool: its kind and its settings (`parallab.core.pools.SlurmPool` for `slurm`)."""

    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    settings: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class EngineJob(Base):
    """A run as an outside scheduler holds it (one per run: a run is submitted once)."""

    __tablename__ = "engine_jobs"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    engine: Mapped[str] = mapped_column(String(16), doc="slurm")
    pool: Mapped[str] = mapped_column(String(64), index=True)
    job_id: Mapped[str] = mapped_column(String(64), doc="The scheduler's job id (Slurm's, as sbatch printed it).")
    state: Mapped[str] = mapped_column(String(32), doc="The scheduler's state as last seen (PENDING, RUNNING, COMPLETED, ...).")
    reason: Mapped[str | None] = mapped_column(Text, doc="The scheduler's reason (Resources, Priority, ...), when it gives one.")
    nodes: Mapped[str | None] = mapped_column(String(1000), doc="The job's node list, once it has one.")
    output: Mapped[str | None] = mapped_column(String(1000), doc="The job's output file on the cluster's shared filesystem.")
    submitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished: Mapped[bool] = mapped_column(Boolean, default=False, doc="The agent is done with it (its run ended; nothing more to watch).")
