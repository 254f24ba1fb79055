"""The fleet: workers that registered (and keep heartbeating), and the nodes each run occupies.

A worker's heartbeat is the one liveness signal: a run's lease is held by the
worker that claimed it and lapses when that worker stops heartbeating; a reservation of hosts for
a multi-node job is a set of worker rows pointing at the run, taken all-or-nothing in one
transaction. Both live in the database, not in Redis, because they must change atomically with
the run's own status (queued → running → finished) and survive a broker restart; Redis stays a
queue.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, JSONDoc, utcnow

NODE_STATUSES = ("reserved", "running", "succeeded", "failed", "stopped", "lost", "released")
"""reserved: held for the run, not started yet; running: its ranks run; succeeded/failed/stopped:
its ranks ended (stopped: by a cancel, a limit or another node's fault); lost: its worker died;
released: never started (the run ended first)."""
FINAL_NODE_STATUSES = frozenset({"succeeded", "failed", "stopped", "lost", "released"})


class Worker(Base):
    """One `parallab worker` process: a host of a pool, and what it runs now."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, doc="Chosen by the worker at start-up (a new one each start).")
    host: Mapped[str] = mapped_column(String(200), index=True, doc="The host it stands for (PARALLAB_WORKER_HOST, default the hostname).")
    machine: Mapped[str] = mapped_column(
        String(200), doc="The kernel it runs on (hostname + boot id): where its process groups mean something."
    )
    address: Mapped[str] = mapped_column(String(200), doc="Where other hosts reach it (the rendezvous endpoint when it leads a job).")
    pid: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(64), index=True)
    device: Mapped[str] = mapped_column(String(16), doc="cpu or cuda")
    device_name: Mapped[str | None] = mapped_column(String(200))
    device_count: Mapped[int] = mapped_column(
        Integer, doc="Ranks one node of a job may run here (GPUs; on CPU, the configured rank slots)."
    )
    memory_per_device_bytes: Mapped[int | None] = mapped_column(BigInteger)
    interconnect: Mapped[str] = mapped_column(String(32), doc="nvlink, pcie or cpu: how this host's devices talk to each other.")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True, doc="The run it holds (reserved for or running), if any."
    )
    node_rank: Mapped[int | None] = mapped_column(Integer)
    reserved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RunNode(Base):
    """One host's part of a run: its worker, its ranks' process group, and (for nodes other than
    node 0) the rank records it hands to node 0, which merges them into the one result."""

    __tablename__ = "run_nodes"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(32), index=True)
    host: Mapped[str] = mapped_column(String(200))
    machine: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str | None] = mapped_column(String(260), doc="The c10d rendezvous endpoint (node 0's address:port).")
    pgid: Mapped[int | None] = mapped_column(Integer, doc="The ranks' process group on `machine` while they may be alive.")
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    records: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONDoc, doc="This node's RankRecords (nodes other than 0).")
    reserved_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
