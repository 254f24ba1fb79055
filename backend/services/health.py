"""`/healthz`: whether this API process can reach what it serves from — the database (every page
and route) and the broker (every submission) — each "ok" or the error, so a load balancer or
compose's healthcheck takes a process whose Postgres or Redis is down out of service (503) rather
than sending it requests that would each fail.

The checks run on a small pool of their own, each bounded by `health_timeout_s`: a database that
hangs answers "timed out" in that time, and a request pool saturated by uploads does not hold the
health check behind it. Errors are shown shortened (`redact.strip_paths`): the route is public.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import redis
from kombu import Connection
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from backend.config import Settings
from backend.services.redact import strip_paths

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="healthz")
OK = "ok"
FRESH_S = 1.0
"""How long one answer stands: a load balancer polling every process often costs one check a second each."""
_last: dict[tuple[str, str], tuple[float, tuple[int, dict[str, str]]]] = {}


@lru_cache(maxsize=8)
def _engine(url: str) -> Engine:
    """An engine of its own, without a pool: the check opens a fresh connection (what a new request
    would need), and never waits behind the requests holding the pool's connections."""
    return create_engine(url, poolclass=NullPool)


def database(settings: Settings) -> str:
    """ "ok", or why the database did not answer `SELECT 1`."""
    with _engine(settings.sqlalchemy_url).connect() as conn:
        conn.execute(text("SELECT 1"))
    return OK


def broker(settings: Settings) -> str:
    """ "ok", or why the broker did not answer: a PING to Redis, else a connection through kombu."""
    url, timeout = settings.celery_broker_url, settings.server.health_timeout_s
    if url.startswith(("redis://", "rediss://")):
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
        return OK
    with Connection(url, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1)
    return OK


def _why(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return strip_paths(f"{type(exc).__name__}: {first}"[:300])


async def _check(name: str, check: Any, settings: Settings) -> tuple[str, str]:
    loop = asyncio.get_running_loop()
    try:
        return name, await asyncio.wait_for(loop.run_in_executor(_POOL, check, settings), settings.server.health_timeout_s)
    except TimeoutError:
        return name, f"timed out after {settings.server.health_timeout_s:g} s"
    except Exception as exc:  # any failure to answer is the answer
        return name, _why(exc)


async def health(settings: Settings) -> tuple[int, dict[str, str]]:
    """(HTTP status, body): 200 with each part "ok", or 503 naming what is down and why (an answer
    of the last `FRESH_S` for the same database and broker stands)."""
    key = (settings.sqlalchemy_url, settings.celery_broker_url)
    if (last := _last.get(key)) is not None and time.monotonic() - last[0] < FRESH_S:
        return last[1]
    parts = dict(await asyncio.gather(_check("database", database, settings), _check("broker", broker, settings)))
    healthy = all(v == OK for v in parts.values())
    answer = (200 if healthy else 503), {"status": OK if healthy else "unavailable", **parts}
    _last[key] = (time.monotonic(), answer)
    return answer
