"""The verdict between two configurations: the ratio with its interval, "not significant" when the
runs do not separate, and a why whose parts add up to the difference of the timed medians."""

from __future__ import annotations

import math
import statistics

import pytest

from parallab.core.stats import mann_whitney, t_power
from parallab.core.verdict import PARTS, VerdictError, check_adds_up, run_shares, scaled_parts, speedup, verdict

# Two configurations as the issue measured them: timed medians 470 ms (fsdp) and 190 ms (ddp), while
# their profiled steps took 770 and 590 ms — the profiler slows fsdp's many collectives less than
# ddp's one, so the profiled gap (1.3×) is not the timed one (2.5×).
FSDP_TIMED = [0.452, 0.470, 0.461, 0.489, 0.478]
DDP_TIMED = [0.186, 0.190, 0.195, 0.183, 0.201]
FSDP_PROFILED = {"compute_s": 0.40, "exposed_comm_s": 0.30, "overlapped_comm_s": 0.05, "idle_s": 0.07, "step_s": 0.77}
DDP_PROFILED = {"compute_s": 0.50, "exposed_comm_s": 0.06, "overlapped_comm_s": 0.10, "idle_s": 0.03, "step_s": 0.59}


def test_a_clear_difference_is_significant_with_a_t_interval_around_the_ratio_of_geometric_means() -> None:
    s = speedup(FSDP_TIMED, DDP_TIMED)
    logs = [math.log(v) for v in FSDP_TIMED], [math.log(v) for v in DDP_TIMED]
    assert s.ratio == pytest.approx(math.exp(statistics.fmean(logs[0]) - statistics.fmean(logs[1])))
    assert s.significant and s.test is not None and s.test.p < 0.05 and s.more_runs == 0
    # the interval is symmetric about the ratio on the log scale: a t interval, 95 % by construction
    assert math.log(s.high) - math.log(s.ratio) == pytest.approx(math.log(s.ratio) - math.log(s.low))
    assert s.low < s.ratio < s.high and s.coverage == 0.95
    line = verdict(baseline="fsdp ×2", other="ddp ×2", baseline_steps=FSDP_TIMED, other_steps=DDP_TIMED).line
    assert line.startswith(f"ddp ×2 is {s.ratio:.2f}× faster than fsdp ×2 (95% CI {s.low:.2f}–{s.high:.2f}; p = ")


def test_three_separated_runs_against_three_decide_where_mann_whitney_cannot() -> None:
    """The runs a user measured: no overlap at all, 3 against 3. Mann–Whitney's smallest p there is 0.1."""
    fsdp, ddp = [0.1017, 0.1043, 0.0989], [0.0419, 0.0431, 0.0408]
    assert mann_whitney(fsdp, ddp).p == pytest.approx(0.1)
    s = speedup(fsdp, ddp)
    assert s.significant and s.test is not None and s.test.method == "pooled"
    line = verdict(baseline="fsdp", other="ddp", baseline_steps=fsdp, other_steps=ddp).line
    assert line.startswith("ddp is 2.42× faster than fsdp (95% CI 2.28–2.58")


def test_an_undecided_pair_says_how_many_more_runs_would_decide() -> None:
    base, other = [1.0, 1.3], [0.8, 1.05]
    s = speedup(base, other)
    assert not s.significant and s.test is not None and s.more_runs is not None
    needed = 2 + s.more_runs
    # the count is the first n at which the t test finds this shift at this spread 4 times in 5
    assert t_power(math.log(s.ratio), s.test.spread, needed) >= 0.8 > t_power(math.log(s.ratio), s.test.spread, needed - 1)
    assert f"{needed} runs a side would decide" in s.note and f"run {s.more_runs} more each" in s.note
    # unequal counts: Welch's test, and the note brings each side to the count
    uneven = speedup([1.0, 1.5, 2.0], [0.8, 1.2])
    assert uneven.test is not None and uneven.test.method == "welch" and "bring each to" in uneven.note


def test_two_runs_of_one_config_are_not_decided_and_say_why() -> None:
    one = verdict(baseline="fsdp ×2", other="fsdp ×2 (b)", baseline_steps=[0.47], other_steps=[0.31])
    assert not one.speedup.significant and one.speedup.test is None
    assert "not decided" in one.line and "1 run vs 1" in one.line and "run 2 more each" in one.line and "no interval" in one.line
    # five runs each from one spread: they interleave; too small a difference to chase
    a, b = [1.0, 1.2, 1.4, 1.6, 1.8], [1.1, 1.3, 1.5, 1.7, 1.9]
    five = verdict(baseline="a", other="b", baseline_steps=a, other_steps=b)
    assert not five.speedup.significant and five.speedup.low < 1 < five.speedup.high
    assert "not decided (t test on log step times p = " in five.line and "n = 5 and 5" in five.line
    assert five.speedup.more_runs is None and "treat them as equal" in five.line


def test_the_why_adds_up_to_the_difference_of_the_timed_medians() -> None:
    v = verdict(
        baseline="fsdp ×2",
        other="ddp ×2",
        baseline_steps=FSDP_TIMED,
        other_steps=DDP_TIMED,
        baseline_shares=[run_shares([FSDP_PROFILED])],
        other_shares=[run_shares([DDP_PROFILED])],
    )
    assert v.differences_s is not None and list(v.differences_s) == list(PARTS)
    total = statistics.median(FSDP_TIMED) - statistics.median(DDP_TIMED)
    assert sum(v.differences_s.values()) == pytest.approx(total, rel=0.05)
    # each part keeps its profiled share: fsdp's exposed communication is 30/77 of its 470 ms
    assert v.differences_s["exposed communication"] == pytest.approx(0.30 / 0.77 * 0.470 - 0.06 / 0.59 * 0.190)
    assert "ms exposed communication" in v.line and v.line.count("−") == 3


def test_the_unscaled_profiled_breakdown_does_not_add_up_and_is_refused() -> None:
    """The page's old why: the profiled parts' differences (180 ms) against the timed gap (280 ms)."""
    base, other = run_shares([FSDP_PROFILED]), run_shares([DDP_PROFILED])
    assert base is not None and other is not None
    unscaled = {p: base[p] * FSDP_PROFILED["step_s"] - other[p] * DDP_PROFILED["step_s"] for p in PARTS}
    total = statistics.median(FSDP_TIMED) - statistics.median(DDP_TIMED)
    with pytest.raises(VerdictError, match="the parts add up to"):
        check_adds_up(unscaled, total)
    scaled = {
        p: scaled_parts([base], statistics.median(FSDP_TIMED))[p] - scaled_parts([other], statistics.median(DDP_TIMED))[p] for p in PARTS
    }
    assert check_adds_up(scaled, total) < 1e-9


def test_run_shares_reads_both_compute_conventions_and_averages_ranks() -> None:
    # compute including the overlapped part (what the harness writes) …
    inclusive = {"compute_s": 0.8, "exposed_comm_s": 0.1, "overlapped_comm_s": 0.2, "idle_s": 0.1, "step_s": 1.0}
    # … and compute without it (the four parts sum to the step)
    exclusive = {"compute_s": 0.6, "exposed_comm_s": 0.1, "overlapped_comm_s": 0.2, "idle_s": 0.1, "step_s": 1.0}
    for b in (inclusive, exclusive):
        assert run_shares([b]) == pytest.approx({"compute": 0.8, "exposed communication": 0.1, "idle": 0.1})
    two = run_shares([inclusive, {"compute_s": 0.6, "exposed_comm_s": 0.3, "idle_s": 0.1, "step_s": 1.0}])
    assert two == pytest.approx({"compute": 0.7, "exposed communication": 0.2, "idle": 0.1})
    assert run_shares([]) is None


@pytest.mark.parametrize(
    ("base", "other", "message"),
    [
        ([], [0.2], "baseline: no runs"),
        ([0.2], [0.0], "other: step times must be finite and positive"),
        ([math.nan], [0.2], "baseline: step times must be finite and positive"),
        ([0.2], [-1.0], "other: step times must be finite and positive"),
    ],
)
def test_bad_numbers_are_refused_naming_the_side(base: list[float], other: list[float], message: str) -> None:
    with pytest.raises(VerdictError, match=message):
        speedup(base, other)


def test_scaled_parts_refuse_what_cannot_be_scaled() -> None:
    with pytest.raises(VerdictError, match="no run has a step split"):
        scaled_parts([], 0.2)
    with pytest.raises(VerdictError, match="timed median must be finite and positive"):
        scaled_parts([{"compute": 1.0, "exposed communication": 0.0, "idle": 0.0}], math.inf)
