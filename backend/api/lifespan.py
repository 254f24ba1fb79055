"""Start-up: the placeholder secret is refused wherever the app starts off loopback, and the
env-seeded admin of a compose deployment is created.

Compose runs uvicorn directly (not `parallab up`), so the app checks for itself. A lab's
`PARALLAB_HOST` already says it is not local: start-up fails at once. Otherwise the real bind
decides — but uvicorn runs the lifespan before it binds its socket, so when this process is not
listening yet a short watch follows it: as soon as it listens beyond loopback, the process exits
with the message (SystemExit out of the event loop: uvicorn stops, its exit status is 1). Until
then, and wherever the watch cannot see, `security` answers every request with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import AsyncIterator

from fastapi import FastAPI

from backend.api.bind import network_listeners, nodelay_listeners
from backend.api.leases import lease_keeper
from backend.api.security import settings_for
from backend.config import PLACEHOLDER_SECRET, Settings

log = logging.getLogger(__name__)

WATCH_S = 15.0


def placeholder_message(where: str) -> str:
    return (
        f"PARALLAB_SECRET_KEY still holds its placeholder {PLACEHOLDER_SECRET!r} and this server is {where}: "
        "set a real secret (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`) or bind to 127.0.0.1"
    )


async def _watch_bind() -> None:
    """Exit the process if it starts listening beyond loopback (polled, backing off, for WATCH_S)."""
    waited, delay = 0.0, 0.02
    while waited < WATCH_S:
        await asyncio.sleep(delay)
        waited += delay
        exposed = network_listeners(fresh=True)
        if exposed:
            message = placeholder_message(f"listening on {', '.join(exposed)}")
            log.critical(message)
            raise SystemExit(message)
        delay = min(delay * 2, 1.0)


def seed_admin(settings: Settings) -> None:
    """The admin named by PARALLAB_ADMIN_EMAIL / PARALLAB_ADMIN_PASSWORD, created once (read at start-up)."""
    if not (settings.security.admin_email and settings.security.admin_password):
        return
    from sqlalchemy.exc import IntegrityError

    from backend.db import session_scope
    from backend.services import auth

    try:
        with session_scope(settings.sqlalchemy_url) as session:
            created = auth.seed_admin(
                session=session, email=settings.security.admin_email, password=settings.security.admin_password.get_secret_value()
            )
    except IntegrityError:
        # `uvicorn --workers N` starts N processes at once: another one created the admin between
        # this one's look-up and its insert (the email is unique). Nothing is left to do.
        return
    if created:
        log.warning(
            "created the admin %s from PARALLAB_ADMIN_EMAIL; change its password after the first login", settings.security.admin_email
        )


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = settings_for({"app": app})
    watch: asyncio.Task[None] | None = None
    if settings.security.secret_key == PLACEHOLDER_SECRET:
        if not settings.local_mode:
            raise RuntimeError(placeholder_message(f"configured for {settings.server.host} (PARALLAB_HOST)"))
        exposed = network_listeners(fresh=True)
        if exposed:
            raise RuntimeError(placeholder_message(f"listening on {', '.join(exposed)}"))
        watch = asyncio.create_task(_watch_bind())
    seed_admin(settings)
    # Answers leave at once, not after the client's delayed ACK (uvicorn --workers N: bind.nodelay_listeners).
    nodelay_listeners()
    # Upload threads are CPU-bound: a shorter GIL slice lets the event loop's thread
    # answer between their bytecodes instead of waiting 5 ms at each socket call.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(settings.server.gil_switch_interval_ms / 1000)
    # Everything made so far lives as long as the process: frozen, the collector's gen-2 passes
    # (one C call holding the GIL) walk only what requests made since.
    if settings.server.gc_freeze:
        gc.freeze()
    try:
        async with lease_keeper(settings):
            yield
    finally:
        sys.setswitchinterval(switch_interval)
        if settings.server.gc_freeze:
            gc.unfreeze()
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await watch
