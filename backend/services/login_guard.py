"""Password guessing, slowed and then stopped: growing delays and a temporary lockout per account,
per client address and per known device, shared by every API process through Redis.

Each try counts against its *subjects* before its password is looked at: `admit` takes a numbered
place in each subject's count in one atomic step (Redis INCR, or under this process's lock), and a
try whose place is past its lockout count is refused 429 without a password check. So `10` means
ten password checks under any concurrency — ten clients arriving at once cannot all pass a check
of the count and then each add one after their slow password hash, which let thirteen through. A
failed try keeps its place; a correct one clears its account (or device) and gives its place back
to its address, so an office's successful logins never count against its shared address.

Each failed login counts against its subjects. A subject that has failed more than
`login_free_failures` times must wait before its next try (`login_delay_s`, doubling with each
further failure, at most `login_max_delay_s`); one that reaches its lockout count
(`login_account_lockout` for an account or a device, `login_ip_lockout` for an address) is
locked for `login_lockout_s`, and the lockout is logged. A try made while a subject waits is
answered 429 without looking at the password (so it is neither an oracle nor argon2 work), and is
not counted. Counts are forgotten `login_lockout_s` after a subject's last failure; a correct
password clears its account (or its device); an admin may lift a lockout at once
(`parallab user unlock EMAIL`, or the Users page).

The owner's own browser. Someone guessing at an account must not keep its owner out. Each
successful login leaves a *device cookie* in the browser: a random id signed with the secret key
and bound to the account (HttpOnly, SameSite=Lax, 180 days). A try that carries a valid device
cookie for the account it names is counted against that device alone, not against the account or
the address: strangers' guesses lock the account everywhere except in browsers where the owner
has logged in before. Guessing through a stolen device cookie is throttled and locked just the
same, on its own count; a new browser of the owner waits out the lockout (or an admin lifts it).

Where the counts live: in the broker's Redis when there is one (every API process sees the same
counts; keys expire by themselves), else in this process. While Redis does not answer, each process
counts on its own (fail closed: guessing is still slowed, per process), and says so in the log.
Keys are namespaced by the database (the accounts they count for) and hold hashes, never emails.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import redis
from itsdangerous import BadSignature, URLSafeTimedSerializer

from backend.config import Settings

log = logging.getLogger(__name__)

DEVICE_COOKIE = "parallab_device"
DEVICE_MAX_AGE_S = 180 * 24 * 3600


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def account_key(email: str) -> str:
    return "account:" + _digest(email.strip().lower())


def ip_key(address: str) -> str:
    return "ip:" + _digest(address)


@dataclass(frozen=True)
class Attempt:
    """Who is trying: the account named, the client's address, and the device id of a valid device
    cookie for that account (None: a browser the owner never logged in from)."""

    email: str
    ip: str
    device: str | None = None


@dataclass(frozen=True)
class Ticket:
    """A try admitted to a password check: its place in each subject's count (key, place, lockout
    count), or how long it must wait instead (`wait_s` > 0: refused, nothing counted)."""

    attempt: Attempt
    places: tuple[tuple[str, int, int], ...] = ()
    wait_s: float = 0.0


class Counts(Protocol):
    """Where failure counts and waits are kept (Redis, or this process)."""

    def wait_s(self, key: str) -> float: ...

    def fail(self, key: str, *, forget_after_s: float) -> int: ...

    def release(self, key: str) -> None: ...

    def block(self, key: str, seconds: float) -> None: ...

    def clear(self, key: str) -> None: ...


class LocalCounts:
    """Counts in this process (thread-safe), on the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}  # key → (count, forget at)
        self._blocked: dict[str, float] = {}  # key → until

    def wait_s(self, key: str) -> float:
        with self._lock:
            return max(0.0, self._blocked.get(key, 0.0) - time.monotonic())

    def fail(self, key: str, *, forget_after_s: float) -> int:
        now = time.monotonic()
        with self._lock:
            count, until = self._failures.get(key, (0, now))
            count = count + 1 if until > now else 1
            self._failures[key] = (count, now + forget_after_s)
            if len(self._failures) > 100_000:  # a flood of addresses: forget the expired ones
                self._failures = {k: v for k, v in self._failures.items() if v[1] > now}
                self._blocked = {k: v for k, v in self._blocked.items() if v > now}
            return count

    def release(self, key: str) -> None:
        """Give back one place in `key`'s count (a try that turned out not to be a failure)."""
        with self._lock:
            count, until = self._failures.get(key, (0, 0.0))
            if count > 0:
                self._failures[key] = (count - 1, until)

    def block(self, key: str, seconds: float) -> None:
        with self._lock:
            self._blocked[key] = max(self._blocked.get(key, 0.0), time.monotonic() + seconds)

    def clear(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)
            self._blocked.pop(key, None)


RELEASE = "if redis.call('get', KEYS[1]) and tonumber(redis.call('get', KEYS[1])) > 0 then return redis.call('decr', KEYS[1]) end return 0"
"""One place given back, in one step on the server: a count that expired meanwhile is not recreated at -1."""


class RedisCounts:
    """Counts in Redis, shared by every API process; `fallback` (this process) while Redis is away."""

    def __init__(self, client: redis.Redis, *, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.fallback = LocalCounts()

    def _warn(self, exc: Exception) -> None:
        log.warning("login throttle: Redis did not answer (%s); this process counts failed logins on its own", exc)

    def wait_s(self, key: str) -> float:
        try:
            ttl_ms = self.client.pttl(self.prefix + "wait:" + key)
        except redis.RedisError as exc:
            self._warn(exc)
            return self.fallback.wait_s(key)
        return max(0.0, int(ttl_ms) / 1000, self.fallback.wait_s(key))  # type: ignore[arg-type]

    def fail(self, key: str, *, forget_after_s: float) -> int:
        name = self.prefix + "fail:" + key
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.incr(name)
            pipe.expire(name, math.ceil(forget_after_s))
            count, _ = pipe.execute()
        except redis.RedisError as exc:
            self._warn(exc)
            return self.fallback.fail(key, forget_after_s=forget_after_s)
        return int(count)

    def release(self, key: str) -> None:
        """Give back one place, atomically and only while the count lives (never below zero)."""
        self.fallback.release(key)
        try:
            self.client.eval(RELEASE, 1, self.prefix + "fail:" + key)
        except redis.RedisError as exc:
            self._warn(exc)

    def block(self, key: str, seconds: float) -> None:
        try:
            name = self.prefix + "wait:" + key
            current = int(self.client.pttl(name))  # type: ignore[arg-type]
            wanted = max(1, math.ceil(seconds * 1000))
            if wanted > current:
                self.client.set(name, b"1", px=wanted)
        except redis.RedisError as exc:
            self._warn(exc)
            self.fallback.block(key, seconds)

    def clear(self, key: str) -> None:
        self.fallback.clear(key)
        try:
            self.client.delete(self.prefix + "fail:" + key, self.prefix + "wait:" + key)
        except redis.RedisError as exc:
            self._warn(exc)


class LoginGuard:
    """The rules above, over one place to count (`Counts`)."""

    def __init__(self, settings: Settings, counts: Counts) -> None:
        self.settings, self.counts = settings, counts

    def subjects(self, attempt: Attempt) -> list[tuple[str, int]]:
        """(key, failures that lock it) an attempt counts against: its device alone, or its account and address."""
        s = self.settings.security
        if attempt.device is not None:
            return [("device:" + _digest(attempt.device), s.login_account_lockout)]
        return [(account_key(attempt.email), s.login_account_lockout), (ip_key(attempt.ip), s.login_ip_lockout)]

    def wait_s(self, attempt: Attempt) -> float:
        """Seconds before this attempt may be tried (0: now)."""
        return max((self.counts.wait_s(key) for key, _ in self.subjects(attempt)), default=0.0)

    def delay_s(self, failures: int, lockout_after: int) -> float:
        """How long a subject waits after its `failures`-th failure in a row."""
        s = self.settings.security
        if failures >= lockout_after:
            return float(s.login_lockout_s)
        if failures <= s.login_free_failures:
            return 0.0
        return min(s.login_max_delay_s, s.login_delay_s * 2 ** (failures - s.login_free_failures - 1))

    def admit(self, attempt: Attempt) -> Ticket:
        """Take this try's place in each subject's count before its password is looked at; a try
        made while a subject waits, or whose place is past a lockout count (other tries took the
        last ones), is refused (`Ticket.wait_s` > 0) with any place it took given back."""
        if (wait := self.wait_s(attempt)) > 0:
            return Ticket(attempt, wait_s=wait)
        places: list[tuple[str, int, int]] = []
        for key, lockout_after in self.subjects(attempt):
            place = self.counts.fail(key, forget_after_s=self.settings.security.login_lockout_s)
            if place > lockout_after:
                for taken, _, _ in places:
                    self.counts.release(taken)
                self.counts.block(key, self.settings.security.login_lockout_s)
                return Ticket(attempt, wait_s=float(self.settings.security.login_lockout_s))
            places.append((key, place, lockout_after))
        return Ticket(attempt, tuple(places))

    def failed(self, ticket: Ticket) -> float:
        """The admitted try failed: it keeps its places; returns how long its subjects now wait. Logs each lockout."""
        longest = 0.0
        for key, failures, lockout_after in ticket.places:
            wait = self.delay_s(failures, lockout_after)
            if wait > 0:
                self.counts.block(key, wait)
            if failures == lockout_after:
                what = key.split(":", 1)[0]
                log.warning(
                    "login lockout: %s %s locked for %d s after %d failed logins (last: account %r from %s)",
                    what,
                    key.split(":", 1)[1][:12],
                    self.settings.security.login_lockout_s,
                    failures,
                    ticket.attempt.email[:320],
                    ticket.attempt.ip,
                )
            longest = max(longest, wait)
        return longest

    def succeeded(self, ticket: Ticket) -> None:
        """A correct password: the account's (or the device's) count starts again; the address's
        place is given back (its count holds failures only)."""
        for index, (key, _, _) in enumerate(ticket.places):
            if index == 0:
                self.counts.clear(key)
            else:
                self.counts.release(key)

    def unlock(self, *, email: str, ip: str | None = None) -> None:
        """Lift an account's (and, if given, an address's) lockout and forget its failures."""
        self.counts.clear(account_key(email))
        if ip:
            self.counts.clear(ip_key(ip))
        log.warning("login lockout lifted: account %r%s", email, f" and address {ip}" if ip else "")


@lru_cache(maxsize=32)
def _counts(broker_url: str, database_url: str) -> Counts:
    if broker_url.startswith(("redis://", "rediss://")):
        client = redis.Redis.from_url(broker_url, socket_connect_timeout=1, socket_timeout=1)
        return RedisCounts(client, prefix=f"parallab:login:{_digest(database_url)[:12]}:")
    return LocalCounts()


def login_guard(settings: Settings) -> LoginGuard:
    """This process's guard for the settings' database: in the broker's Redis when there is one."""
    return LoginGuard(settings, _counts(settings.celery_broker_url, settings.sqlalchemy_url))


# ---- the device cookie ----


def _devices(secret_key: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret_key, salt="parallab-login-device")


def issue_device(secret_key: str, email: str, device: str | None = None) -> str:
    """A device cookie's value for `email`: this browser's device id (kept, or a new one), signed."""
    return _devices(secret_key).dumps({"a": account_key(email), "d": device or secrets.token_urlsafe(18)})


def device_of(secret_key: str, cookie: str | None, email: str) -> str | None:
    """The device id of a valid, unexpired device cookie bound to `email`; None otherwise."""
    if not cookie:
        return None
    try:
        payload = _devices(secret_key).loads(cookie, max_age=DEVICE_MAX_AGE_S)
    except BadSignature:
        return None
    if not isinstance(payload, dict) or payload.get("a") != account_key(email) or not isinstance(payload.get("d"), str):
        return None
    return str(payload["d"])
