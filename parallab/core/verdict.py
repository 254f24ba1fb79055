"""A decision between two configurations, from their runs: how much faster, how sure, and why.

Plain numbers in, plain results out (no database, no document layout): compare, sweeps and the
CLI feed it each configuration's runs. The statistics are `parallab.core.stats`'.

- **How much faster.** The ratio of the median step times (baseline / other: above 1, the other is
  faster), with the 95 % interval of that ratio: the Moses interval of the shift between the logs
  of the step times, exponentiated (a ratio is a shift on the log scale). "Not significant" when
  Mann–Whitney does not separate the runs — and always under 2 runs a side, said so.
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

from parallab.core.stats import MannWhitney, mann_whitney, median_difference, median_interval

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


@dataclass(frozen=True)
class Speedup:
    """How much faster `other` is than `baseline`, from their runs' median step times."""

    ratio: float
    """median(baseline) / median(other): above 1, other is faster."""
    low: float
    high: float
    coverage: float
    """What the interval achieves (at least 0.95 once each side has enough runs)."""
    test: MannWhitney
    n_baseline: int
    n_other: int

    @property
    def significant(self) -> bool:
        return self.test.significant and min(self.n_baseline, self.n_other) >= 2

    @property
    def too_few(self) -> bool:
        """Under 2 runs a side no test can separate anything; under 4 a 95 % interval cannot be reached."""
        return self.coverage < 0.95

    @property
    def note(self) -> str:
        """What the test says, and, with few runs, why it cannot say more."""
        if min(self.n_baseline, self.n_other) < 2:
            return f"not significant: {self.n_baseline} run vs {self.n_other}, repeat each configuration (repeats) to test it"
        verdict = "significant" if self.significant else "not significant"
        few = f"; with {self.n_baseline} and {self.n_other} runs the interval is the whole range" if self.too_few else ""
        return f"{verdict} (Mann–Whitney p = {self.test.p:.3g}, n = {self.n_baseline} and {self.n_other}){few}"


def speedup(baseline_steps: Sequence[float], other_steps: Sequence[float]) -> Speedup:
    """The ratio of median step times with its interval and test (see the module docstring)."""
    base = _checked(baseline_steps, "baseline")
    other = _checked(other_steps, "other")
    shift = median_difference([math.log(v) for v in base], [math.log(v) for v in other])
    return Speedup(
        ratio=statistics.median(base) / statistics.median(other),
        low=math.exp(shift.low),
        high=math.exp(shift.high),
        coverage=shift.coverage,
        test=mann_whitney(base, other),
        n_baseline=len(base),
        n_other=len(other),
    )


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
        """The line, e.g. "ddp ×2 is 2.47× faster than fsdp ×2 (95% CI 2.10–2.90): −X ms exposed communication, …",
        or, when the runs do not separate, "not significant" first."""
        s = self.speedup
        faster = s.ratio >= 1
        factor, low, high = (s.ratio, s.low, s.high) if faster else (1 / s.ratio, 1 / s.high, 1 / s.low)
        direction = "faster" if faster else "slower"
        interval = f"95% CI {low:.2f}–{high:.2f}" if min(s.n_baseline, s.n_other) >= 2 else "no interval from one run each"
        if s.significant:
            text = f"{self.other} is {factor:.2f}× {direction} than {self.baseline} ({interval})"
        else:
            text = f"{self.other} against {self.baseline}: {s.note}; {factor:.2f}× {direction} by the medians ({interval})"
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
