"""API views of the fleet: workers and their pools."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class WorkerRead(BaseModel):
    """One worker: its host and pool, its devices, whether it is alive and what it runs now."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    host: str
    pool: str
    device: str
    device_name: str | None
    devices: int
    memory_per_device_bytes: int | None
    interconnect: str
    alive: bool
    run_id: str | None
    node_rank: int | None
    heartbeat_at: datetime
    started_at: datetime


class PoolRead(BaseModel):
    """One pool: its queue and how long it is, its hosts and what a job may ask of them."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    queue: str
    queue_length: int | None
    hosts: int
    alive: int
    busy: int
    devices_per_host: int
    memory_per_device_bytes: int | None


class WorkerList(BaseModel):
    items: list[WorkerRead]
    pools: list[PoolRead]
