"""Noise-aware regression detection: a new result against its series' baseline (pure: no database).

Two tests, chosen per series, as bencher offers several threshold models:

- ``t_test`` — one-sided Student/Welch t-test. The repetitions are *results* (runs): each
  result contributes one value per metric (tokens/s is already the median over its steps).
  With one new result the band is the t prediction interval of the baseline,
  ``mean ± t(1−α, K−1) · s · √(1 + 1/K)``; with several repetitions of the same commit (a batch)
  it is Welch's test of the two means, degrees of freedom by Welch–Satterthwaite. Steps are
  not the repetitions: the steps of one run share its placement, load and warm-up, so their
  spread understates the spread between runs (BENCHMARKS.md measures both).
- ``mad`` — robust: ``median ± k · MAD`` of the baseline, MAD scaled by 1.4826 so that k counts
  standard deviations under normal noise; one outlier in the baseline barely moves it.

Either band is widened to at least ``min_change`` × the centre, so a deterministic metric (peak
memory often is, to the byte) is not flagged for a change nobody would act on. A value outside
the band is *regressed* on the metric's worse side and *improved* on its better side; inside,
*unchanged*. Fewer than two baseline results give *no_baseline*.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parallab.core.stats import t_cdf, t_quantile, welch_standard_error

TESTS = ("t_test", "mad")
MIN_BASELINE = 2
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Config:
    """How one series judges its results (stored on the series; see `DEFAULTS`)."""

    test: str = "t_test"
    window: int = 10
    baseline_branch: str = "main"
    alpha: float = 0.01
    mad_k: float = 4.0
    min_change: float = 0.02

    def threshold(self) -> float:
        return self.alpha if self.test == "t_test" else self.mad_k


DEFAULTS = Config()


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool
    pick: Callable[[Mapping[str, Any]], Any]
    """The metric's value from a result document's `summary` (None when it has none)."""


METRICS: tuple[Metric, ...] = (
    Metric("tokens_per_s", "Throughput", "tokens/s", True, lambda s: s.get("tokens_per_s")),
    Metric("step_time_p50", "Step time (median)", "s", False, lambda s: (s.get("step_time_s") or {}).get("median")),
    Metric("peak_memory_per_rank", "Peak memory per rank", "bytes", False, lambda s: s.get("peak_allocated_bytes_max")),
    Metric("exposed_comm_fraction", "Exposed communication", "fraction of step", False, lambda s: s.get("exposed_comm_fraction")),
)
METRICS_BY_NAME = {m.name: m for m in METRICS}


def metric_values(summary: Mapping[str, Any]) -> dict[str, float]:
    """Each covered metric's value in a result's summary (metrics it lacks are left out)."""
    out = {}
    for m in METRICS:
        value = m.pick(summary)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[m.name] = float(value)
    return out


@dataclass(frozen=True)
class Judgement:
    verdict: str
    """improved, unchanged, regressed or no_baseline."""
    value: float
    """The new sample's centre (its mean for t_test, median for mad)."""
    center: float | None
    lower: float | None
    upper: float | None
    change: float | None
    """(value − centre) / centre."""
    baseline_n: int
    p_value: float | None = None
    """t_test: the one-sided p-value of the new sample being worse."""


def judge(baseline: Sequence[float], new: Sequence[float], *, config: Config, higher_is_better: bool) -> Judgement:
    """The verdict on `new` (one value, or repetitions of one commit) against `baseline` (the last K results)."""
    if not new:
        raise ValueError("nothing to judge: the new sample is empty")
    if config.test not in TESTS:
        raise ValueError(f"test must be one of {', '.join(TESTS)}; got {config.test!r}")
    n = len(baseline)
    value = statistics.fmean(new) if config.test == "t_test" else statistics.median(new)
    if n < MIN_BASELINE:
        change = _change(value, baseline[0]) if n == 1 else None
        return Judgement("no_baseline", value, baseline[0] if n == 1 else None, None, None, change, n)
    p_value = None
    if config.test == "t_test":
        center = statistics.fmean(baseline)
        se, df = welch_standard_error(baseline, new)
        half = t_quantile(1 - config.alpha, df) * se
        if se > 0:
            t = (value - center) / se
            p_value = t_cdf(t, df) if higher_is_better else 1 - t_cdf(t, df)
    else:
        center = statistics.median(baseline)
        mad = statistics.median([abs(b - center) for b in baseline]) * MAD_TO_SIGMA
        half = config.mad_k * mad
    half = max(half, config.min_change * abs(center))
    lower, upper = center - half, center + half
    if value < lower:
        verdict = "regressed" if higher_is_better else "improved"
    elif value > upper:
        verdict = "improved" if higher_is_better else "regressed"
    else:
        verdict = "unchanged"
    return Judgement(verdict, value, center, lower, upper, _change(value, center), n, p_value)


def _change(value: float, center: float) -> float | None:
    return (value - center) / center if center else None
