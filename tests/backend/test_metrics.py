"""`/metrics` in Prometheus' text format (issue 13): the registry other code increments, and the
fleet's gauges read from the database at scrape time."""

from __future__ import annotations

import re

import pytest

from backend.config import Settings
from backend.db import session_scope
from backend.metrics import INGEST_LATENCY, UPLOAD_REJECTIONS, Registry, UploadRejection, reject_upload
from backend.models import Run
from tests.backend.test_fleet import info, register, silence

SAMPLE = re.compile(r"^[a-z_]+(\{[^}]*\})? [-+0-9.eInfa]+$")


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert SAMPLE.match(line), f"not a sample line: {line!r}"
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_registry_renders_counters_and_cumulative_histograms() -> None:
    registry = Registry()
    hits = registry.counter("t_hits_total", "Hits.", ("kind",))
    latency = registry.histogram("t_seconds", "Latency.", ("route",), buckets=(0.1, 1))
    hits.inc(kind="a")
    hits.inc(2, kind="a")
    for value in (0.05, 0.5, 5):
        latency.observe(value, route='say "hi"')
    got = samples("\n".join(registry.render()))
    assert got['t_hits_total{kind="a"}'] == 3
    assert got['t_seconds_bucket{route="say \\"hi\\"",le="0.1"}'] == 1
    assert got['t_seconds_bucket{route="say \\"hi\\"",le="1"}'] == 2
    assert got['t_seconds_bucket{route="say \\"hi\\"",le="+Inf"}'] == 3 and got['t_seconds_count{route="say \\"hi\\""}'] == 3
    with pytest.raises(ValueError):
        hits.inc(kind="a", extra="x")
    with pytest.raises(ValueError):
        registry.counter("t_hits_total", "again")


def test_metrics_expose_runs_workers_queues_durations_and_the_registry(settings: Settings, client) -> None:
    register(settings, info("host-a"), info("host-b"))
    dead = info("host-c")
    register(settings, dead)
    silence(settings, dead)
    with session_scope(settings.sqlalchemy_url) as session:
        for status in ("queued", "queued", "failed"):
            session.add(Run(status=status, source="api", spec={}, strategy="ddp", world_size=2, model="tiny"))
        finished = Run(status="succeeded", source="api", spec={}, strategy="ddp", world_size=2, model="tiny")
        session.add(finished)
        session.flush()
        finished.started_at = finished.created_at
        finished.finished_at = finished.created_at
    before = UPLOAD_REJECTIONS.value(reason="rate_limited")
    reject_upload(UploadRejection.RATE_LIMITED)
    INGEST_LATENCY.observe(0.01, source="ci")
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = samples(response.text)
    assert (
        got['parallab_runs{status="queued"}'] == 2
        and got['parallab_runs{status="failed"}'] == 1
        and got['parallab_runs{status="running"}'] == 0
    )
    assert got['parallab_workers{pool="cpu",state="alive"}'] == 2 and got['parallab_workers{pool="cpu",state="dead"}'] == 1
    assert got["parallab_workers_alive"] == 2
    assert got['parallab_queue_length{pool="cpu"}'] == 0
    assert got['parallab_job_duration_seconds_count{status="succeeded"}'] == 1
    assert got['parallab_job_duration_seconds_bucket{status="succeeded",le="5"}'] == 1
    assert got['parallab_upload_rejections_total{reason="rate_limited"}'] == before + 1
    assert got['parallab_ingest_latency_seconds_count{source="ci"}'] >= 1
    assert got["parallab_database_up"] == 1 and got["parallab_broker_up"] == 1
