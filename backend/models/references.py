"""Reference loss curves shared by the whole lab.

The fp32 `single` curve of a workload, computed once by the first run that needed it and read by
every later run on any host (`workers.execute` copies it into the host's cache before launching).
Keyed by `parallab.core.reference.reference_key` — the sha256 of the reference's workload block,
seed and fp32 recipe included (MoE adds its routing groups and aux weight) — and by the device kind
it was computed on: a CPU's fp32 kernels and a GPU's sum in different orders, and how far their
curves drift apart against fp32's 1e-5 tolerance is not measured here, so they are not mixed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, JSONDoc, utcnow


class ReferenceCurve(Base):
    __tablename__ = "reference_curves"

    key: Mapped[str] = mapped_column(String(64), primary_key=True, doc="parallab.core.reference.reference_key (sha256 hex).")
    device: Mapped[str] = mapped_column(String(16), primary_key=True, doc="The device kind it was computed on: 'cpu' or 'cuda'.")
    model: Mapped[str] = mapped_column(String(64), doc="The workload's preset (for people reading the table).")
    seed: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer, doc="Length of the curve.")
    workload: Mapped[dict[str, Any]] = mapped_column(
        JSONDoc, doc="The reference's workload block (fp32, no recomputation, no accumulation)."
    )
    loss: Mapped[list[float]] = mapped_column(JSONDoc, doc="The loss of each measured step.")
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), doc="The run that computed it.")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
