"""The API's lease keeper: every `lease_check_s` (default half the worker TTL) it fails the runs
whose worker stopped heartbeating ("worker lost").

Workers reconcile too, but a lab whose only worker died has none left to do it, and reading
/workers is not something anybody should have to remember. A lease lapses `worker_ttl_s` after
the last heartbeat, and this loop sees it at most half a TTL later: the run has ended within
1.5 × TTL. Every API process runs the loop; `reconcile_lost_runs` locks and re-checks each run,
so two processes never end one run twice. The database work runs in a thread (no blocking on the
event loop); a failure is logged and retried at the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from backend.config import Settings
from backend.db import session_scope
from backend.services import workers as fleet

log = logging.getLogger(__name__)


def period_s(settings: Settings) -> float:
    """Seconds between two rounds (0: the loop is off)."""
    return settings.worker.worker_ttl_s / 2 if settings.worker.lease_check_s is None else settings.worker.lease_check_s


def reconcile_once(settings: Settings) -> list[str]:
    """One round: the ids of the runs it failed."""
    with session_scope(settings.sqlalchemy_url) as session:
        lost = fleet.reconcile_lost_runs(session=session, settings=settings)
    if lost:
        log.warning("runs whose worker was lost (lease lapsed): %s", ", ".join(lost))
    return lost


async def keep_leases(settings: Settings) -> None:
    every = period_s(settings)
    while True:
        await asyncio.sleep(every)
        try:
            await asyncio.to_thread(reconcile_once, settings)
        except Exception:
            log.exception("lease check failed; trying again in %.0f s", every)


@contextlib.asynccontextmanager
async def lease_keeper(settings: Settings) -> AsyncIterator[None]:
    """Run `keep_leases` for as long as the app serves (not at all when `lease_check_s` is 0)."""
    task = asyncio.create_task(keep_leases(settings)) if period_s(settings) > 0 else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
