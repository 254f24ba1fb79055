"""`GET /metrics`: this process's registry (backend.metrics) and the fleet's state, read at scrape time.

A scrape never fails because the database or the broker is down: what could not be read is left
out and `parallab_database_up` / `parallab_broker_up` say 0 (the counters of this process are still
worth having then).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.metrics import REGISTRY, gauge_lines, histogram_lines
from backend.models import RUN_STATUSES
from backend.services import workers as fleet
from backend.store import metrics as store

log = logging.getLogger(__name__)

JOB_BUCKETS: tuple[float, ...] = (5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)
"""Seconds: a tiny job on CPU takes seconds, a GPU benchmark tens of minutes."""


def render(*, session: Session, settings: Settings, queue_lengths: Callable[[list[str]], dict[str, int | None]]) -> str:
    """Every metric in Prometheus' text format (version 0.0.4)."""
    lines = list(REGISTRY.render())
    database_up, broker_up = 1, 1
    try:
        by_status = store.runs_by_status(session)
        durations = store.job_durations(session, JOB_BUCKETS)
        pools = fleet.fleet(session=session, settings=settings, queue_lengths=queue_lengths)
    except SQLAlchemyError as exc:
        log.warning("metrics: the database is unavailable: %s", exc)
        session.rollback()
        database_up = 0
    else:
        lines += gauge_lines("parallab_runs", "Runs by status.", ("status",), [((s,), by_status.get(s, 0)) for s in RUN_STATUSES])
        lines += [
            "# HELP parallab_job_duration_seconds Started to finished, of runs a worker ran, by final status.",
            "# TYPE parallab_job_duration_seconds histogram",
        ]
        for status in sorted(durations):
            cumulative, total, count = durations[status]
            lines += histogram_lines("parallab_job_duration_seconds", ("status",), (status,), JOB_BUCKETS, cumulative, total, count)
        lines += gauge_lines(
            "parallab_workers",
            "Registered workers by pool, alive or dead (silent past the TTL).",
            ("pool", "state"),
            [((p.name, state), n) for p in pools for state, n in (("alive", p.alive), ("dead", len(p.workers) - p.alive))],
        )
        lines += gauge_lines("parallab_workers_alive", "Live workers in all pools.", (), [((), sum(p.alive for p in pools))])
        known = [p for p in pools if p.queue_length is not None]
        broker_up = 0 if pools and not known else 1
        lines += gauge_lines(
            "parallab_queue_length", "Messages waiting in each pool's queue.", ("pool",), [((p.name,), p.queue_length or 0) for p in known]
        )
    lines += gauge_lines("parallab_database_up", "1 if this scrape could read the database.", (), [((), database_up)])
    lines += gauge_lines(
        "parallab_broker_up", "1 if this scrape could read the broker's queues (or had none to read).", (), [((), broker_up)]
    )
    return "\n".join(lines) + "\n"
