"""POST with bounded retries: what `parallab upload` does when the server is busy or away.

Retried: 503 (the server's upload queue is full, or the database is briefly away), 502 and 504 (a
proxy in front of it), 429 (this token's rate limit), and a request that never got an answer (the
connection was refused, reset or timed out). Each retry waits for the server's `Retry-After` when
it gives one, else an exponential backoff with jitter, and goes out with the same headers — the
same Idempotency-Key — so a request the server stored before the answer was lost is answered with
that stored run (200), never stored twice. Anything else is the caller's to judge.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_DELAY_S = 60.0
"""No single wait is longer, whatever Retry-After says."""


@dataclass(frozen=True)
class Attempt:
    """What one try ended with, for the caller's status line."""

    number: int
    retries: int
    reason: str
    delay_s: float


def backoff_s(retry: int, *, base_s: float = 1.0, rng: Callable[[], float] = random.random) -> float:
    """The wait before retry `retry` (1, 2, ...) when the server named none: base × 2^(retry−1), capped, with ±25% jitter."""
    return min(MAX_DELAY_S, base_s * 2 ** (retry - 1)) * (0.75 + 0.5 * rng())


def retry_after_s(response: httpx.Response) -> float | None:
    """The server's Retry-After in seconds (the delta form), capped; None when absent or a date."""
    value = response.headers.get("retry-after", "").strip()
    if not value.isdigit():
        return None
    return min(MAX_DELAY_S, float(value))


def post_with_retries(
    client: httpx.Client,
    url: str,
    *,
    content: bytes,
    headers: dict[str, str],
    retries: int,
    on_retry: Callable[[Attempt], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """The first answer that is not worth retrying, or the last one after `retries` retries.

    Raises the last `httpx.TransportError` when no try got an answer at all."""
    for number in range(1, retries + 2):
        try:
            response = client.post(url, content=content, headers=headers)
        except httpx.TransportError as exc:
            if number > retries:
                raise
            reason, delay = f"no answer ({type(exc).__name__}: {exc})", backoff_s(number)
        else:
            if response.status_code not in RETRY_STATUSES or number > retries:
                return response
            told = retry_after_s(response)
            reason = f"{response.status_code} {response.reason_phrase}"
            delay = told if told is not None else backoff_s(number)
        on_retry(Attempt(number=number, retries=retries, reason=reason, delay_s=delay))
        sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises on its last try
