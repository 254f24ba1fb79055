"""One node's watch over its run while its ranks run.

Each poll of the launcher asks `Watcher.should_stop`; at most once a second that reads the run and
its nodes through the ledger (`parallab.core.ledger.Ledger.gang`), and renews this worker's
heartbeat — the run's lease — while it watches. The ranks stop when the run is cancelled, when it ended elsewhere (reconciled as lost),
when another node failed, lost its worker or (node 0) did not start in time. A database blip
never stops the ranks: the read is skipped and tried again; if the blip outlasts the lease, the
run is failed as lost by someone else and this node stops when it can read again.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from parallab.core.ledger import GangState, Ledger, WorkerInfo

log = logging.getLogger(__name__)


class Watcher:
    """The callbacks the launcher calls for one node of one run."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        run_id: str,
        node_rank: int,
        me: WorkerInfo,
        reservation_timeout_s: float,
        heartbeat_s: float,
        poll_s: float = 1.0,
    ):
        """`reservation_timeout_s`: how long node 0 waits for another node to start its part;
        `heartbeat_s`: how often the lease is renewed while watching."""
        self.ledger, self.run_id, self.node_rank, self.me = ledger, run_id, node_rank, me
        self.reservation_timeout_s, self.heartbeat_s, self.poll_s = reservation_timeout_s, heartbeat_s, poll_s
        self._next_poll = 0.0
        self._next_beat = 0.0
        self.stop_reason: str | None = None
        """Why this watcher stopped the ranks (None: they ended by themselves)."""
        self.cancelled = False

    def started(self, pgid: int) -> None:
        """Record the ranks' process group on this node, so a worker of this machine can kill it if we die."""
        try:
            self.ledger.record_pgid(self.run_id, self.node_rank, pgid)
        except Exception as exc:
            log.warning("could not record process group %s of run %s: %s", pgid, self.run_id, exc)

    def progress(self, line: dict[str, Any]) -> None:
        try:
            self.ledger.progress(self.run_id, line)
        except Exception as exc:
            log.warning("could not store progress of run %s: %s", self.run_id, exc)

    def should_stop(self) -> str | None:
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + self.poll_s
        try:
            beat = now >= self._next_beat
            state = self.ledger.gang(self.run_id, self.me if beat else None)
            if beat:
                self._next_beat = now + self.heartbeat_s
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
        return stop_reason(state, self.node_rank, self.reservation_timeout_s)


def stop_reason(state: GangState | None, node_rank: int, reservation_timeout_s: float) -> str | None:
    """Why node `node_rank` of a run must stop now, given the run's state; None to go on."""
    if state is None:
        return "the run was deleted"
    if state.cancel_requested:
        return "cancelled"
    if state.status != "running":
        return f"the run ended ({state.status}) elsewhere"
    deadline = datetime.now(timezone.utc) - timedelta(seconds=reservation_timeout_s)
    for node in state.nodes:
        if node.node_rank == node_rank:
            continue
        where = f"node {node.node_rank} (host {node.host})"
        if node.status in ("failed", "lost", "stopped"):
            return f"{where} {node.status}: {node.reason or 'no reason given'}"
        if node.status in ("reserved", "running") and not node.alive:
            return f"worker lost on {where}: it stopped heartbeating"
        if node_rank == 0 and node.status == "reserved" and node.reserved_at < deadline:
            return f"{where} did not start its part within {reservation_timeout_s:.0f} s"
    return None
