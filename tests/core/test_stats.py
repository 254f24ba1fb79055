"""parallab.core.stats against values worked by hand (scipy's documented examples, binomial tables)."""

from __future__ import annotations

import math

import pytest

from parallab.core.stats import (
    EXACT_MAX,
    mann_whitney,
    median_difference,
    median_interval,
    ranks_of,
    spearman_interval,
    spearman_rho,
)

# scipy.stats.mannwhitneyu's documented example (ages of male and female staff).
MALES = [19, 22, 16, 29, 24]
FEMALES = [20, 11, 17, 12]


def test_median_interval_of_ten_runs_is_the_second_and_ninth_order_statistics():
    # Binomial(10, 1/2): P(B ≤ 1) = 11/1024 ≤ 0.025 < P(B ≤ 2) = 56/1024, so k = 2, coverage 1 − 22/1024
    iv = median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5, 10])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (5.5, 2, 9, 10)
    assert iv.coverage == pytest.approx(1 - 22 / 1024)


def test_under_six_runs_the_median_interval_is_the_range_and_says_its_coverage():
    iv = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (iv.low, iv.high) == (1.0, 5.0)
    assert iv.coverage == pytest.approx(1 - 2 / 32)  # short of 95 %: reported, not hidden


def test_median_interval_refuses_nothing_and_a_bad_confidence():
    with pytest.raises(ValueError, match="no values"):
        median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0, 2.0], confidence=1.5)


def test_mann_whitney_exact_matches_scipys_documented_example():
    # scipy: U1 = 17, exact two-sided p = 0.1111 (= 2 · 7 / 126: 7 of the C(9,4) orderings give U ≥ 17)
    r = mann_whitney(MALES, FEMALES)
    assert r.u == 17 and r.method == "exact"
    assert r.p == pytest.approx(2 * 7 / 126)
    assert not r.significant and r.verdict == "not significant"


def test_mann_whitney_normal_approximation_matches_scipys_asymptotic_p():
    # scipy: mannwhitneyu(males, females, method="asymptotic").pvalue = 0.11134688653314041
    # (μ = 10, σ² = 5·4·10/12, z = (17 − 10 − ½)/σ)
    assert mann_whitney(MALES, FEMALES, method="normal").p == pytest.approx(0.11134688653314041)


def test_mann_whitney_with_ties_uses_the_tie_corrected_variance():
    # 24 in both samples: U = 13.5, one tied pair, σ² = 20/12 · (10 − (2³ − 2)/(9 · 8)), z = (13.5 − 10 − ½)/σ
    r = mann_whitney(MALES, [20, 11, 17, 24])
    sigma = math.sqrt(20 / 12 * (10 - 6 / 72))
    assert r.method == "normal" and r.u == 13.5
    assert r.p == pytest.approx(math.erfc(3 / sigma / math.sqrt(2)))
    with pytest.raises(ValueError, match="ties"):
        mann_whitney(MALES, [20, 11, 17, 24], method="exact")


def test_two_runs_of_one_config_are_not_significant_and_separated_runs_are():
    assert not mann_whitney([0.19, 0.21], [0.20, 0.22]).significant
    fast, slow = [0.19, 0.20, 0.21, 0.18, 0.22, 0.17], [0.47, 0.45, 0.50, 0.46, 0.48, 0.49]
    r = mann_whitney(fast, slow)
    assert r.significant and r.p == pytest.approx(2 / math.comb(12, 6))


def test_the_verdict_can_fail_a_check_that_expected_a_difference():
    """Shown on purpose: identical samples never read as significant, whatever α."""
    r = mann_whitney([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], alpha=0.5)
    assert r.p == 1.0 and not r.significant


def test_median_difference_interval_excludes_zero_exactly_when_the_test_separates():
    fast, slow = [19, 20, 21, 18, 22, 17], [47, 45, 50, 46, 48, 49]  # ms
    d = median_difference(slow, fast)
    assert d.estimate == 47.5 - 19.5
    assert d.excludes(0) and d.low > 0
    # m = n = 6: P(U ≤ 5) = 19/924 ≤ 0.025 < P(U ≤ 6) = 30/924, so C = 6: the 6th and the 31st of 36 differences
    diffs = sorted(a - b for a in slow for b in fast)
    assert (d.low, d.high) == (diffs[5], diffs[30]) == (25, 31)
    assert d.coverage == pytest.approx(1 - 2 * 19 / 924)
    same = ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.5, 2.5, 3.5, 4.5, 5.5, 6.5])
    assert not median_difference(*same).excludes(0)
    assert not mann_whitney(*same).significant


def test_spearman_matches_scipys_documented_example_and_its_interval_includes_zero_at_n_5():
    # scipy.stats.spearmanr([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) = 0.8207826816681233
    xs, ys = [1, 2, 3, 4, 5], [5, 6, 7, 8, 7]
    assert spearman_rho(xs, ys) == pytest.approx(0.8207826816681233)
    iv = spearman_interval(xs, ys)
    assert iv is not None and iv.n == 5
    half = 1.959963984540054 * math.sqrt(1.06 / 2)
    assert iv.low == pytest.approx(math.tanh(math.atanh(0.8207826816681233) - half))
    assert iv.high == pytest.approx(math.tanh(math.atanh(0.8207826816681233) + half))
    assert not iv.excludes(0)  # five pairs do not establish the ranking


def test_spearman_needs_four_pairs_for_an_interval_and_some_spread():
    assert spearman_interval([1, 2, 3], [1, 2, 3]) is None
    assert spearman_rho([1, 1, 1], [1, 2, 3]) is None
    perfect = spearman_interval(list(range(10)), [v * v for v in range(10)])
    assert perfect is not None and perfect.estimate == 1.0 and perfect.high == 1.0 and 0 < perfect.low < 1


def test_a_perfect_ranking_of_few_pairs_is_not_taken_as_certain():
    """4 pairs rank perfectly by chance 1 time in 24: the interval must still include 0 there, and
    exclude it at 8 pairs (1 in 40,320); reversed, the same mirrored."""
    four = spearman_interval([1, 2, 3, 4], [10, 20, 30, 40])
    assert four is not None and four.high == 1.0 and four.low < 0
    eight = spearman_interval(list(range(8)), list(range(8)))
    assert eight is not None and eight.low > 0
    reversed_eight = spearman_interval(list(range(8)), list(range(8, 0, -1)))
    assert reversed_eight is not None and (reversed_eight.low, reversed_eight.high) == pytest.approx((-1.0, -eight.low))


def test_ranks_share_ties():
    assert ranks_of([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]


def test_exact_up_to_exact_max_runs_a_side_and_normal_beyond():
    small = mann_whitney([float(i) for i in range(EXACT_MAX)], [i + 0.5 for i in range(EXACT_MAX)])
    large = mann_whitney([float(i) for i in range(EXACT_MAX + 1)], [i + 0.5 for i in range(EXACT_MAX + 1)])
    assert (small.method, large.method) == ("exact", "normal")
    assert small.p == pytest.approx(large.p, abs=0.1)  # the approximation is close where it takes over
