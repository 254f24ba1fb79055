"""Uploads are rate-limited per token: 429 with Retry-After, and W&B-style RateLimit-* headers."""

from __future__ import annotations

import pytest

from backend.api.ratelimit import TokenBuckets
from backend.models import Run
from tests.backend.test_api_results import DOCUMENT, count, token

ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@ON_SQLITE
def test_a_token_past_its_burst_gets_429_with_retry_after(client, settings) -> None:
    settings.upload_burst, settings.upload_rate_per_minute = 3, 1.0
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
    settings.upload_burst, settings.upload_rate_per_minute = 1, 1.0
    for _ in range(3):
        assert client.post("/api/v1/results", json=DOCUMENT, headers={"Authorization": "Bearer plb_nope"}).status_code == 401


@ON_SQLITE
def test_rate_zero_turns_the_limit_off(client, settings) -> None:
    settings.upload_burst, settings.upload_rate_per_minute = 1, 0.0
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
