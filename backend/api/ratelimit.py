"""Per-token rate limits: a token bucket per API token, in this process.

Each token may make `upload_burst` uploads at once and `upload_rate_per_minute` sustained. Every
answer says where the caller stands, as W&B's API does: `RateLimit-Limit` (the burst),
`RateLimit-Remaining` (uploads left now) and `RateLimit-Reset` (seconds until the bucket is full
again); a refusal is 429 with `Retry-After` (seconds until the next upload is allowed).

Where the buckets live: with a Redis broker (a lab: compose runs `uvicorn --workers N`), in that
Redis, shared by every API process — one `EVAL` of the same token-bucket arithmetic per upload,
keyed by the token's hash, timed by Redis's clock. Otherwise (the embedded default, one process)
in this process. If Redis cannot answer, each process falls back to its own buckets (a token then
gets up to N times its rate): the limit fails closed, never open, and uploads are not refused
for Redis's sake either.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import redis
from fastapi import Depends, HTTPException, Request, Response, status

from backend.api.deps import SettingsDep, bearer_token
from backend.config import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_s: float
    """Seconds until the bucket is full again."""
    retry_after_s: float
    """Seconds until one more call is allowed (0 when allowed now)."""

    def headers(self) -> dict[str, str]:
        out = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(math.ceil(self.reset_s)),
        }
        if not self.allowed:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return out


def decision(allowed: bool, tokens: float, *, burst: int, rate_per_s: float) -> Decision:
    """Where a caller stands with `tokens` left in a bucket of `burst` refilled at `rate_per_s`."""
    return Decision(
        allowed=allowed,
        limit=burst,
        remaining=int(tokens),
        reset_s=(burst - tokens) / rate_per_s if rate_per_s else 0.0,
        retry_after_s=0.0 if allowed else (1.0 - tokens) / rate_per_s if rate_per_s else math.inf,
    )


class TokenBuckets:
    """One bucket per key: `burst` calls at once, refilled at `rate_per_s`. Thread-safe."""

    def __init__(self, *, rate_per_s: float, burst: int, clock: Callable[[], float] | None = None) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, at)

    def take(self, key: str) -> Decision:
        """Take one call from `key`'s bucket if it has one."""
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
            allowed = tokens >= 1.0
            if allowed:
                tokens -= 1.0
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > 10_000:
                self._forget_full(now)
        return decision(allowed, tokens, burst=self.burst, rate_per_s=self.rate_per_s)

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled (they behave as new ones); called under the lock."""
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate_per_s >= self.burst:
                del self._buckets[key]


# TokenBuckets.take in Redis, atomically: the bucket is a hash {tokens, at}; Redis's own clock
# (TIME) serves every API process alike. A full bucket expires (it behaves as a new one).
_TAKE = """
local burst, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil((burst - tokens) / rate) + 1)
return {allowed, tostring(tokens)}
"""


class RedisTokenBuckets:
    """The same buckets in Redis, shared by every API process; `fallback` while Redis is away.

    Fail closed: an upload is never let through because Redis did not answer; this process's own
    buckets decide instead. After a failure Redis is left alone for `retry_s` (a Redis that drops
    packets would otherwise add its connect timeout to every upload), and the outage is logged once.
    """

    retry_s = 5.0

    def __init__(self, client: redis.Redis, *, name: str, rate_per_s: float, burst: int, clock: Callable[[], float] | None = None) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self.prefix = f"parallab:ratelimit:{name}:{rate_per_s:g}:{burst}:"
        self._take = client.register_script(_TAKE)
        self._clock = clock or time.monotonic
        self.fallback = TokenBuckets(rate_per_s=rate_per_s, burst=burst, clock=self._clock)
        self._down_until: float | None = None

    @property
    def down(self) -> bool:
        """Whether Redis failed and the fallback decides (until it answers again)."""
        return self._down_until is not None

    def take(self, key: str) -> Decision:
        if self._down_until is not None and self._clock() < self._down_until:
            return self.fallback.take(key)
        try:
            allowed, tokens = self._take(keys=[self.prefix + key], args=[self.burst, self.rate_per_s])
        except redis.RedisError as exc:
            if self._down_until is None:
                log.warning("rate limit: Redis did not answer (%s); this process's own buckets apply until it does", exc)
            self._down_until = self._clock() + self.retry_s
            return self.fallback.take(key)
        if self._down_until is not None:
            log.warning("rate limit: Redis answers again; the shared buckets apply")
            self._down_until = None
        return decision(bool(int(allowed)), float(tokens), burst=self.burst, rate_per_s=self.rate_per_s)


_CREATE = threading.Lock()


def _buckets(request: Request, settings: Settings, name: str, rate_per_min: float, burst: int) -> TokenBuckets | RedisTokenBuckets:
    """The app's buckets for `name` at this rate (a settings change starts new ones): in the broker's
    Redis when there is one, else in this process."""
    url = settings.celery_broker_url
    shared = url.startswith(("redis://", "rediss://"))
    with _CREATE:
        store: dict[tuple[str, float, int, str], TokenBuckets | RedisTokenBuckets] | None = getattr(request.app.state, "rate_limits", None)
        if store is None:
            store = request.app.state.rate_limits = {}
        key = (name, rate_per_min, burst, url if shared else "")
        if key not in store:
            if shared:
                client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
                store[key] = RedisTokenBuckets(client, name=name, rate_per_s=rate_per_min / 60.0, burst=burst)
            else:
                store[key] = TokenBuckets(rate_per_s=rate_per_min / 60.0, burst=burst)
        return store[key]


def upload_rate_limit(
    request: Request, response: Response, settings: SettingsDep, token: Annotated[str | None, Depends(bearer_token)]
) -> None:
    """Take one upload from this token's bucket; 429 with Retry-After when it is empty."""
    if not token or settings.security.upload_rate_per_minute <= 0:
        return
    key = hashlib.sha256(token.encode()).hexdigest()
    answer = _buckets(request, settings, "upload", settings.security.upload_rate_per_minute, settings.security.upload_burst).take(key)
    if not answer.allowed:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"this token may upload {settings.security.upload_burst} results at once and "
            f"{settings.security.upload_rate_per_minute:g} per minute; "
            f"retry in {answer.headers()['Retry-After']} s",
            headers=answer.headers(),
        )
    response.headers.update(answer.headers())


UploadRateLimit = Depends(upload_rate_limit)
