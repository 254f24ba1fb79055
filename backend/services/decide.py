"""Compare's decision: the runs asked for, grouped into configurations, each with its median and
95 % interval, and a one-line verdict of every configuration against the baseline's — for N
configurations, N − 1 verdicts, each with its ratio, interval, test and why-parts that add up.

A configuration is a repeat group (the runs of one submission's `repeats`, `spec.repeat.group`)
or, for a run outside any group, that run alone — so two separately submitted runs of one config
are two configurations, and the verdict says whether they differ (they should not). The numbers
come from each run's result document (the timed median step time, the profiled step split);
the statistics and the verdict are `parallab.core.verdict`'s, which takes plain numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.models import Run
from parallab.core.noise import noisy_reasons
from parallab.core.stats import Interval, median_interval
from parallab.core.verdict import Verdict, VerdictError, check_adds_up, interval_width, run_shares, verdict

SCALING_NOTE = (
    "The parts come from the profiled steps' split (compute, exposed communication, idle), each part's share "
    "scaled to the timed steps' median, so they add up to the difference of the medians."
)


@dataclass
class Configuration:
    """One configuration's runs that succeeded, with what the verdict needs from each."""

    key: str
    label: str
    run_ids: list[str] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    """Each run's timed median step time."""
    tokens_per_s: list[float] = field(default_factory=list)
    shares: list[dict[str, float]] = field(default_factory=list)
    """Each traced run's step split as shares of its profiled step."""
    noisy: dict[str, list[str]] = field(default_factory=dict)
    """Run id → why its host was noisy (runs on a quiet host are left out)."""

    @property
    def n(self) -> int:
        return len(self.step_times_s)

    @property
    def step_time(self) -> Interval | None:
        return median_interval(self.step_times_s) if self.step_times_s else None

    @property
    def throughput(self) -> Interval | None:
        return median_interval(self.tokens_per_s) if self.tokens_per_s else None

    @property
    def width(self) -> float | None:
        """The step time's interval width over its median: how far apart the runs land."""
        return interval_width(self.step_times_s)


@dataclass
class Decision:
    """The configurations (the baseline's first) and each other one's verdict against it."""

    configurations: list[Configuration]
    verdicts: list[Verdict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Why a configuration has no verdict (no succeeded run, a decomposition that does not add up)."""
    note: str = SCALING_NOTE

    def as_json(self) -> dict[str, Any]:
        def interval(i: Interval | None) -> dict[str, float] | None:
            return None if i is None else {"median": i.estimate, "low": i.low, "high": i.high, "coverage": i.coverage, "n": i.n}

        by_label = {c.label: c for c in self.configurations}
        return {
            "baseline": self.configurations[0].key if self.configurations else None,
            "configurations": [
                {
                    "key": c.key,
                    "label": c.label,
                    "runs": c.run_ids,
                    "n": c.n,
                    "step_time_s": interval(c.step_time),
                    "tokens_per_s": interval(c.throughput),
                    "interval_width": c.width,
                    "noisy": c.noisy,
                }
                for c in self.configurations
            ],
            "verdicts": [
                {
                    "baseline": v.baseline,
                    "other": v.other,
                    "line": v.line,
                    "ratio": v.speedup.ratio,
                    "low": v.speedup.low,
                    "high": v.speedup.high,
                    "coverage": v.speedup.coverage,
                    "significant": v.speedup.significant,
                    "p": v.speedup.test.p if v.speedup.test else None,
                    "more_runs": v.speedup.more_runs,
                    "parts_ms": {k: -d * 1e3 for k, d in (v.differences_s or {}).items()},
                    **_against(v, by_label[v.baseline], by_label[v.other]),
                }
                for v in self.verdicts
            ],
            "problems": self.problems,
            "note": self.note,
        }


def _against(v: Verdict, base: Configuration, other: Configuration) -> dict[str, Any]:
    """Which configurations a verdict holds against each other, what the test says, and how close
    its parts come to the difference of the medians (`check_adds_up`'s gap; None without parts)."""
    gap = None
    if v.differences_s is not None:
        gap = check_adds_up(v.differences_s, statistics.median(base.step_times_s) - statistics.median(other.step_times_s))
    return {
        "baseline_key": base.key,
        "other_key": other.key,
        "baseline_runs": base.run_ids,
        "other_runs": other.run_ids,
        "n_baseline": v.speedup.n_baseline,
        "n_other": v.speedup.n_other,
        "note": v.speedup.note,
        "adds_up_gap": gap,
    }


def group_key(run: Run) -> str:
    """The run's repeat group, or the run itself."""
    repeat = (run.spec or {}).get("repeat") if isinstance(run.spec, dict) else None
    group = repeat.get("group") if isinstance(repeat, dict) else None
    return f"group:{group}" if isinstance(group, str) and group else f"run:{run.id}"


def _add(config: Configuration, run: Run, document: dict[str, Any] | None) -> None:
    summary = (document or {}).get("summary") or {}
    median = (summary.get("step_time_s") or {}).get("median")
    if run.status != "succeeded" or not isinstance(median, (int, float)) or median <= 0:
        return
    config.run_ids.append(run.id)
    config.step_times_s.append(float(median))
    if isinstance(summary.get("tokens_per_s"), (int, float)):
        config.tokens_per_s.append(float(summary["tokens_per_s"]))
    shares = run_shares([r["step_time_breakdown"] for r in (document or {}).get("ranks") or [] if r.get("step_time_breakdown")])
    if shares is not None:
        config.shares.append(shares)
    reasons = noisy_reasons((document or {}).get("noise"))
    if reasons:
        config.noisy[run.id] = reasons


def configurations(runs: Sequence[tuple[Run, dict[str, Any] | None]]) -> list[Configuration]:
    """The runs grouped into configurations, in the order each first appears; labels made unique."""
    by_key: dict[str, Configuration] = {}
    for run, document in runs:
        key = group_key(run)
        if key not in by_key:
            by_key[key] = Configuration(key=key, label=f"{run.strategy} ×{run.world_size}")
        _add(by_key[key], run, document)
    out = list(by_key.values())
    labels = [c.label for c in out]
    for c in out:
        if labels.count(c.label) > 1:  # the same layout twice: name each by its group or run
            c.label = f"{c.label} ({c.key.split(':', 1)[1][:6]})"
    return out


def decide(*, runs: Sequence[tuple[Run, dict[str, Any] | None]], baseline_id: str | None) -> Decision:
    """Every configuration against the one holding run `baseline_id` (its repeat group, whether or
    not that run succeeded; else the first)."""
    configs = configurations(runs)
    named = next((group_key(run) for run, _ in runs if run.id == baseline_id), None)
    base = next((c for c in configs if c.key == named), configs[0] if configs else None)
    if base is None:
        return Decision(configurations=[])
    ordered = [base, *[c for c in configs if c is not base]]
    decision = Decision(configurations=ordered)
    if not base.n:
        decision.problems.append(f"{base.label}: no succeeded run to hold the others against")
        return decision
    for other in ordered[1:]:
        if not other.n:
            decision.problems.append(f"{other.label}: no succeeded run yet")
            continue
        both_split = bool(base.shares and other.shares)
        try:
            decision.verdicts.append(
                verdict(
                    baseline=base.label,
                    other=other.label,
                    baseline_steps=base.step_times_s,
                    other_steps=other.step_times_s,
                    baseline_shares=base.shares if both_split else (),
                    other_shares=other.shares if both_split else (),
                )
            )
        except VerdictError as exc:
            decision.problems.append(f"{other.label} against {base.label}: {exc}")
    return decision
