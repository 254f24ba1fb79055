"""Local mode, decided from where this process is actually listening — not from a setting alone.

Local mode (submit and browse without logging in) is safe only while nothing but this host can
connect. `uvicorn backend.api.app:app --host 0.0.0.0` must not serve the network without login
even though `PARALLAB_HOST` still says 127.0.0.1, so a request is served in local mode only when
all three agree:

1. the settings ask for it (`PARALLAB_HOST` is a loopback address: a lab sets it to 0.0.0.0 or
   its own name, which turns local mode off whatever the bind);
2. the connection arrived on a loopback address (ASGI's `scope["server"]`, the socket's own
   address as the server reports it);
3. every TCP socket this process listens on is bound to a loopback address (read from the OS
   with psutil, cached a few seconds): a 0.0.0.0 bind turns local mode off even for requests that
   arrive through 127.0.0.1, e.g. from a reverse proxy on the same host.

A process with no listening socket at all (an in-process test client) serves no network, so 2
and 3 have nothing to refuse. A Unix-socket bind behind a proxy is the one case these checks can't
see through; the Host check (`security`) still refuses any proxied name but a loopback one, and a
lab sets `PARALLAB_HOST` to its own address anyway.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from typing import Any

from backend.config import Settings

log = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
LISTENERS_TTL_S = 5.0


def is_loopback(host: str) -> bool:
    """True for a loopback IP address (127.0.0.0/8, ::1) or the name `localhost`."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class _Listeners:
    """This process's listening TCP addresses, re-read from the OS at most every few seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -LISTENERS_TTL_S
        self._hosts: tuple[str, ...] | None = ()

    def hosts(self, *, fresh: bool = False) -> tuple[str, ...] | None:
        """The addresses, or None when the OS won't say (then only the connection's address counts)."""
        with self._lock:
            now = time.monotonic()
            if fresh or now - self._at > LISTENERS_TTL_S:
                self._hosts, self._at = _read_listeners(), now
            return self._hosts


def _read_listeners() -> tuple[str, ...] | None:
    import psutil

    try:
        conns = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError, NotImplementedError) as exc:  # pragma: no cover - platform dependent
        log.warning("cannot read this process's listening sockets (%s); local mode relies on each connection's address", exc)
        return None
    return tuple(sorted({c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}))


LISTENERS = _Listeners()


def network_listeners(*, fresh: bool = False) -> list[str]:
    """The addresses this process listens on that are reachable beyond this host."""
    return [h for h in LISTENERS.hosts(fresh=fresh) or () if not is_loopback(h)]


def nodelay_listeners() -> int:
    """Set TCP_NODELAY on the TCP sockets this process already listens on; returns how many.

    `uvicorn --workers N` (compose deploys 2) binds its socket in the parent with
    `socket.socket(family)`, whose `proto` is 0, and asyncio only sets TCP_NODELAY on accepted
    sockets whose `proto` is IPPROTO_TCP: every connection a worker accepts keeps Nagle's
    algorithm. uvicorn writes a response's head and body in two sends, so the body waited for the
    client's delayed ACK of the head: 40 ms per answer on Linux (`/healthz` p50 46 ms with 2
    processes, 5 ms with 1). Linux copies TCP_NODELAY from the listening socket to each
    socket it accepts. With one process uvicorn binds after the lifespan (asyncio's own socket,
    whose connections get TCP_NODELAY): nothing is listening yet and this sets nothing."""
    import os
    import socket

    import psutil

    try:
        conns = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError, NotImplementedError):  # pragma: no cover - platform dependent
        return 0
    done = 0
    for c in conns:
        if c.status != psutil.CONN_LISTEN or c.fd is None or c.fd < 0:
            continue
        try:
            with socket.socket(fileno=os.dup(c.fd)) as sock:  # a duplicate: the same socket, closed here
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                done += 1
        except OSError as exc:  # pragma: no cover - platform dependent
            log.warning("cannot set TCP_NODELAY on listening socket %s (%s)", c.laddr, exc)
    return done


def request_is_local(scope: dict[str, Any], settings: Settings) -> bool:
    """Whether this request may be served in local mode (see the module docstring)."""
    if not settings.local_mode:
        return False
    server = scope.get("server")
    if server and isinstance(server[0], str) and is_ip(server[0]) and not is_loopback(server[0]):
        return False
    return not network_listeners()
