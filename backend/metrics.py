"""A small Prometheus registry: counters, gauges and histograms with labels, in the text format.

Code anywhere in the API increments the metrics declared here; `GET /metrics` renders them beside
the gauges read from the database and the broker at scrape time (backend.services.metrics).
The names are the contract:

    parallab_upload_rejections_total{reason}   counter  result uploads refused, by `UploadRejection`
    parallab_ingest_latency_seconds{source}    histogram  time to store one result document
    parallab_queue_length{pool}                gauge     messages waiting in each pool's queue
    parallab_runs{status}                      gauge     runs by status
    parallab_workers{pool,state}               gauge     workers by pool, alive or dead
    parallab_workers_alive                     gauge     live workers in all pools
    parallab_job_duration_seconds{status}      histogram started → finished of worker runs
    parallab_database_up / parallab_broker_up  gauge     1 if the scrape could read it

Counters and histograms live in the process that observed them: behind several API processes,
scrape each (or read them as per-process series); the gauges are read from shared state and agree.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from enum import Enum

DEFAULT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class UploadRejection(str, Enum):
    """Why `POST /results` refused a document: the `reason` label of parallab_upload_rejections_total."""

    UNAUTHORIZED = "unauthorized"  # no token, a bad token, or one without scope upload
    INVALID = "invalid"  # the document failed validation (422)
    TOO_LARGE = "too_large"  # over max_upload_bytes (413)
    RATE_LIMITED = "rate_limited"  # over the per-token rate (429)
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"  # a key reused with another body (409)
    UNAVAILABLE = "unavailable"  # the database could not store it (503)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()):
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()):
        super().__init__(name, help_text, labels)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS):
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[tuple[str, ...], tuple[list[int], float, int]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts, total, n = self._series.get(key, ([0] * len(self.buckets), 0.0, 0))
            counts = [c + (1 if value <= b else 0) for c, b in zip(counts, self.buckets, strict=True)]
            self._series[key] = (counts, total + value, n + 1)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._series.items())
        lines = self.header()
        for key, (counts, total, n) in items:
            lines += histogram_lines(self.name, self.label_names, key, self.buckets, counts, total, n)
        return lines


def histogram_lines(
    name: str, label_names: Sequence[str], key: Sequence[str], buckets: Sequence[float], cumulative: Sequence[int], total: float, count: int
) -> list[str]:
    """One histogram series in the text format (`cumulative[i]`: observations ≤ buckets[i])."""
    lines = []
    for bound, c in zip([*buckets, math.inf], [*cumulative, count], strict=True):
        le = 'le="' + _number(bound) + '"'
        lines.append(f"{name}_bucket{_labels(label_names, key, le)} {c}")
    lines += [f"{name}_sum{_labels(label_names, key)} {_number(total)}", f"{name}_count{_labels(label_names, key)} {count}"]
    return lines


def gauge_lines(name: str, help_text: str, label_names: Sequence[str], samples: Iterable[tuple[Sequence[str], float]]) -> list[str]:
    """A gauge read at scrape time (from the database or the broker)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(label_names, key)} {_number(value)}" for key, value in samples]
    return lines


class Registry:
    """The metrics this process keeps; `render` gives them in Prometheus' text format."""

    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Histogram] = {}

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help_text, labels)
        self._add(metric)
        return metric

    def histogram(self, name: str, help_text: str, labels: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS) -> Histogram:
        metric = Histogram(name, help_text, labels, buckets)
        self._add(metric)
        return metric

    def _add(self, metric: Counter | Histogram) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric

    def render(self) -> list[str]:
        return [line for metric in self._metrics.values() for line in metric.render()]


REGISTRY = Registry()
UPLOAD_REJECTIONS: Counter = REGISTRY.counter(
    "parallab_upload_rejections_total", "Result uploads refused, by reason (see backend.metrics.UploadRejection).", ("reason",)
)
INGEST_LATENCY: Histogram = REGISTRY.histogram(
    "parallab_ingest_latency_seconds", "Seconds to store one result document (one transaction), by source.", ("source",)
)


def reject_upload(reason: UploadRejection) -> None:
    """Count one refused upload (what the upload route and its guards call)."""
    UPLOAD_REJECTIONS.inc(reason=reason.value)
