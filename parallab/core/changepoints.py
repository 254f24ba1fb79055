"""Change points over a series of timings: a mean shift on logs or E-Divisive, each with a permutation test; sizes, the noise floor.

One CI result says little on a noisy runner; many results in a row say where a metric moved.
E-Divisive (Matteson & James, "A nonparametric approach for multiple change point analysis of
multivariate data", JASA 2014; the detector Apache Otava grew from) splits a series where the
energy distance between the two sides, scaled by ``m·n/(m+n)``, is largest, and keeps the split
when a permutation test says so: the observations of each current segment are shuffled
``permutations`` times and the split is kept when at most a fraction ``alpha`` of the shuffles
give as large a statistic. Splitting repeats, one change at a time, until a split is not kept.
Each side of a split holds at least ``min_size`` results, so a change right at the end of the
series is found only after ``min_size`` results have come after it. Each split is searched with
its right end fixed at the segment's end (as Otava does; the paper also searches that end), so a
short dip that comes back is found less readily than a step that stays.

A second detector, the default (``method="mean_shift"``), looks for the change CI cares about —
the level of a timing moving by a factor — where it has most power: binary segmentation on the
*log* of the values (a factor is a shift there, and a slowdown's size does not depend on the
level), each split scored by the two-sample t statistic of the two sides with their pooled
spread, the split kept when its largest |t| beats that of at least a fraction 1 − ``alpha`` of
shuffles of the segment (the same permutation test). On an unchanged series the first test is
the only one that can raise an alarm, so ``alpha`` is the false-alarm rate per series; the
shuffles make it exact for any distribution of exchangeable values. E-Divisive
(``method="edivisive"``) sees any change of distribution, and pays for that generality with
power against a plain shift (measured side by side in BENCHMARKS.md).

The size of a change is the relative difference of the means of the segments either side,
``mean(after) / mean(before) − 1``, with a Welch interval of that difference (relative to the
mean before). The noise is the between-job CV: the spread of the results about their own
segment's mean (so a level shift is not counted as noise). From it, the minimum detectable
change at 95 % power for ``k`` results either side of a change, two-sided at ``alpha``:
``(z(1 − alpha/2) + z(0.95)) · CV · √(2/k)`` — a normal-theory figure for a two-sample test,
which the benchmark compares with what the detector really finds.

Pure: values in, change points out; the shuffles come from a seeded generator, so the same
series always gets the same verdict.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from parallab.core.stats import t_quantile, welch_standard_error

ALPHA = 0.02
"""The false-alarm rate per unchanged series (the first split's test; exact under shuffling)."""
PERMUTATIONS = 199
METHODS = ("mean_shift", "edivisive")
MIN_SIZE = 3
MIN_RESULTS = 8
"""Fewer results than this and the series is not judged (each side of a split needs MIN_SIZE and
a permutation test on fewer has too few distinct shuffles to reach ALPHA)."""
POWER = 0.95
HORIZON = 10
"""The minimum detectable change is stated for this many results either side of a change."""


@dataclass(frozen=True)
class ChangePoint:
    index: int
    """The first result after the change (0-based)."""
    p_value: float
    before_mean: float
    after_mean: float
    size: float
    """mean(after) / mean(before) − 1."""
    lower: float
    upper: float
    """95 % interval of `size`."""


def _best_split(xs: Sequence[float], min_size: int) -> tuple[int, float]:
    """(τ, statistic) of the best split of `xs` into xs[:τ] and xs[τ:]; (-1, 0) when none fits.

    The energy statistic is updated as each value moves from the right side to the left, O(n²)."""
    n = len(xs)
    if n < 2 * min_size:
        return -1, 0.0
    row = [sum(abs(x - y) for y in xs) for x in xs]  # each value's distance to all the others
    total = sum(row)
    left = 0.0  # Σ over ordered pairs within xs[:τ]
    right = total  # Σ over ordered pairs within xs[τ:]
    to_left = [0.0] * n  # each value's distance to the values on the left
    best, best_tau = -math.inf, -1
    for tau in range(1, n - min_size + 1):
        moved = tau - 1
        x = xs[moved]
        d_left = to_left[moved]
        d_right = row[moved] - d_left
        left += 2 * d_left
        right -= 2 * d_right
        for j in range(tau, n):
            to_left[j] += abs(xs[j] - x)
        if tau < min_size:
            continue
        m, k = tau, n - tau
        cross = (total - left - right) / 2
        energy = 2 * cross / (m * k) - left / (m * (m - 1)) - right / (k * (k - 1))
        stat = m * k / (m + k) * energy
        if stat > best:
            best, best_tau = stat, tau
    return best_tau, best


def _best_t_split(xs: Sequence[float], min_size: int) -> tuple[int, float]:
    """(τ, |t|) of the split of `xs` whose two sides' means differ most in pooled-spread units; O(n).

    |t| = |mean(xs[τ:]) − mean(xs[:τ])| / (s · √(1/τ + 1/(n−τ))), s² the pooled within-side
    variance; a split with no spread on either side and different means scores infinity."""
    n = len(xs)
    if n < 2 * min_size:
        return -1, 0.0
    total, total_sq = math.fsum(xs), math.fsum(x * x for x in xs)
    left = left_sq = 0.0
    best, best_tau = -1.0, -1
    for tau in range(1, n - min_size + 1):
        x = xs[tau - 1]
        left += x
        left_sq += x * x
        if tau < min_size:
            continue
        m, k = tau, n - tau
        mean_l, mean_r = left / m, (total - left) / k
        within = (left_sq - m * mean_l * mean_l) + ((total_sq - left_sq) - k * mean_r * mean_r)
        gap = abs(mean_r - mean_l)
        if within <= 1e-12 * max(1.0, total_sq):
            stat = math.inf if gap > 1e-12 * max(1.0, abs(mean_l)) else 0.0
        else:
            stat = gap / math.sqrt(within / (n - 2) * (1 / m + 1 / k))
        if stat > best:
            best, best_tau = stat, tau
    return best_tau, max(best, 0.0)


def _bounds(cuts: Sequence[int], n: int) -> list[tuple[int, int]]:
    edges = [0, *sorted(cuts), n]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _permutation_p(
    xs: Sequence[float],
    segments: Sequence[tuple[int, int]],
    observed: float,
    *,
    alpha: float,
    permutations: int,
    min_size: int,
    rng: random.Random,
    split: Callable[[Sequence[float], int], tuple[int, float]] = _best_split,
) -> float:
    """How often shuffling each segment gives a best split as strong as `observed`; stops once above alpha."""
    at_least = 0
    limit = alpha * (permutations + 1) - 1
    for done in range(1, permutations + 1):
        strongest = 0.0
        for a, b in segments:
            part = list(xs[a:b])
            rng.shuffle(part)
            strongest = max(strongest, split(part, min_size)[1])
        at_least += strongest >= observed
        if at_least > limit:
            return (at_least + 1) / (done + 1)
    return (at_least + 1) / (permutations + 1)


def detect(
    values: Sequence[float],
    *,
    method: str = "mean_shift",
    alpha: float = ALPHA,
    permutations: int = PERMUTATIONS,
    min_size: int = MIN_SIZE,
    seed: int = 0,
) -> list[ChangePoint]:
    """Every change point the detector keeps, in series order. Raises ValueError below MIN_RESULTS,
    for an unknown method, and (mean_shift, which works on logs) for a value that is not positive."""
    n = len(values)
    if n < max(MIN_RESULTS, 2 * min_size):
        raise ValueError(f"a change-point search needs at least {max(MIN_RESULTS, 2 * min_size)} results; this series has {n}")
    if method not in METHODS:
        raise ValueError(f"method: {method!r} is not one of {', '.join(METHODS)}")
    split = _best_split
    searched: Sequence[float] = values
    if method == "mean_shift":
        bad = next((i for i, v in enumerate(values) if not v > 0 or math.isinf(v)), None)
        if bad is not None:
            raise ValueError(f"values[{bad}]: {values[bad]!r} is not a positive finite number (the mean-shift search works on logs)")
        split, searched = _best_t_split, [math.log(v) for v in values]
    rng = random.Random(seed)
    cuts: list[int] = []
    p_values: dict[int, float] = {}
    while True:
        segments = _bounds(cuts, n)
        candidates = [(stat, a + tau) for a, b in segments for tau, stat in [split(searched[a:b], min_size)] if tau > 0]
        if not candidates:
            break
        stat, cut = max(candidates)
        p = _permutation_p(searched, segments, stat, alpha=alpha, permutations=permutations, min_size=min_size, rng=rng, split=split)
        if p > alpha:
            break
        cuts.append(cut)
        p_values[cut] = p
    return [_sized(values, cut, p_values[cut], sorted(cuts)) for cut in sorted(cuts)]


def _sized(values: Sequence[float], cut: int, p: float, cuts: Sequence[int]) -> ChangePoint:
    edges = [0, *cuts, len(values)]
    i = edges.index(cut)
    before, after = values[edges[i - 1] : cut], values[cut : edges[i + 1]]
    mb, ma = statistics.fmean(before), statistics.fmean(after)
    se, df = welch_standard_error(before, after)
    half = t_quantile(0.975, df) * se if se > 0 else 0.0
    return ChangePoint(cut, p, mb, ma, ma / mb - 1, (ma - mb - half) / mb, (ma - mb + half) / mb)


def between_job_cv(values: Sequence[float], cuts: Sequence[int] = ()) -> float | None:
    """The CV of the results about their own segment's mean (pooled; segments split at `cuts`)."""
    squares, dof = 0.0, 0
    for a, b in _bounds(cuts, len(values)):
        part = values[a:b]
        if len(part) < 2:
            continue
        mean = statistics.fmean(part)
        if mean == 0:
            return None
        squares += sum((x / mean - 1) ** 2 for x in part)
        dof += len(part) - 1
    return math.sqrt(squares / dof) if dof > 0 else None


def min_detectable_change(cv: float, *, per_side: int = HORIZON, alpha: float = ALPHA, power: float = POWER) -> float:
    """The relative shift a two-sample test at `alpha` (two-sided) finds with `power`, `per_side` results either side."""
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * cv * math.sqrt(2 / per_side)


def min_detectable_single(cv: float, *, window: int, alpha: float, power: float = POWER) -> float:
    """The same for one new result against a baseline of `window` results (one-sided at `alpha`)."""
    z = NormalDist()
    return (z.inv_cdf(1 - alpha) + z.inv_cdf(power)) * cv * math.sqrt(1 + 1 / window)
