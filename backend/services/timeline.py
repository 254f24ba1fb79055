"""A run's timeline, downsampled to what a chart can show (bounded run pages).

A traced run can carry tens of thousands of timeline events (8 ranks × 10,000 is 80,000). A chart
about 1,000 pixels wide cannot show more than a bar per pixel per lane, so the page loads the
timeline from its own endpoint, reduced like this:

- events are grouped into lanes, one per (rank, op) — every op of every rank stays visible;
- on each lane, events separated by less than one bucket (the step's span / `buckets`) are merged
  into one bar from the first start to the last end: at that width the gap is under a pixel.
  A merged bar keeps `count` (events merged), `busy_us` (their summed duration — what the
  bar's length overstates by the gaps) and `bytes` (summed);
- if the bars still number more than `max_events`, the merge width grows to just above the
  widest gap that has to close for them to fit (so exactly the widest gaps stay open).

The full detail is in the Perfetto/Chrome trace (`GET /api/v1/runs/{id}/trace?rank=N`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from backend.services.runs import get_run
from backend.store import runs as store

DEFAULT_BUCKETS = 1000
"""About the chart's width in pixels."""
DEFAULT_MAX_EVENTS = 5000
MAX_EVENTS_LIMIT = 50_000


@dataclass(frozen=True)
class Timeline:
    events: list[dict[str, Any]]
    total: int
    """Events in the stored document."""
    bucket_us: float
    """Events of one lane closer than this were merged (0: none were)."""

    @property
    def downsampled(self) -> bool:
        return len(self.events) < self.total


def _gaps(lane: list[dict[str, Any]]) -> list[float]:
    """Each event's gap after the busy span before it on its lane (sorted by start); the first has none."""
    gaps, end = [], float(lane[0]["start_us"]) + max(float(lane[0]["dur_us"]), 0.0)
    for e in lane[1:]:
        start = float(e["start_us"])
        gaps.append(start - end)
        end = max(end, start + max(float(e["dur_us"]), 0.0))
    return gaps


def _merge_lane(lane: list[dict[str, Any]], gap_us: float) -> list[dict[str, Any]]:
    """One lane's events (sorted by start) with those less than `gap_us` apart merged into one bar."""
    bars: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    end = 0.0
    for e in lane:
        start, dur = float(e["start_us"]), max(float(e["dur_us"]), 0.0)
        if bars and start - end < gap_us:
            end = max(end, start + dur)
            cur["dur_us"] = end - cur["start_us"]
            cur["count"] += 1
            cur["busy_us"] += dur
            if e.get("bytes") is not None:
                cur["bytes"] = (cur["bytes"] or 0) + e["bytes"]
            continue
        cur = {"rank": e["rank"], "op": e["op"], "start_us": start, "dur_us": dur, "bytes": e.get("bytes"), "count": 1, "busy_us": dur}
        end = start + dur
        bars.append(cur)
    return bars


def downsample(events: list[dict[str, Any]], *, buckets: int = DEFAULT_BUCKETS, max_events: int = DEFAULT_MAX_EVENTS) -> Timeline:
    """At most `max_events` bars (or one per lane, if there are more lanes): each lane's events closer
    than (span / buckets) merged; where that leaves too many bars, the merge width grows to just
    above the gap that makes them fit (bars = lanes + gaps at least that wide)."""
    total = len(events)
    if total <= max_events:
        bars = [{**e, "count": 1, "busy_us": max(float(e["dur_us"]), 0.0)} for e in events]
        return Timeline(events=bars, total=total, bucket_us=0.0)
    lanes: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for e in events:
        lanes.setdefault((e["rank"], e["op"]), []).append(e)
    for lane in lanes.values():
        lane.sort(key=lambda e: e["start_us"])
    t0 = min(e["start_us"] for e in events)
    t1 = max(e["start_us"] + max(e["dur_us"], 0.0) for e in events)
    bucket = (t1 - t0) / max(buckets, 1)
    gaps = sorted((g for lane in lanes.values() for g in _gaps(lane)), reverse=True)
    room = max_events - len(lanes)  # how many gaps may stay open
    if room <= 0:
        bucket = math.inf
    elif room < len(gaps) and gaps[room] >= bucket:
        bucket = math.nextafter(gaps[room], math.inf)  # every gap as wide as the (room+1)-th widest closes
    bars = [bar for key in sorted(lanes) for bar in _merge_lane(lanes[key], bucket)]
    bars.sort(key=lambda b: (b["rank"], b["start_us"]))
    return Timeline(events=bars, total=total, bucket_us=bucket)


def run_timeline(*, session: Session, run_id: str, buckets: int = DEFAULT_BUCKETS, max_events: int = DEFAULT_MAX_EVENTS) -> Timeline:
    """A run's stored timeline, downsampled (empty when it has no result or was not traced)."""
    get_run(session=session, run_id=run_id)
    return downsample(store.get_timeline(session, run_id), buckets=buckets, max_events=max_events)
