"""Bounded run views (issue #12): the API leaves the timeline out unless asked, and serves it
downsampled from its own endpoint — every lane kept, bars bounded, merged events accounted for."""

from __future__ import annotations

import pytest

from backend.db import session_scope
from backend.services.timeline import downsample
from tests.ui.factories import make_document, store_run, with_timeline


def test_a_short_timeline_comes_back_whole() -> None:
    events = [{"rank": 0, "op": "all_reduce", "start_us": 10.0, "dur_us": 5.0, "bytes": 64}]
    timeline = downsample(events, max_events=10)
    assert timeline.events == [{**events[0], "count": 1, "busy_us": 5.0}]
    assert not timeline.downsampled and timeline.bucket_us == 0.0


def test_downsampling_merges_what_a_pixel_cannot_separate_and_keeps_every_lane() -> None:
    events = with_timeline(make_document(strategy="fsdp", world_size=4), events_per_rank=3000).model_dump(mode="json")["timeline"]
    timeline = downsample(events, buckets=500, max_events=1000)
    assert timeline.downsampled and len(timeline.events) <= 1000
    lanes = {(e["rank"], e["op"]) for e in events}
    assert {(b["rank"], b["op"]) for b in timeline.events} == lanes, "every op of every rank stays visible"
    assert sum(b["count"] for b in timeline.events) == len(events), "each event is in exactly one bar"
    for lane in lanes:
        mine = [e for e in events if (e["rank"], e["op"]) == lane]
        bars = [b for b in timeline.events if (b["rank"], b["op"]) == lane]
        assert sum(b["busy_us"] for b in bars) == pytest.approx(sum(e["dur_us"] for e in mine))
        assert min(b["start_us"] for b in bars) == min(e["start_us"] for e in mine)
        assert max(b["start_us"] + b["dur_us"] for b in bars) == pytest.approx(max(e["start_us"] + e["dur_us"] for e in mine))
        assert sum(b["bytes"] or 0 for b in bars) == sum(e["bytes"] or 0 for e in mine)
        # bars on a lane never overlap, and the gaps between them are at least one bucket
        ordered = sorted(bars, key=lambda b: b["start_us"])
        assert all(b["start_us"] - (a["start_us"] + a["dur_us"]) >= timeline.bucket_us for a, b in zip(ordered, ordered[1:], strict=False))


def test_only_the_narrowest_gaps_close_when_the_bars_must_fit() -> None:
    starts, t = [], 0.0
    for i in range(100):  # 1 µs events, gaps alternating 50 and 200 µs
        starts.append(t)
        t += 1 + (50 if i % 2 else 200)
    events = [{"rank": 0, "op": "x", "start_us": s, "dur_us": 1.0} for s in starts]
    timeline = downsample(events, buckets=10_000, max_events=60)
    # 50 gaps of 200 µs stay open, 49 of 50 µs close: 51 bars, of one event or two
    assert len(timeline.events) == 51 and 50 < timeline.bucket_us <= 200
    assert sorted(b["count"] for b in timeline.events) == [1, 1] + [2] * 49


def test_the_run_api_leaves_the_timeline_out_unless_asked(client, settings) -> None:
    doc = with_timeline(make_document(strategy="ddp", world_size=2), events_per_rank=3000)
    with session_scope(settings.sqlalchemy_url) as session:
        run_id = store_run(session, doc).id
    plain = client.get(f"/api/v1/runs/{run_id}").json()
    assert "timeline" not in plain["result"] and plain["result_omitted"] == ["timeline"]
    assert plain["result"]["summary"]["tokens_per_s"] == doc.summary.tokens_per_s
    full = client.get(f"/api/v1/runs/{run_id}", params={"include": "timeline"}).json()
    assert len(full["result"]["timeline"]) == 6000 and full["result_omitted"] == []
    bad = client.get(f"/api/v1/runs/{run_id}", params={"include": "traces"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["query", "include"]

    timeline = client.get(f"/api/v1/runs/{run_id}/timeline", params={"max_events": 500}).json()
    assert timeline["total"] == 6000 and timeline["downsampled"] and len(timeline["events"]) <= 500
    assert sum(b["count"] for b in timeline["events"]) == 6000
    assert client.get(f"/api/v1/runs/{run_id}/timeline", params={"max_events": 0}).status_code == 422
    assert client.get("/api/v1/runs/nope/timeline").status_code == 404


def test_a_run_without_a_result_omits_nothing(client) -> None:
    run = client.post("/api/v1/runs", json={"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}})
    body = client.get(f"/api/v1/runs/{run.json()['id']}").json()
    assert body["result"] is None and body["result_omitted"] == []
    empty = {"events": [], "total": 0, "downsampled": False, "bucket_us": 0.0}
    assert client.get(f"/api/v1/runs/{run.json()['id']}/timeline").json() == empty
