"""The upload pool: a few threads beside the event loop, with a bounded queue in front of them.

Uploads are CPU-bound under one GIL, so each API process stores only `upload_concurrency` at once
(more would only slow the event loop's turn). Those waiting for a thread hold nothing: no database
connection (the route gives back the one its token check used before it queues), no thread. The
wait is bounded: at most `upload_queue` uploads wait per process, and one more is refused at once
with 503 and `Retry-After`, which a CI client retries under the same Idempotency-Key. Under a burst
of uploads the server thus answers every request within one queue's worth of work, instead of
letting requests pile up until their database pool's timeout turns them into 500s.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from backend.services.errors import DomainError

T = TypeVar("T")


class UploadsBusy(DomainError):
    """Every upload thread is busy and the queue is full: answered 503 with Retry-After."""

    status_code = 503

    def __init__(self, *, waiting: int, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(
            f"the server is storing other uploads ({waiting} waiting); retry in {retry_after_s} s with the same Idempotency-Key"
        )

    def http_headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)}


class UploadPool:
    """`threads` upload threads and room for `queue` waiting uploads; the rest are refused at once."""

    def __init__(self, *, threads: int, queue: int) -> None:
        self.threads, self.queue = threads, queue
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="parallab-upload")
        self._lock = threading.Lock()
        self._admitted = 0
        """Uploads running or waiting in the executor; released when the work ends (or is cancelled
        before it starts), not when the caller stops waiting, so a client that hangs up mid-upload
        still counts until its thread is free again."""

    @property
    def admitted(self) -> int:
        return self._admitted

    def _release(self, _: Future) -> None:
        with self._lock:
            self._admitted -= 1

    async def run(self, work: Callable[[], T], *, retry_after_s: int) -> T:
        """`work()` on an upload thread (with the caller's context variables); `UploadsBusy` if the queue is full."""
        with self._lock:
            if self._admitted >= self.threads + self.queue:
                raise UploadsBusy(waiting=self._admitted - self.threads, retry_after_s=retry_after_s)
            self._admitted += 1
        try:
            future = self.executor.submit(contextvars.copy_context().run, work)
        except BaseException:
            with self._lock:
                self._admitted -= 1
            raise
        future.add_done_callback(self._release)
        return await asyncio.wrap_future(future)


_POOLS: dict[tuple[int, int], UploadPool] = {}
_POOLS_LOCK = threading.Lock()


def upload_pool(*, threads: int, queue: int) -> UploadPool:
    """This process's upload pool for these settings (`upload_concurrency`, `upload_queue`)."""
    with _POOLS_LOCK:
        if (threads, queue) not in _POOLS:
            _POOLS[threads, queue] = UploadPool(threads=threads, queue=queue)
        return _POOLS[threads, queue]
