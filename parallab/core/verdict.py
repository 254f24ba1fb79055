"""A decision between two configurations, from their runs: how much faster, how sure, and why.

Plain numbers in, plain results out (no database, no document layout): compare, sweeps and the
CLI feed it each configuration's runs. The statistics are `parallab.core.stats`'.

- **How much faster, how sure.** Student's t on the logarithms of the runs' timed median step
  times (a ratio is a shift on the log scale, and a loaded host slows steps by a factor): the
  factor is the ratio of the geometric means (baseline / other: above 1, the other is faster),
  its 95 % t interval exponentiated, and the test's two-sided p at 5 %. Equal run counts use the
  pooled variance, exact at 95 % when both configurations share a relative spread and robust to
  unequal ones at equal n; unequal counts use Welch's. Unlike Mann–Whitney, whose smallest p at 3
  runs against 3 is 0.1 (it can never decide there), t has power from 2 runs a side. When the
  runs do not decide, the note says how many more would: the fewest runs a side at which a
  difference as large as the one seen, at the spread seen, is found 4 times in 5 (`runs_needed`).
  Under 2 runs a side there is no spread to test against, and the note says so.
- **Why.** A run's split of a step into compute (overlapped communication included: it runs
  under compute), exposed communication and idle comes from the *profiled* window, whose steps
  are slower than the timed ones (the profiler's own cost). Each part's share of the profiled
  step is kept and scaled to the configuration's *timed* median step time, so the parts sum to
  the figure the verdict is about, and the parts' differences sum to the difference of the
  medians. `check_adds_up` holds any decomposition to that (within 5 %): the unscaled profiled
  parts fail it whenever the profiler slows the steps unevenly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parallab.core.stats import LogRatioTest, log_ratio_test, median_interval, runs_needed

PARTS = ("exposed communication", "compute", "idle")
"""The parts a step splits into, in the order the verdict names them."""
ADD_UP_TOLERANCE = 0.05
"""How far the parts' differences may be from the difference of the medians (relative)."""


class VerdictError(ValueError):
    """Numbers a verdict cannot be built from (named)."""


def _checked(values: Sequence[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise VerdictError(f"{what}: no runs")
    bad = [v for v in out if not math.isfinite(v) or v <= 0]
    if bad:
        raise VerdictError(f"{what}: step times must be finite and positive, got {bad[0]!r}")
    return out


MIN_RUNS = 2
"""Runs a side below which there is no spread to test a difference against."""


@dataclass(frozen=True)
class Speedup:
    """How much faster `other` is than `baseline`, from their runs' timed median step times."""

    ratio: float
    """Ratio of the geometric means, baseline / other: above 1, other is faster."""
    low: float
    high: float
    coverage: float
    """What the interval achieves: 0.95 (a t interval), 0 with no interval (under 2 runs a side)."""
    test: LogRatioTest | None
    """None under 2 runs a side."""
    n_baseline: int
    n_other: int
    more_runs: int | None
    """Runs a side more that would decide it (0 once decided; None when no number under 50 would)."""

    @property
    def significant(self) -> bool:
        return self.test is not None and self.test.significant

    @property
    def decided(self) -> bool:
        return self.significant

    @property
    def note(self) -> str:
        """What the test says and, when it cannot decide, how many more runs would."""
        n = f"n = {self.n_baseline} and {self.n_other}"
        if self.test is None:
            short = max(MIN_RUNS + 1 - min(self.n_baseline, self.n_other), 1)
            return f"not decided: {self.n_baseline} run vs {self.n_other} has no spread to test against; run {short} more each (repeats)"
        said = f"t test on log step times p = {self.test.p:.2g}, {n}"
        if self.significant:
            return f"significant ({said})"
        if self.more_runs is None:
            return f"not decided ({said}): a difference this small at this spread needs more than 50 runs a side; treat them as equal"
        needed = min(self.n_baseline, self.n_other) + self.more_runs
        more = f"run {self.more_runs} more each" if self.n_baseline == self.n_other else f"bring each to {needed} runs"
        return f"not decided ({said}): {needed} runs a side would decide a difference this size 4 times in 5 — {more}"


def speedup(baseline_steps: Sequence[float], other_steps: Sequence[float]) -> Speedup:
    """The ratio with its interval, test and the runs it would still need (see the module docstring)."""
    base = _checked(baseline_steps, "baseline")
    other = _checked(other_steps, "other")
    n_b, n_o = len(base), len(other)
    geometric = math.exp(statistics.fmean(math.log(v) for v in base) - statistics.fmean(math.log(v) for v in other))
    if min(n_b, n_o) < MIN_RUNS:
        return Speedup(geometric, geometric, geometric, 0.0, None, n_b, n_o, None)
    test = log_ratio_test(base, other)
    more: int | None = 0
    if not test.significant:
        needed = runs_needed(math.log(test.ratio), test.spread)
        more = None if needed is None else max(needed - min(n_b, n_o), 1)
    return Speedup(test.ratio, test.low, test.high, test.confidence, test, n_b, n_o, more)


# ---- why ----


def run_shares(breakdowns: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    """One run's step split as shares of its profiled step, averaged over its ranks (a result
    document's `step_time_breakdown`s); None when no rank has one.

    Compute includes the overlapped communication (it runs under compute): compute + exposed + idle
    is the step. A breakdown whose compute leaves the overlapped part out is read that way."""
    shares = []
    for b in breakdowns:
        compute, exposed, idle = float(b.get("compute_s") or 0), float(b.get("exposed_comm_s") or 0), float(b.get("idle_s") or 0)
        overlapped, step = float(b.get("overlapped_comm_s") or 0), float(b.get("step_s") or 0)
        if step > 0 and abs(compute + exposed + overlapped + idle - step) <= 1e-6 * step and overlapped > 0:
            compute += overlapped  # the four-part convention: compute without what ran under it
        total = compute + exposed + idle
        if total > 0:
            shares.append({"compute": compute / total, "exposed communication": exposed / total, "idle": idle / total})
    if not shares:
        return None
    return {part: statistics.fmean(s[part] for s in shares) for part in PARTS}


def scaled_parts(shares: Sequence[Mapping[str, float]], timed_median_s: float) -> dict[str, float]:
    """The configuration's step split in seconds: its runs' mean shares × its timed median step time."""
    if not shares:
        raise VerdictError("scaled_parts: no run has a step split (untraced runs)")
    if not math.isfinite(timed_median_s) or timed_median_s <= 0:
        raise VerdictError(f"scaled_parts: the timed median must be finite and positive, got {timed_median_s!r}")
    mean = {part: statistics.fmean(float(s[part]) for s in shares) for part in PARTS}
    total = sum(mean.values())
    return {part: mean[part] / total * timed_median_s for part in PARTS}


def check_adds_up(differences: Mapping[str, float], total_difference: float, tolerance: float = ADD_UP_TOLERANCE) -> float:
    """The gap between the parts' differences and the difference they explain, relative to it;
    VerdictError when it is above `tolerance` (a decomposition that does not explain the figure)."""
    explained = sum(differences.values())
    gap = abs(explained - total_difference) / max(abs(total_difference), 1e-12)
    if gap > tolerance:
        raise VerdictError(
            f"the parts add up to {explained * 1e3:+.1f} ms but the medians differ by {total_difference * 1e3:+.1f} ms "
            f"({gap:.0%} apart, more than {tolerance:.0%})"
        )
    return gap


@dataclass(frozen=True)
class Verdict:
    """One line a user can act on: which is faster, by how much, how sure, and where the time went."""

    baseline: str
    other: str
    speedup: Speedup
    differences_s: dict[str, float] | None
    """Each part's baseline − other seconds per step (positive: other spends less), None without splits."""

    @property
    def line(self) -> str:
        """The line, e.g. "ddp ×2 is 2.47× faster than fsdp ×2 (95% CI 2.10–2.90; p = 0.001, n = 3 and 3):
        −X ms exposed communication, …", or, when the runs do not decide, "not decided" and the runs
        that would."""
        s = self.speedup
        faster = s.ratio >= 1
        factor, low, high = (s.ratio, s.low, s.high) if faster else (1 / s.ratio, 1 / s.high, 1 / s.low)
        direction = "faster" if faster else "slower"
        interval = f"95% CI {low:.2f}–{high:.2f}" if s.test is not None else "no interval under 2 runs a side"
        if s.significant:
            assert s.test is not None
            sure = f"p = {s.test.p:.2g}, n = {s.n_baseline} and {s.n_other}"
            text = f"{self.other} is {factor:.2f}× {direction} than {self.baseline} ({interval}; {sure})"
        else:
            text = f"{self.other} against {self.baseline}: {s.note}; {factor:.2f}× {direction} so far ({interval})"
        if self.differences_s:
            text += ": " + ", ".join(f"{_signed_ms(-d)} {part}" for part, d in self.differences_s.items())
        return text


def _signed_ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.1f} ms".replace("-", "−")


def verdict(
    *,
    baseline: str,
    other: str,
    baseline_steps: Sequence[float],
    other_steps: Sequence[float],
    baseline_shares: Sequence[Mapping[str, float]] = (),
    other_shares: Sequence[Mapping[str, float]] = (),
) -> Verdict:
    """The verdict of `other` against `baseline` from each one's runs' timed median step times
    and (optionally) their step-split shares (`run_shares`); the parts are checked to add up."""
    s = speedup(baseline_steps, other_steps)
    differences = None
    if baseline_shares and other_shares:
        base_median, other_median = statistics.median(baseline_steps), statistics.median(other_steps)
        base_parts = scaled_parts(baseline_shares, base_median)
        other_parts = scaled_parts(other_shares, other_median)
        differences = {part: base_parts[part] - other_parts[part] for part in PARTS}
        check_adds_up(differences, base_median - other_median)
    return Verdict(baseline=baseline, other=other, speedup=s, differences_s=differences)


def interval_width(values: Sequence[float]) -> float | None:
    """The 95 % interval of the median as a fraction of the median (None under 2 values): how
    far apart runs of one configuration land."""
    if len(values) < 2:
        return None
    m = median_interval(values)
    return (m.high - m.low) / m.estimate if m.estimate else None
