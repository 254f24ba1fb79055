"""The diff of two runs that explains the difference, on synthetic documents (`parallab.core.whydiff`)."""

from __future__ import annotations

import pytest

from parallab.core.whydiff import NotExplained, explain, lines, share_of


def doc(step: float, parts: dict[str, float]) -> dict:
    return {"summary": {"step_time_s": {"median": step}}, "critical_path": {"rank_parts_s": parts, "rank_step_s": sum(parts.values())}}


# The timed step is the profiled one plus 0.3 s on both sides (the loop's, not the configuration's);
# B's all-gathers take 0.2 s more. Run-to-run noise on the idle part and the timed step alike.
A = [doc(1.00 + e, {"compute matmul": 0.4, "transfer dp_shard all_gather": 0.2, "idle": 0.1 + e}) for e in (0.0, 0.01, -0.01)]
B = [doc(1.20 + e, {"compute matmul": 0.4, "transfer dp_shard all_gather": 0.4, "idle": 0.1 + e}) for e in (0.0, 0.01, -0.01)]


def test_the_difference_is_put_on_the_part_that_moved():
    why = explain(A, B)
    assert why.measured_delta_s == pytest.approx(0.2)
    assert why.offset_a_s == pytest.approx(0.3) and why.offset_b_s == pytest.approx(0.3)
    top = why.parts[0]
    assert top.part == "transfer dp_shard all_gather" and top.delta_s == pytest.approx(0.2)
    assert share_of(why, "all_gather") == pytest.approx(1.0)
    assert why.adds_up and why.residual_fraction is not None and why.residual_fraction < 0.01
    assert top.interval_s is not None and top.interval_s < 0.01 and why.measured_interval_s is not None
    assert why.residual_interval_s is not None and why.residual_interval_s < 0.01
    text = "\n".join(lines(why))
    assert "all_gather" in text and "residual" in text and "add up" in text and "+300.00 ms (A)" in text


def test_an_offset_both_sides_share_cancels_however_long_their_steps():
    # A 1.0 s step and a 3.0 s one, each its profiled step plus the same 0.3 s: the parts explain
    # the 2.0 s. One factor (timed over profiled, all runs: 4.0 / 3.4) would put 2.35 s on them.
    short = [doc(1.0, {"compute matmul": 0.5, "transfer dp_shard all_gather": 0.2})]
    long = [doc(3.0, {"compute matmul": 0.5, "transfer dp_shard all_gather": 2.2})]
    why = explain(short, long)
    assert why.parts_sum_s == pytest.approx(2.0) and why.residual_s == pytest.approx(0.0, abs=1e-12)
    assert why.adds_up and share_of(why, "all_gather") == pytest.approx(1.0)


def test_a_window_that_does_not_move_like_the_timed_steps_leaves_a_residual():
    # B's timed step grows by 0.2 s but its window by nothing: the parts cannot explain it
    flat = [doc(1.20, {"compute matmul": 0.4, "transfer dp_shard all_gather": 0.2, "idle": 0.1}) for _ in range(3)]
    why = explain(A, flat)
    assert not why.adds_up and why.residual_fraction is not None and why.residual_fraction > 0.9
    assert why.offset_b_s - why.offset_a_s == pytest.approx(why.residual_s)
    assert "do NOT add up" in "\n".join(lines(why))


def test_an_attribution_that_drops_a_part_fails_the_claim():
    # B's extra all-gather time lost by the split (the part dropped, the profiled step unchanged)
    dropped = [{**d, "critical_path": {**d["critical_path"], "rank_parts_s": {"compute matmul": 0.4, "idle": 0.1}}} for d in B]
    why = explain(A, dropped)
    assert not why.adds_up and why.residual_s == pytest.approx(0.4)
    assert why.profiled_delta_s == pytest.approx(0.2)  # the window saw it; the parts did not


def test_the_profilers_cost_that_differs_between_sides_is_not_hidden():
    # Each window step twice its timed step (the profiler's per-op cost on CPU): the parts'
    # change is twice the measured one, and the diff says they do not add up.
    slow_a = [doc(1.0, {"compute matmul": 1.6, "idle": 0.4})]
    slow_b = [doc(1.2, {"compute matmul": 2.0, "idle": 0.4})]
    why = explain(slow_a, slow_b)
    assert why.residual_s == pytest.approx(-0.2) and not why.adds_up


def test_a_single_run_a_side_has_no_interval():
    why = explain(A[:1], B[:1])
    assert why.measured_interval_s is None and why.residual_interval_s is None and all(p.interval_s is None for p in why.parts)


def test_a_run_without_its_analysis_is_refused_naming_the_field():
    with pytest.raises(NotExplained, match="critical_path.rank_parts_s"):
        explain(A, [{"summary": {"step_time_s": {"median": 1.0}}}])
    with pytest.raises(NotExplained, match="step_time_s"):
        explain([{"critical_path": {}}], B)


def _noisy(step: float, all_gather: float, offsets: tuple[float, ...]) -> list[dict]:
    """Runs whose timed step is the window's plus `offsets` (one a run): the offset's noise is the residual's."""
    return [
        doc(step + o, {"compute matmul": 0.4, "transfer dp_shard all_gather": all_gather, "idle": step - 0.4 - all_gather}) for o in offsets
    ]


@pytest.mark.parametrize(
    ("offsets_b", "verdict"),
    [
        ((0.0, 0.002, -0.002), "add up"),  # residual 0 ± 0.005 of 0.2: all within 5 %
        ((0.0, 0.1, -0.1), "cannot tell"),  # residual 0 ± 0.25: straddles 5 %
        ((0.3, 0.31, 0.29), "do not add up"),  # residual 0.3 ± 0.025: all beyond 5 %
        ((0.3, 0.7, -0.1), "cannot tell"),  # residual 0.3 ± 0.99: its point estimate alone would say "do not add up"
    ],
)
def test_the_verdict_weighs_the_residuals_interval(offsets_b: tuple[float, ...], verdict: str) -> None:
    a = _noisy(1.0, 0.2, (0.0, 0.0, 0.0))
    b = _noisy(1.2, 0.4, offsets_b)
    why = explain(a, b)
    assert why.verdict == verdict, "\n".join(lines(why))
    text = "\n".join(lines(why))
    assert {"add up": "the parts add up", "do not add up": "do NOT add up", "cannot tell": "cannot tell whether"}[verdict] in text


def test_without_repeats_the_point_estimate_decides() -> None:
    assert explain(A[:1], B[:1]).verdict == "add up"
    flat = [doc(1.20, {"compute matmul": 0.4, "transfer dp_shard all_gather": 0.2, "idle": 0.1})]
    assert explain(A[:1], flat).verdict == "do not add up"
