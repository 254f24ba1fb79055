"""Why two runs' step times differ: the change split into parts, each with its interval over repeats.

Each run's parts are its ranks' split steps (`critical_path.rank_parts_s`: compute by op class,
each collective's transfer by dimension and op, wait — the arrival skew —, the pipeline's bubble,
idle), the mean over its ranks and profiled steps, which add up to its profiled step. A side of
the comparison is one run or a repeat group (its runs); each part's change is the mean over B's
runs minus A's, with a 95 % interval (Welch's, Student's t on the smaller side's degrees of
freedom) when both sides have two runs or more.

The parts are measured in the profiled window; the measured difference is that of the timed
steps (`summary.step_time_s.median`). The two differ by an offset: a run's timed step is its
profiled step plus time the window's parts do not hold — the window's first step starts without
the previous step's wait, its mean is not the timed steps' median of the slowest rank, the
harness's census is cut out of it — measured per run as the timed step minus the parts' sum (the
profiled step, when the attribution is whole; `offset_a_s`, `offset_b_s`). Such an offset is the loop's, not the configuration's: it is the
same on both sides and cancels in their difference, so the parts are compared as measured, in
seconds, with no factor. (A factor — timed over profiled step — would carry that offset's share
into every part: across a slow link the timed steps were the profiled ones plus 0.12–0.4 s on
both sides, and one factor for all runs left 4.8–8.2 % of the difference unexplained where the
offset's change was 0.2–0.7 %.) What does not cancel — the offset's change, B's minus A's — is the
residual, the measured difference minus the parts' sum: the part of the timed difference the
window did not see, with its own interval. It is shown, never spread over the parts. The
profiler's per-op cost lands there too: where it lengthens one side's window more than the
other's (many more ops on CPU), the parts do not add up, and the diff says so.

Whether the parts add up is a claim about the residual, which is measured with noise: each run's
offset moves with the host's load between its timed steps and its window (across an emulated
link, ±0.1–0.2 s a run at 3–12 mbit with three runs a side). So the verdict weighs the residual's
interval as the parts' are weighed: "add up" when the whole interval lies within `ADD_UP` of the
measured difference, "do not add up" when the whole of it lies beyond, "cannot tell" when it
straddles the bound — then more repeats decide, and the diff says so rather than guess. Without
repeats (no interval) the point estimate decides. `adds_up` keeps the point estimate's answer.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from parallab.core.critpath import part_group, t_quantile

_closed = ConfigDict(extra="forbid", allow_inf_nan=False)

ADD_UP = 0.05
"""The parts add up to the measured difference when the residual is within this share of it."""


WhyVerdict = Literal["add up", "do not add up", "cannot tell"]


class PartChange(BaseModel):
    model_config = _closed
    part: str
    family: str = Field(description="compute, transfer, wait, bubble, idle or unmatched.")
    a_s: float
    b_s: float
    delta_s: float
    interval_s: float | None = Field(None, description="Half-width of the 95 % interval of delta_s; None without repeats on both sides.")
    share: float | None = Field(None, description="delta_s over the measured difference.")


class Why(BaseModel):
    model_config = _closed
    runs_a: int = Field(ge=1)
    runs_b: int = Field(ge=1)
    step_a_s: float
    step_b_s: float
    measured_delta_s: float = Field(description="B's timed step minus A's (means of the runs' medians).")
    measured_interval_s: float | None = None
    parts: list[PartChange] = Field(default_factory=list)
    parts_sum_s: float
    residual_s: float = Field(
        description="measured_delta_s − parts_sum_s: the offset's change (offset_b_s − offset_a_s), what the window did not see."
    )
    residual_interval_s: float | None = Field(None, description="Half-width of the 95 % interval of residual_s; None without repeats.")
    residual_fraction: float | None = Field(None, description="|residual| over |measured difference|.")
    adds_up: bool = Field(description=f"The residual (its point estimate) is within {ADD_UP:.0%} of the measured difference.")
    verdict: WhyVerdict = Field(
        description=f"Whether the parts add up within {ADD_UP:.0%}, the residual's interval weighed: all of it within the bound,"
        " all of it beyond, or straddling it (more repeats decide)."
    )
    profiled_delta_s: float = Field(description="B's profiled step minus A's (means over the runs): what the parts sum to.")
    offset_a_s: float = Field(description="A's timed step minus its parts' sum (mean over its runs): outside the profiled window.")
    offset_b_s: float = Field(description="B's timed step minus its parts' sum (mean over its runs).")


class NotExplained(ValueError):
    """A run without what the diff needs (untraced, no critical path, no timed steps)."""


def _get(doc: Mapping[str, Any], run: str) -> tuple[float, dict[str, float], float]:
    summary = doc.get("summary") or {}
    step = (summary.get("step_time_s") or {}).get("median")
    if not isinstance(step, (int, float)):
        raise NotExplained(f"{run}: summary.step_time_s.median missing (the run has no timed steps)")
    cp = doc.get("critical_path") or {}
    parts = cp.get("rank_parts_s")
    if not parts:
        raise NotExplained(f"{run}: critical_path.rank_parts_s missing (untraced, or its traces could not be analysed)")
    profiled = cp.get("rank_step_s")
    if not isinstance(profiled, (int, float)) or profiled <= 0:
        raise NotExplained(f"{run}: critical_path.rank_step_s missing or 0")
    return float(step), {str(k): float(v) for k, v in parts.items()}, float(profiled)


def _diff(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None]:
    delta = statistics.fmean(b) - statistics.fmean(a)
    if len(a) < 2 or len(b) < 2:
        return delta, None
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return delta, t_quantile(min(len(a), len(b)) - 1) * se


def explain(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *, names: tuple[str, str] = ("A", "B")) -> Why:
    """B against A (each a run's result document, or a repeat group's): NotExplained naming the run
    and the missing field when one cannot be explained."""
    if not a or not b:
        raise NotExplained("each side needs at least one run")
    got_a = [_get(d, f"{names[0]} run {i + 1}") for i, d in enumerate(a)]
    got_b = [_get(d, f"{names[1]} run {i + 1}") for i, d in enumerate(b)]
    keys = sorted({k for _, p, _ in got_a + got_b for k in p})
    parts = []
    measured, interval = _diff([t for t, _, _ in got_a], [t for t, _, _ in got_b])
    for k in keys:
        va, vb = [p.get(k, 0.0) for _, p, _ in got_a], [p.get(k, 0.0) for _, p, _ in got_b]
        d, iv = _diff(va, vb)
        parts.append(
            PartChange(
                part=k,
                family=part_group(k),
                a_s=statistics.fmean(va),
                b_s=statistics.fmean(vb),
                delta_s=d,
                interval_s=iv,
                share=d / measured if measured else None,
            )
        )
    parts.sort(key=lambda p: -abs(p.delta_s))
    total = sum(p.delta_s for p in parts)
    residual = measured - total
    # per run: its timed step minus its parts' sum (its profiled step, when the attribution is whole)
    offsets_a, offsets_b = [t - sum(p.values()) for t, p, _ in got_a], [t - sum(p.values()) for t, p, _ in got_b]
    frac = abs(residual) / abs(measured) if measured else None
    residual_interval = _diff(offsets_a, offsets_b)[1]
    return Why(
        runs_a=len(a),
        runs_b=len(b),
        step_a_s=statistics.fmean(t for t, _, _ in got_a),
        step_b_s=statistics.fmean(t for t, _, _ in got_b),
        measured_delta_s=measured,
        measured_interval_s=interval,
        parts=parts,
        parts_sum_s=total,
        residual_s=residual,
        residual_interval_s=residual_interval,
        residual_fraction=frac,
        adds_up=frac is not None and frac <= ADD_UP,
        verdict=_verdict(residual, residual_interval, measured),
        profiled_delta_s=statistics.fmean(w for _, _, w in got_b) - statistics.fmean(w for _, _, w in got_a),
        offset_a_s=statistics.fmean(offsets_a),
        offset_b_s=statistics.fmean(offsets_b),
    )


def _verdict(residual: float, interval: float | None, measured: float) -> WhyVerdict:
    """The residual against `ADD_UP` of the measured difference, its interval weighed (see the module)."""
    bound = ADD_UP * abs(measured)
    if not measured:
        return "do not add up" if residual else "add up"
    if interval is None:
        return "add up" if abs(residual) <= bound else "do not add up"
    if abs(residual) + interval <= bound:
        return "add up"
    if abs(residual) - interval > bound:
        return "do not add up"
    return "cannot tell"


def share_of(why: Why, needle: str) -> float | None:
    """The share of the measured difference in the parts whose name holds `needle` ('all_gather')."""
    if not why.measured_delta_s:
        return None
    return sum(p.delta_s for p in why.parts if needle in p.part) / why.measured_delta_s


def lines(why: Why, *, top: int = 12) -> list[str]:
    """The diff as text (CLI, compare page)."""

    def ms(v: float) -> str:
        return f"{v * 1e3:+.2f} ms"

    def iv(v: float | None) -> str:
        return f" ± {v * 1e3:.2f}" if v is not None else ""

    out = [
        f"step time {why.step_a_s * 1e3:.2f} ms -> {why.step_b_s * 1e3:.2f} ms: {ms(why.measured_delta_s)}{iv(why.measured_interval_s)}"
        f" (runs: {why.runs_a} vs {why.runs_b})",
        f"parts: the profiled window's, in its seconds ({why.profiled_delta_s * 1e3:+.2f} ms); outside it, the timed steps' offset"
        f" {why.offset_a_s * 1e3:+.2f} ms (A) and {why.offset_b_s * 1e3:+.2f} ms (B): what both share cancels, its change is the residual",
    ]
    for p in why.parts[:top]:
        share = f" ({p.share * 100:.0f} %)" if p.share is not None else ""
        out.append(f"  {p.part:<40} {ms(p.delta_s)}{iv(p.interval_s)}{share}")
    rest = why.parts[top:]
    if rest:
        out.append(f"  {len(rest)} smaller parts{'':<26} {ms(sum(p.delta_s for p in rest))}")
    said = {
        "add up": f"the parts add up within {ADD_UP:.0%}",
        "do not add up": f"the parts do NOT add up within {ADD_UP:.0%}",
        "cannot tell": f"cannot tell whether the parts add up within {ADD_UP:.0%}: the residual's interval straddles it"
        " (more repeats narrow it)",
    }[why.verdict]
    frac = f" ({why.residual_fraction * 100:.1f} % of the difference)" if why.residual_fraction is not None else ""
    residual = f"{ms(why.residual_s)}{iv(why.residual_interval_s)}{frac}"
    out.append(f"  residual (measured − parts){'':<13} {residual}: {said}")
    return out
