"""Uploads are rate-limited per token: 429 with Retry-After, and W&B-style RateLimit-* headers."""

from __future__ import annotations

import pytest

from backend.api.ratelimit import TokenBuckets
from backend.models import Run
from tests.backend.test_api_results import DOCUMENT, count, token

ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@ON_SQLITE
def test_a_token_past_its_burst_gets_429_with_retry_after(client, settings) -> None:
    settings.security.upload_burst, settings.security.upload_rate_per_minute = 3, 1.0
    ci = token(settings, "upload")
    remaining = []
    for _ in range(3):
        response = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
        assert response.status_code == 201
        assert response.headers["ratelimit-limit"] == "3"
        remaining.append(int(response.headers["ratelimit-remaining"]))
    assert remaining == [2, 1, 0]
    refused = client.post("/api/v1/results", json=DOCUMENT, headers=ci)
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["ratelimit-remaining"] == "0" and int(refused.headers["ratelimit-reset"]) > 0
    assert "retry in" in refused.json()["detail"]
    assert count(settings, Run) == 3
    # the limit is per token: another pipeline is not held up
    assert client.post("/api/v1/results", json=DOCUMENT, headers=token(settings, "upload")).status_code == 201


@ON_SQLITE
def test_a_bad_token_is_401_not_counted(client, settings) -> None:
    settings.security.upload_burst, settings.security.upload_rate_per_minute = 1, 1.0
    for _ in range(3):
        assert client.post("/api/v1/results", json=DOCUMENT, headers={"Authorization": "Bearer plb_nope"}).status_code == 401


@ON_SQLITE
def test_rate_zero_turns_the_limit_off(client, settings) -> None:
    settings.security.upload_burst, settings.security.upload_rate_per_minute = 1, 0.0
    ci = token(settings, "upload")
    assert [client.post("/api/v1/results", json=DOCUMENT, headers=ci).status_code for _ in range(3)] == [201] * 3


def test_the_bucket_refills_at_the_rate() -> None:
    now = [0.0]
    buckets = TokenBuckets(rate_per_s=0.5, burst=2, clock=lambda: now[0])
    assert [buckets.take("t").allowed for _ in range(3)] == [True, True, False]
    refused = buckets.take("t")
    assert refused.retry_after_s == pytest.approx(2.0) and refused.headers()["Retry-After"] == "2"
    now[0] = 2.0  # one call's worth
    assert buckets.take("t").allowed and not buckets.take("t").allowed
    now[0] = 100.0  # never more than the burst
    assert buckets.take("t").remaining == 1
    assert buckets.take("other").remaining == 1


@ON_SQLITE
def test_while_redis_is_down_the_limit_holds_per_process(client, settings, caplog) -> None:
    """Fail closed: with the broker's Redis unreachable, each API process keeps its own buckets
    (a token gets at most its burst here), rather than letting every upload through."""
    settings.broker.broker_url = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.security.upload_burst, settings.security.upload_rate_per_minute = 2, 1.0
    ci = token(settings, "upload")
    codes = [client.post("/api/v1/results", json=DOCUMENT, headers=ci).status_code for _ in range(4)]
    assert codes == [201, 201, 429, 429]
    assert count(settings, Run) == 2
    assert sum("Redis did not answer" in r.getMessage() for r in caplog.records) == 1, "one warning per outage, not one per upload"


def test_an_unreachable_redis_is_not_asked_again_until_it_may_be_back() -> None:
    import redis

    from backend.api.ratelimit import RedisTokenBuckets

    now = [0.0]
    buckets = RedisTokenBuckets(
        redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1), name="t", rate_per_s=1.0, burst=1, clock=lambda: now[0]
    )
    assert buckets.take("k").allowed and buckets.down
    assert not buckets.take("k").allowed  # the fallback's bucket, without another try at Redis
    now[0] = buckets.retry_s + 1
    assert buckets.take("k").allowed  # refilled; Redis tried again (still down)
    assert buckets.down
