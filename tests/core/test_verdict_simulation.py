"""The verdict's statistics hold what the glossary says they hold, by simulation (seeded, a few
seconds): the false-positive rate of the t test on log step times at most 5 %, its power at 3 runs
a side on a 1.5× difference at the run-to-run spread measured on this kind of host, and every
interval's coverage within 2 points of the coverage it is labelled with."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from backend.services.glossary import MEASURED_LOG_SPREAD
from parallab.core.stats import log_ratio_test, median_interval, t_power

SPREAD_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "run_to_run_spread.json"
REPS = 2000


def _runs(rng: random.Random, n: int, spread: float, factor: float = 1.0) -> list[float]:
    """n runs' median step times around 0.1 s × factor, log-normal at `spread`."""
    return [0.1 * factor * math.exp(rng.gauss(0, spread)) for _ in range(n)]


def test_the_stated_spread_is_the_measured_one() -> None:
    runs = json.loads(SPREAD_FILE.read_text())["conditions"]["shared"]["by_steps"]["100"]["runs"]
    logs = [math.log(r["values"]["step_time_p50"]) for r in runs]
    assert statistics.stdev(logs) == pytest.approx(MEASURED_LOG_SPREAD, abs=0.0005)


def test_the_false_positive_rate_is_at_most_5_percent_from_2_to_5_runs_a_side() -> None:
    rng = random.Random(1)
    trials = [(n, n, MEASURED_LOG_SPREAD, MEASURED_LOG_SPREAD) for n in range(2, 6) for _ in range(REPS)]
    false = sum(log_ratio_test(_runs(rng, m, a), _runs(rng, n, b)).significant for m, n, a, b in trials)
    rate, se = false / len(trials), math.sqrt(0.05 * 0.95 / len(trials))
    assert rate <= 0.05 + 2 * se, f"{rate:.3f} of {len(trials)} equal pairs called different"


def test_welch_holds_5_percent_with_unequal_counts_and_spreads() -> None:
    rng = random.Random(2)
    reps = 600  # Welch's fractional degrees of freedom miss the quantile cache: fewer, slower trials
    trials = [(2, 4, 2 * MEASURED_LOG_SPREAD, MEASURED_LOG_SPREAD), (5, 3, MEASURED_LOG_SPREAD, 2 * MEASURED_LOG_SPREAD)] * reps
    false = sum(log_ratio_test(_runs(rng, m, a), _runs(rng, n, b)).significant for m, n, a, b in trials)
    rate, se = false / len(trials), math.sqrt(0.05 * 0.95 / len(trials))
    assert rate <= 0.05 + 2 * se, f"Welch: {rate:.3f} of {len(trials)} equal pairs called different"


def test_the_power_at_3_runs_a_side_on_a_1_5x_difference_is_the_stated_one() -> None:
    rng = random.Random(3)
    spread = MEASURED_LOG_SPREAD
    found = sum(log_ratio_test(_runs(rng, 3, spread, 1.5), _runs(rng, 3, spread)).significant for _ in range(REPS))
    stated = t_power(math.log(1.5), MEASURED_LOG_SPREAD, 3)
    assert found / REPS == pytest.approx(stated, abs=0.03)
    assert stated > 0.25, "Mann–Whitney's power there is 0: its smallest p at 3 against 3 is 0.1"


@pytest.mark.parametrize("n", range(2, 11))
def test_every_interval_covers_as_often_as_its_label_says(n: int) -> None:
    rng = random.Random(100 + n)
    ratio_hits = median_hits = 0
    coverage = median_interval([1.0] * n).coverage
    reps = 2 * REPS  # 2 points are 5 standard errors of a 94 % coverage at 4000 trials
    for _ in range(reps):
        base, other = _runs(rng, n, MEASURED_LOG_SPREAD, 1.5), _runs(rng, n, MEASURED_LOG_SPREAD)
        t = log_ratio_test(base, other)
        ratio_hits += t.low <= 1.5 <= t.high
        m = median_interval(other)  # the true median of a log-normal around 0.1 is 0.1
        median_hits += m.low <= 0.1 <= m.high
    assert ratio_hits / reps == pytest.approx(0.95, abs=0.02)
    assert median_hits / reps == pytest.approx(coverage, abs=0.02)
