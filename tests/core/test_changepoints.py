"""Both change-point searches (the mean shift on logs, the default, and E-Divisive), tested directly: a
planted shift found where it was planted with its size inside the interval, unchanged noise left
alone at the stated false-alarm rate, too short a series and a value the log search cannot take
refused, the noise measured about each segment's own mean, and the minimum detectable change by
the textbook formula."""

from __future__ import annotations

import math
import random
import re

import pytest

from parallab.core import changepoints as cp


def noisy(n: int, *, cv: float, seed: int, shift_at: int | None = None, factor: float = 0.8) -> list[float]:
    rng = random.Random(seed)
    return [100.0 * (factor if shift_at is not None and i >= shift_at else 1.0) * (1 + rng.gauss(0, cv)) for i in range(n)]


@pytest.mark.parametrize("method", cp.METHODS)
def test_a_planted_drop_is_found_where_it_was_planted_with_its_size_in_the_interval(method: str) -> None:
    for seed in range(5):
        [found] = cp.detect(noisy(30, cv=0.05, seed=seed, shift_at=17), method=method)
        assert abs(found.index - 17) <= 1, found
        assert found.size == pytest.approx(-0.2, abs=0.05) and found.lower < found.size < found.upper < 0, found
        assert found.p_value <= cp.ALPHA


@pytest.mark.parametrize("method", cp.METHODS)
def test_two_steps_down_are_both_found(method: str) -> None:
    values = noisy(36, cv=0.03, seed=3)
    values = [v * (1.0 if i < 12 else 0.8 if i < 24 else 0.6) for i, v in enumerate(values)]
    assert [c.index for c in cp.detect(values, method=method)] == [12, 24]


@pytest.mark.parametrize("method", cp.METHODS)
def test_unchanged_noise_rarely_gets_a_change_point(method: str) -> None:
    alarms = sum(bool(cp.detect(noisy(30, cv=0.3, seed=100 + s), method=method)) for s in range(40))
    assert alarms <= 3, f"{alarms} of 40 unchanged series got a change point at alpha {cp.ALPHA}"


def lognormal(n: int, *, sigma: float, seed: int, shift_at: int | None = None, factor: float = 0.8) -> list[float]:
    rng = random.Random(seed)
    return [math.exp(rng.gauss(0, sigma)) * (factor if shift_at is not None and i >= shift_at else 1.0) for i in range(n)]


def test_the_mean_shift_search_alarms_on_unchanged_series_at_its_alpha_and_no_more() -> None:
    # skewed, heavy noise (CV about 45 %): the shuffles make the rate exact whatever the distribution
    alarms = sum(bool(cp.detect(lognormal(40, sigma=0.43, seed=s))) for s in range(150))
    assert alarms <= 150 * cp.ALPHA + 5, f"{alarms} of 150 unchanged series alarmed at alpha {cp.ALPHA}"
    loose = sum(bool(cp.detect(lognormal(40, sigma=0.43, seed=s), alpha=0.3)) for s in range(150))
    assert loose > 150 * cp.ALPHA + 5, "a looser alpha alarms more: the count above can fail"


def test_the_mean_shift_search_finds_a_20_percent_drop_at_ten_percent_noise_within_three_results() -> None:
    hits = 0
    for s in range(30):
        found = cp.detect(lognormal(40, sigma=0.1, seed=500 + s, shift_at=20))
        hits += any(abs(c.index - 20) <= 3 and c.size < 0 for c in found)
    assert hits >= 27, f"found in {hits} of 30"


@pytest.mark.parametrize(("value", "where"), [(0.0, "values[9]: 0.0"), (-3.0, "values[9]: -3.0"), (math.inf, "values[9]: inf")])
def test_a_value_the_log_search_cannot_take_is_refused_naming_it(value: float, where: str) -> None:
    values = [1.0] * 9 + [value] + [1.0] * 5
    with pytest.raises(ValueError, match=re.escape(where)):
        cp.detect(values)
    cp.detect([abs(v) if math.isfinite(v) and v else 1.0 for v in values], method="edivisive")


def test_an_unknown_method_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="method: 'cusum' is not one of mean_shift, edivisive"):
        cp.detect([1.0] * 10, method="cusum")


def test_the_same_series_always_gets_the_same_verdict() -> None:
    values = noisy(24, cv=0.2, seed=9, shift_at=12, factor=0.75)
    assert cp.detect(values) == cp.detect(values)


def test_a_series_shorter_than_the_detector_needs_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 8 results; this series has 7"):
        cp.detect([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0])


def test_the_between_job_cv_leaves_the_shift_out_of_the_noise() -> None:
    values = noisy(40, cv=0.05, seed=4, shift_at=20, factor=0.5)
    assert cp.between_job_cv(values) > 0.3, "about one mean, the shift looks like noise"
    assert 0.03 < cp.between_job_cv(values, [20]) < 0.07


def test_the_minimum_detectable_change_is_the_two_sample_textbook_figure() -> None:
    # (z(0.995) + z(0.95)) · CV · √(2/k) = (2.5758 + 1.6449) · 0.10 · √(2/10), at alpha 0.01
    assert cp.min_detectable_change(0.10, per_side=10, alpha=0.01) == pytest.approx(0.18876, abs=1e-4)
    # one result against K = 10: (z(0.99) + z(0.95)) · CV · √(1 + 1/10)
    assert cp.min_detectable_single(0.10, window=10, alpha=0.01) == pytest.approx(0.41654, abs=1e-4)
