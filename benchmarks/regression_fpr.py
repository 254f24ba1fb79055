"""Regression detection on synthetic series at this machine's measured run-to-run spread.

    python benchmarks/regression_fpr.py [--series 200] [--write]

Reads `benchmarks/run_to_run_spread.json` (written by `benchmarks/run_to_run.py`). For each
number of measured steps there, it builds synthetic series two ways:

- *resampled*: the baseline is K runs drawn (without replacement) from the measured runs, the
  new result one more of them — the machine's real spread, outliers and all;
- *normal*: K + 1 values from a normal distribution with the measured CV.

and reports, for each test of `backend.services.regression` at its defaults, the false-positive
rate (an unchanged result flagged as regressed) and the rate at which a 20% throughput drop (the
new run's step times × 1.25) is flagged. For comparison, the same resampled series judged by a
one-sided Welch t-test on pooled step times (the baseline's steps against the new run's steps).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.services.regression import DEFAULTS, Config, judge  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from benchmarks.run_to_run import SPREAD_JSON  # noqa: E402
from parallab.core.stats import t_cdf  # noqa: E402

DROP = 0.8
"""A 20% throughput drop: tokens/s × 0.8 (step times × 1.25)."""
SEED = 11


def load_spread(path: Path = SPREAD_JSON) -> dict[str, Any]:
    return json.loads(path.read_text())


def flagged(baseline: Sequence[float], new: float, config: Config) -> bool:
    """Whether a tokens/s value `new` is judged regressed against `baseline`."""
    return judge(baseline, [new], config=config, higher_is_better=True).verdict == "regressed"


def resampled_series(values: Sequence[float], window: int, count: int, rng: random.Random) -> list[tuple[list[float], float]]:
    """`count` (baseline, new) pairs drawn without replacement from the measured values."""
    k = min(window, len(values) - 1)
    out = []
    for _ in range(count):
        picked = rng.sample(list(values), k + 1)
        out.append((picked[:k], picked[k]))
    return out


def normal_series(cv: float, window: int, count: int, rng: random.Random) -> list[tuple[list[float], float]]:
    """`count` (baseline, new) pairs of normal noise around 1 with coefficient of variation `cv`."""
    return [([rng.gauss(1.0, cv) for _ in range(window)], rng.gauss(1.0, cv)) for _ in range(count)]


def rates(series: Sequence[tuple[list[float], float]], config: Config) -> tuple[float, float]:
    """(false-positive rate, rate at which a 20% drop is flagged)."""
    fp = sum(flagged(b, n, config) for b, n in series) / len(series)
    tp = sum(flagged(b, n * DROP, config) for b, n in series) / len(series)
    return fp, tp


def pooled_steps_flagged(baseline_runs: Sequence[Sequence[float]], new_steps: Sequence[float], alpha: float) -> bool:
    """One-sided Welch on per-step throughput (1 / step time), the baseline's steps pooled."""
    a = [1 / s for run in baseline_runs for s in run]
    b = [1 / s for s in new_steps]
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t_cdf(t, df) < alpha


def pooled_rates(runs: Sequence[dict[str, Any]], window: int, count: int, rng: random.Random, alpha: float) -> tuple[float, float]:
    k = min(window, len(runs) - 1)
    fp = tp = 0
    for _ in range(count):
        picked = rng.sample(list(runs), k + 1)
        base = [r["step_times_s"] for r in picked[:k]]
        new = picked[k]["step_times_s"]
        fp += pooled_steps_flagged(base, new, alpha)
        tp += pooled_steps_flagged(base, [s / DROP for s in new], alpha)
    return fp / count, tp / count


CV_GRID = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2)
"""Normal noise at these CVs shows where a single result can tell a 20% drop from noise."""


def evaluate(spread: dict[str, Any], *, count: int, seed: int = SEED) -> list[dict[str, Any]]:
    """Every row of the measured table: per condition, number of steps, series model and test."""
    rows = []
    for condition, measured in spread["conditions"].items():
        for steps, entry in measured["by_steps"].items():
            values = [r["values"]["tokens_per_s"] for r in entry["runs"]]
            cv = entry["cv"]["tokens_per_s"]
            base = {"condition": condition, "steps": int(steps), "cv": cv}
            for test in ("t_test", "mad"):
                config = Config(test=test)
                for model, series in (
                    ("resampled", resampled_series(values, DEFAULTS.window, count, random.Random(seed))),
                    ("normal", normal_series(cv, DEFAULTS.window, count, random.Random(seed))),
                ):
                    fp, tp = rates(series, config)
                    rows.append({**base, "model": model, "test": test, "fpr": fp, "detected": tp})
            fp, tp = pooled_rates(entry["runs"], DEFAULTS.window, count, random.Random(seed), DEFAULTS.alpha)
            rows.append({**base, "model": "resampled", "test": "Welch on pooled steps", "fpr": fp, "detected": tp})
    return rows


def power(*, count: int, seed: int = SEED) -> list[dict[str, Any]]:
    """False positives and the 20% drop flagged, under normal noise at each CV of `CV_GRID`."""
    rows = []
    for cv in CV_GRID:
        for test in ("t_test", "mad"):
            fp, tp = rates(normal_series(cv, DEFAULTS.window, count, random.Random(seed)), Config(test=test))
            rows.append({"cv": cv, "test": test, "fpr": fp, "detected": tp})
    return rows


def _rate(value: float, count: int) -> str:
    return f"{value * 100:.1f}% ({round(value * count)})"


def main(argv: Sequence[str] | None = None, *, write: Callable[[str, str], None] = write_section) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args(argv)
    n = args.series
    rows = evaluate(load_spread(), count=n)
    d = DEFAULTS
    lines = [
        f"Measured by `python benchmarks/regression_fpr.py --series {n} --write`, from the runs of the section above "
        f"(`benchmarks/run_to_run_spread.json`), seed {SEED}. Each synthetic series: a baseline of K = {d.window} results "
        "and one new result, on tokens/s. *resampled*: the K + 1 values drawn without replacement from the measured runs "
        "(with fewer runs, K = runs − 1); *normal*: drawn from a normal distribution with the measured CV. "
        "False positives: an unchanged result judged regressed; 20% drop: the new result's step times × 1.25. "
        f"Tests at their defaults: t-test one-sided α = {d.alpha}, median ± {d.mad_k:g}·MAD, changes under "
        f"{d.min_change:.0%} never flagged. *Welch on pooled steps* is the alternative we did not take: the baseline's "
        "step times pooled against the new run's.",
        "",
        f"| condition | measured steps | run-to-run CV | series | test | false positives (of {n}) | 20% drop flagged (of {n}) |",
        "|---|---:|---:|---|---|---:|---:|",
        *(
            f"| {r['condition']} | {r['steps']} | {r['cv'] * 100:.1f}% | {r['model']} | {r['test']} | {_rate(r['fpr'], n)} "
            f"| {_rate(r['detected'], n)} |"
            for r in rows
        ),
        "",
        f"Where a single result can be judged at all: the same tests on normal noise at a range of CVs ({n} series each).",
        "",
        f"| run-to-run CV | test | false positives (of {n}) | 20% drop flagged (of {n}) |",
        "|---:|---|---:|---:|",
        *(f"| {r['cv'] * 100:.0f}% | {r['test']} | {_rate(r['fpr'], n)} | {_rate(r['detected'], n)} |" for r in power(count=n)),
    ]
    worst = {t: max(r["fpr"] for r in rows if r["test"] == t) for t in ("t_test", "mad", "Welch on pooled steps")}
    caught = max(r["detected"] for r in rows if r["test"] in ("t_test", "mad"))
    grid = power(count=n)
    quiet = max((r["cv"] for r in grid if r["test"] == "t_test" and r["detected"] >= 0.95), default=None)
    lines += [
        "",
        f"Read together: at every measured spread the t-test flags at most {worst['t_test']:.1%} of unchanged results; "
        f"median ± k·MAD at most {worst['mad']:.1%} — its band follows the core of the baseline, so on this machine's bimodal "
        "noise (most runs in one cluster, a few far slower) it flags the few (the resampled rows); Welch on pooled steps "
        f"flags up to {worst['Welch on pooled steps']:.0%}, as the steps of one run share its luck. At the spread measured "
        f"here no single result separates a 20% drop from noise (flagged in at most {caught:.1%} of series); the power table "
        + (f"shows a single result catches it at least 95% of the time with the t-test up to {quiet:.0%} CV. " if quiet else "")
        + "On a runner as busy as this one, a single result cannot tell a 20% drop: use a quiet runner, or upload several "
        "repetitions per commit as one batch (judged together with Welch's test).",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write("Regression detection: false positives and power on synthetic series", text)


if __name__ == "__main__":
    main()
