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

import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
        se, df = _standard_error(baseline, new)
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


def _standard_error(baseline: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """(standard error of new − baseline mean, degrees of freedom).

    One new value: the prediction interval, its variance taken as the baseline's. Several:
    Welch, each sample with its own variance, Welch–Satterthwaite degrees of freedom."""
    n, m = len(baseline), len(new)
    vb = statistics.variance(baseline)
    if m == 1:
        return math.sqrt(vb * (1 + 1 / n)), n - 1
    vn = statistics.variance(new)
    a, b = vb / n, vn / m
    if a + b == 0:
        return 0.0, n + m - 2
    df = (a + b) ** 2 / (a**2 / (n - 1) + b**2 / (m - 1))
    return math.sqrt(a + b), df


# ---- Student's t distribution (no scipy: the backend needs two functions of it) ----


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t (bisection on the CDF; p in (0, 1))."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    hi = 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2
