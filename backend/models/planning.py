"""The planner's tables: each pool's calibrated hardware profile, and sweeps.

A sweep is the planner put to the test: the configurations it ranked, the ones it queued (the
runs carry `sweep_id`) and what each was predicted to do — kept as planned, so the page can hold
the measurement against the prediction that chose it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, JSONDoc, new_id, utcnow

SWEEP_STATUSES = ("running", "finished", "cancelled")


class HardwareProfileRow(Base):
    """What a `calibrate` run measured on a pool (`parallab.core.hardware.HardwareProfile`); the latest per pool is used."""

    __tablename__ = "hardware_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pool: Mapped[str] = mapped_column(String(100), index=True, doc="The worker pool (queue) it was measured on.")
    hardware_key: Mapped[str] = mapped_column(String(200), doc="As on runs: 'cpu:<model>' or 'cuda:<device name>'.")
    device_kind: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str | None] = mapped_column(String(200))
    world_size: Mapped[int] = mapped_column(Integer)
    profile: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Sweep(Base):
    """A planned set of runs of one workload: the top candidates by predicted tokens/s plus controls."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str] = mapped_column(String(64))
    world_size: Mapped[int] = mapped_column(Integer)
    request: Mapped[dict[str, Any]] = mapped_column(
        JSONDoc, doc="The sweep as asked for (workload, world size, top, controls, search space)."
    )
    hardware: Mapped[dict[str, Any]] = mapped_column(JSONDoc, doc="What the plan ran on: label, catalogue key, the profile used (if any).")
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSONDoc, doc="Every queued candidate: spec, role, prediction, run id.")
    planned: Mapped[int] = mapped_column(Integer, doc="Candidates the planner ranked (fitting and rejected).")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
