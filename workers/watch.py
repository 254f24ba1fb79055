"""One node's watch over its run while its ranks run.

Each poll of the launcher asks `Watcher.should_stop`; at most once a second that reads the run and
its nodes from the database, and renews this worker's heartbeat — the run's lease — while it
watches. The ranks stop when the run is cancelled, when it ended elsewhere (reconciled as lost),
when another node failed, lost its worker or (node 0) did not start in time. A database blip
never stops the ranks: the read is skipped and tried again; if the blip outlasts the lease, the
run is failed as lost by someone else and this node stops when it can read again.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from backend.config import Settings
from backend.db import session_scope
from backend.models import utcnow
from backend.services import workers as fleet
from backend.services.workers import GangState, WorkerInfo
from backend.store import runs as run_store
from backend.store import workers as store

log = logging.getLogger(__name__)


class Watcher:
    """The callbacks the launcher calls for one node of one run."""

    def __init__(self, settings: Settings, *, run_id: str, node_rank: int, me: WorkerInfo, poll_s: float = 1.0):
        self.settings, self.run_id, self.node_rank, self.me = settings, run_id, node_rank, me
        self.poll_s = poll_s
        self._next_poll = 0.0
        self._next_beat = 0.0
        self.stop_reason: str | None = None
        """Why this watcher stopped the ranks (None: they ended by themselves)."""
        self.cancelled = False

    def _db(self) -> Any:
        return session_scope(self.settings.sqlalchemy_url)

    def started(self, pgid: int) -> None:
        """Record the ranks' process group on this node, so a worker of this machine can kill it if we die."""
        try:
            with self._db() as session:
                store.set_node_pgid(session, self.run_id, self.node_rank, pgid)
        except Exception as exc:
            log.warning("could not record process group %s of run %s: %s", pgid, self.run_id, exc)

    def progress(self, line: dict[str, Any]) -> None:
        try:
            with self._db() as session:
                run_store.set_progress(session, self.run_id, line)
        except Exception as exc:
            log.warning("could not store progress of run %s: %s", self.run_id, exc)

    def should_stop(self) -> str | None:
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + self.poll_s
        try:
            with self._db() as session:
                if now >= self._next_beat:
                    fleet.heartbeat(session=session, info=self.me)
                    self._next_beat = now + self.settings.heartbeat_s
                state = fleet.gang_state(session=session, run_id=self.run_id, settings=self.settings)
        except Exception as exc:
            log.warning("could not read run %s (the ranks go on): %s", self.run_id, exc)
            return None
        reason = self.reason(state)
        if reason is not None:
            self.stop_reason = reason
            self.cancelled = reason == "cancelled"
        return reason

    def reason(self, state: GangState | None) -> str | None:
        """Why this node must stop now, given the run's state; None to go on."""
        if state is None:
            return "the run was deleted"
        if state.cancel_requested:
            return "cancelled"
        if state.status != "running":
            return f"the run ended ({state.status}) elsewhere"
        deadline = utcnow() - timedelta(seconds=self.settings.reservation_timeout_s)
        for node in state.nodes:
            if node.node_rank == self.node_rank:
                continue
            where = f"node {node.node_rank} (host {node.host})"
            if node.status in ("failed", "lost", "stopped"):
                return f"{where} {node.status}: {node.reason or 'no reason given'}"
            if node.status in ("reserved", "running") and not node.alive:
                return f"worker lost on {where}: it stopped heartbeating"
            if self.node_rank == 0 and node.status == "reserved" and node.reserved_at < deadline:
                return f"{where} did not start its part within {self.settings.reservation_timeout_s:.0f} s"
        return None
