"""The statistics a decision needs: a median with its interval, whether two sets of runs differ,
by how much, and how well one ranking follows another. Standard library only.

Choices, and why:

- **Median interval: order statistics.** The interval [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] with k the largest rank for
  which P(B ≤ k − 1) ≤ α/2, B ~ Binomial(n, ½) (the number of runs below the true median). It is
  exact and distribution-free — run times are skewed by a loaded host, not normal — and it needs
  no seed, so the same runs always give the same interval. A bootstrap of a median is discrete and
  too narrow at the small n a bench has (5–20 runs). Its coverage is at least 1 − α (reported as
  `coverage`); under 6 runs no pair of order statistics reaches 95 %, so the interval is the
  range and its coverage says what it is.
- **Mann–Whitney U** for "do these runs differ": distribution-free, robust to the outliers a
  shared machine produces. Exact (the permutation distribution of U, counted) when there are no
  ties and both samples have at most `EXACT_MAX` runs; otherwise the normal approximation with
  the tie correction of the variance and a continuity correction. Two-sided.
- **Difference of medians**: the point is median(x) − median(y); its interval is the Moses
  (Hodges–Lehmann) interval for a shift, the order statistics of the m·n pairwise differences
  cut at Mann–Whitney's critical value — so it excludes 0 exactly when the test at the same α
  separates the samples (up to ties), and the verdict and the interval never disagree.
- **Student's t** for the CI series' regression test (`backend.services.regression`): the
  prediction interval of one new result, or Welch's test of a batch of them, on the regularized
  incomplete beta function (continued fraction, modified Lentz).
- **Spearman's ρ** (Pearson's on average ranks) with the Fisher-z interval, using Fieller,
  Hartley & Pearson's (1957) variance 1.06/(n − 3) for rank correlations (1/(n − 3) is
  Pearson's and too narrow for ρ). Needs n ≥ 4.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

EXACT_MAX = 20
"""Largest sample size (each side) for which Mann–Whitney's p-value is counted exactly."""


def normal_quantile(p: float) -> float:
    """The standard normal's p-quantile."""
    return statistics.NormalDist().inv_cdf(p)


def _two_sided_normal_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval; `coverage` is what the interval achieves."""

    estimate: float
    low: float
    high: float
    coverage: float
    n: int

    def excludes(self, value: float) -> bool:
        return value < self.low or value > self.high


def ranks_of(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


# ---- the median ----


def _binomial_cdf_half(k: int, n: int) -> float:
    """P(B ≤ k), B ~ Binomial(n, ½)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)


@lru_cache(maxsize=4096)
def median_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """Which order statistics (1-based, ascending) bound the median's interval for n values, and
    the coverage they achieve (see the module docstring): (k, n − k + 1), or (1, n) — the range —
    when no pair reaches `confidence` (under 6 runs at 95 %; coverage 0 for one run).

    Apart from the values so that a database can fetch only the few rows the interval needs (the
    leaderboard's medians per config) and still agree with `median_interval` exactly."""
    if n < 1:
        raise ValueError("median_ranks: no values")
    if not 0 < confidence < 1:
        raise ValueError(f"median_ranks: confidence must be in (0, 1), got {confidence}")
    alpha, whole = 1 - confidence, 1 << n
    # the largest k with P(B ≤ k − 1) ≤ α/2 (1-based order statistic); 0: none reaches it. The
    # binomial sums are kept as integers and added to term by term (`_binomial_cdf_half`'s
    # quotient, without its sum over again per k: a config may have thousands of runs)
    k, term, below = 0, 1, 1  # C(n, k) and Σ_{i ≤ k} C(n, i)
    kept = below
    while k + 1 <= n // 2 and below / whole <= alpha / 2:
        kept = below
        k += 1
        term = term * (n - k + 1) // k
        below += term
    if k == 0:
        return 1, n, 1 - 2 * (1 / whole) if n > 1 else 0.0
    return k, n - k + 1, 1 - 2 * (kept / whole)


def median_interval(xs: Sequence[float], confidence: float = 0.95) -> Interval:
    """The median and its order-statistic interval (see the module docstring)."""
    if not xs:
        raise ValueError("median_interval: no values")
    if not 0 < confidence < 1:
        raise ValueError(f"median_interval: confidence must be in (0, 1), got {confidence}")
    s, n = sorted(xs), len(xs)
    lo, hi, coverage = median_ranks(n, confidence)
    return Interval(statistics.median(s), s[lo - 1], s[hi - 1], coverage, n)


# ---- two samples ----


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give each U = 0 … m·n (no ties)."""
    if m == 0 or n == 0:
        return (1,)
    a, b = _u_counts(m - 1, n), _u_counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(a):  # the largest value is one of x's: it beats all n of y's
        out[u + n] += c
    for u, c in enumerate(b):  # the largest value is one of y's
        out[u] += c
    return tuple(out)


def _exact_cdf(u: int, m: int, n: int) -> float:
    counts = _u_counts(m, n)
    return sum(counts[: u + 1]) / math.comb(m + n, m)


@dataclass(frozen=True)
class MannWhitney:
    """Mann–Whitney U of x against y (U = pairs where x's value is larger, ties counting ½)."""

    u: float
    p: float
    alpha: float
    method: str
    """"exact" or "normal" (with the tie and continuity corrections)."""

    @property
    def significant(self) -> bool:
        return self.p <= self.alpha

    @property
    def verdict(self) -> str:
        return f"significant at α = {self.alpha:g}" if self.significant else "not significant"


def mann_whitney(x: Sequence[float], y: Sequence[float], alpha: float = 0.05, *, method: str = "auto") -> MannWhitney:
    """The two-sided Mann–Whitney U test (see the module docstring); `method` "exact" or "normal"
    forces one ("exact" is refused with ties, where the counted distribution does not hold)."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("mann_whitney: both samples need at least one value")
    if method not in ("auto", "exact", "normal"):
        raise ValueError(f"mann_whitney: method must be auto, exact or normal, got {method!r}")
    pooled = list(x) + list(y)
    ranks = ranks_of(pooled)
    u = sum(ranks[:m]) - m * (m + 1) / 2
    ties = len(set(pooled)) < len(pooled)
    if method == "exact" and ties:
        raise ValueError("mann_whitney: method 'exact' needs samples without ties")
    if method == "exact" or (method == "auto" and not ties and max(m, n) <= EXACT_MAX):
        tail = min(u, m * n - u)
        return MannWhitney(u, min(1.0, 2 * _exact_cdf(int(tail), m, n)), alpha, "exact")
    total = m + n
    counts: dict[float, int] = {}
    for v in pooled:
        counts[v] = counts.get(v, 0) + 1
    tie_term = sum(t**3 - t for t in counts.values()) / (total * (total - 1))
    var = m * n / 12 * ((total + 1) - tie_term)
    if var <= 0:  # every value equal: nothing separates the samples
        return MannWhitney(u, 1.0, alpha, "normal")
    z = max(abs(u - m * n / 2) - 0.5, 0.0) / math.sqrt(var)
    return MannWhitney(u, min(1.0, _two_sided_normal_p(z)), alpha, "normal")


def _critical_u(m: int, n: int, alpha: float) -> int:
    """The largest C with P(U ≤ C − 1) ≤ α/2 (exact for small samples, normal beyond)."""
    if max(m, n) <= EXACT_MAX:
        c = 0
        while c < m * n and _exact_cdf(c, m, n) <= alpha / 2:
            c += 1
        return c
    z = normal_quantile(1 - alpha / 2)
    return max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))


def median_difference(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Interval:
    """median(x) − median(y), with the Moses interval for the shift between the samples."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("median_difference: both samples need at least one value")
    diffs = sorted(a - b for a in x for b in y)
    c = _critical_u(m, n, 1 - confidence)
    estimate = statistics.median(x) - statistics.median(y)
    if c == 0:  # too few runs for any interval at this confidence: the whole range
        return Interval(estimate, diffs[0], diffs[-1], 1.0 - 2 / math.comb(m + n, m), m + n)
    coverage = 1 - 2 * _exact_cdf(c - 1, m, n) if max(m, n) <= EXACT_MAX else confidence
    return Interval(estimate, diffs[c - 1], diffs[m * n - c], coverage, m + n)


# ---- rank correlation ----


def spearman_rho(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks, ties averaged); None under 3 pairs or with no spread."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks_of(xs), ranks_of(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = math.sqrt(sum((r - mx) ** 2 for r in rx))
    sy = math.sqrt(sum((r - my) ** 2 for r in ry))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


def spearman_interval(xs: Sequence[float], ys: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """ρ with its Fisher-z interval (variance 1.06/(n − 3)); None under 4 pairs or with no spread.
    An interval that includes 0 means the ranking is not established."""
    rho = spearman_rho(xs, ys)
    n = len(xs)
    if rho is None or n < 4:
        return None
    half = normal_quantile(1 - (1 - confidence) / 2) * math.sqrt(1.06 / (n - 3))
    if abs(rho) >= 1 - 1e-9:  # perfect, up to the rounding of the ranks' sums
        # Fisher's z is infinite at ±1, which would make a perfect ranking of 4 pairs (1 chance in 24)
        # look certain. The far end is taken from the nearest attainable ρ instead: one adjacent swap,
        # Σd² = 2, ρ = 1 − 12/(n(n² − 1)); the near end stays at ±1.
        nearest = math.copysign(1 - 12 / (n * (n * n - 1)), rho)
        far = math.tanh(math.atanh(nearest) - math.copysign(half, rho))
        near = math.copysign(1.0, rho)
        return Interval(rho, min(far, near), max(far, near), confidence, n)
    z = math.atanh(rho)
    return Interval(rho, math.tanh(z - half), math.tanh(z + half), confidence, n)


def welch_standard_error(baseline: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
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


# ---- Student's t (no scipy): the CI series' t-test ----


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


@lru_cache(maxsize=1024)
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


# ---- the ratio of two configurations' step times: Student's t on the logarithms ----


@dataclass(frozen=True)
class LogRatioTest:
    """Whether two sets of run times differ by a factor, from the means of their logarithms.

    `ratio` is exp(mean log x − mean log y) (the ratio of the geometric means), `low`–`high` its
    interval at `confidence`, `p` the two-sided p-value, `spread` the pooled standard deviation of
    the logarithms (the runs' relative spread), `method` "pooled" or "welch"."""

    ratio: float
    low: float
    high: float
    p: float
    df: float
    spread: float
    confidence: float
    method: str
    n_x: int
    n_y: int

    @property
    def significant(self) -> bool:
        return self.p <= 1 - self.confidence


def log_ratio_test(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> LogRatioTest:
    """Student's t on log(x) against log(y), with its interval for the ratio (see the verdict's
    docstring for why). Equal sample sizes: the pooled-variance test, exact under a common
    relative spread and robust to unequal ones at equal n; unequal sizes: Welch's, which does not
    assume the spreads equal, on Hsu's conservative degrees of freedom. Needs 2 values a side."""
    if min(len(x), len(y)) < 2:
        raise ValueError("log_ratio_test: each side needs at least 2 values")
    if any(v <= 0 for v in [*x, *y]):
        raise ValueError("log_ratio_test: values must be positive")
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    m, n = len(lx), len(ly)
    shift = statistics.fmean(lx) - statistics.fmean(ly)
    vx, vy = statistics.variance(lx), statistics.variance(ly)
    pooled = ((m - 1) * vx + (n - 1) * vy) / (m + n - 2)
    if m == n:
        method, se, df = "pooled", math.sqrt(pooled * (1 / m + 1 / n)), float(m + n - 2)
    else:
        # Welch's standard error with Hsu's min(m, n) − 1 degrees of freedom: Welch–Satterthwaite's
        # reach 8 % false positives at 2 runs against 4 when the 2 are the noisier; Hsu's hold 5 %
        # whatever the ratio of the spreads (the interval then covers at least 95 %)
        method, se, df = "welch", welch_standard_error(ly, lx)[0], float(min(m, n) - 1)
    if se == 0:  # identical runs on each side: the factor is exact
        p = 1.0 if shift == 0 else 0.0
        return LogRatioTest(math.exp(shift), math.exp(shift), math.exp(shift), p, df, 0.0, confidence, method, m, n)
    t = shift / se
    p = min(1.0, 2 * t_cdf(-abs(t), df))
    half = t_quantile(1 - (1 - confidence) / 2, df) * se
    return LogRatioTest(math.exp(shift), math.exp(shift - half), math.exp(shift + half), p, df, math.sqrt(pooled), confidence, method, m, n)


def t_power(shift: float, spread: float, n: int, alpha: float = 0.05) -> float:
    """The chance that the equal-n pooled t test at `alpha` finds a true log shift `shift` with
    `n` runs a side whose logs have standard deviation `spread`: the noncentral t's tail by the
    normal approximation of Abramowitz & Stegun 26.7.10 (within a point or two of the exact
    figure from 2 runs a side)."""
    if n < 2:
        return 0.0
    if spread <= 0:
        return 1.0 if shift else alpha
    df = 2 * n - 2
    delta = abs(shift) / (spread * math.sqrt(2 / n))
    crit = t_quantile(1 - alpha / 2, df)

    def below(t: float) -> float:  # P(T'(df, delta) <= t)
        return statistics.NormalDist().cdf((t * (1 - 1 / (4 * df)) - delta) / math.sqrt(1 + t * t / (2 * df)))

    return 1 - below(crit) + below(-crit)


def runs_needed(shift: float, spread: float, *, power: float = 0.8, alpha: float = 0.05, most: int = 50) -> int | None:
    """The fewest runs a side at which a log shift `shift` is found with probability `power`
    (`t_power`), or None when not even `most` would do."""
    for n in range(2, most + 1):
        if t_power(shift, spread, n, alpha) >= power:
            return n
    return None
