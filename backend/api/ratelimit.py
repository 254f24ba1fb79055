"""Per-token rate limits: a token bucket per API token, in this process.

Each token may make `upload_burst` uploads at once and `upload_rate_per_minute` sustained. Every
answer says where the caller stands, as W&B's API does: `RateLimit-Limit` (the burst),
`RateLimit-Remaining` (uploads left now) and `RateLimit-Reset` (seconds until the bucket is full
again); a refusal is 429 with `Retry-After` (seconds until the next upload is allowed).

The buckets live in this API process. That is exact for one process (compose runs one uvicorn);
with several API processes each keeps its own buckets, so a token gets up to N times its rate.
Such a deployment needs the buckets in Redis (one `EVAL` of a GCRA script per request, keyed by
the token's hash) — the broker's Redis would do.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Response, status

from backend.api.deps import SettingsDep, bearer_token


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
        missing = self.burst - tokens
        return Decision(
            allowed=allowed,
            limit=self.burst,
            remaining=int(tokens),
            reset_s=missing / self.rate_per_s if self.rate_per_s else 0.0,
            retry_after_s=0.0 if allowed else (1.0 - tokens) / self.rate_per_s if self.rate_per_s else math.inf,
        )

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled (they behave as new ones); called under the lock."""
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate_per_s >= self.burst:
                del self._buckets[key]


_CREATE = threading.Lock()


def _buckets(request: Request, name: str, rate_per_min: float, burst: int) -> TokenBuckets:
    """The app's buckets for `name` at this rate (a settings change starts new ones)."""
    with _CREATE:
        store: dict[tuple[str, float, int], TokenBuckets] | None = getattr(request.app.state, "rate_limits", None)
        if store is None:
            store = request.app.state.rate_limits = {}
        key = (name, rate_per_min, burst)
        if key not in store:
            store[key] = TokenBuckets(rate_per_s=rate_per_min / 60.0, burst=burst)
        return store[key]


def upload_rate_limit(
    request: Request, response: Response, settings: SettingsDep, token: Annotated[str | None, Depends(bearer_token)]
) -> None:
    """Take one upload from this token's bucket; 429 with Retry-After when it is empty."""
    if not token or settings.upload_rate_per_minute <= 0:
        return
    key = hashlib.sha256(token.encode()).hexdigest()
    decision = _buckets(request, "upload", settings.upload_rate_per_minute, settings.upload_burst).take(key)
    if not decision.allowed:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"this token may upload {settings.upload_burst} results at once and {settings.upload_rate_per_minute:g} per minute; "
            f"retry in {decision.headers()['Retry-After']} s",
            headers=decision.headers(),
        )
    response.headers.update(decision.headers())


UploadRateLimit = Depends(upload_rate_limit)
