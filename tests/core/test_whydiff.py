"""The diff of two runs that explains the difference, on synthetic documents (`parallab.core.whydiff`)."""

from __future__ import annotations

import pytest

from parallab.core.whydiff import NotExplained, explain, lines, share_of


def doc(step: float, parts: dict[str, float]) -> dict:
    return {"summary": {"step_time_s": {"median": step}}, "critical_path": {"rank_parts_s": parts, "rank_step_s": sum(parts.values())}}


# the profiled window runs 2x slower than the timed steps, on both sides
A = [doc(1.00 + e, {"compute matmul": 1.2, "transfer dp_shard all_gather": 0.4, "idle": 0.4 + 2 * e}) for e in (0.0, 0.01, -0.01)]
B = [doc(1.20 + e, {"compute matmul": 1.2, "transfer dp_shard all_gather": 0.8, "idle": 0.4 + 2 * e}) for e in (0.0, 0.01, -0.01)]


def test_the_difference_is_put_on_the_part_that_moved():
    why = explain(A, B)
    assert why.scale == pytest.approx(0.5, rel=1e-3)
    assert why.measured_delta_s == pytest.approx(0.2)
    top = why.parts[0]
    assert top.part == "transfer dp_shard all_gather" and top.delta_s == pytest.approx(0.2, rel=1e-2)
    assert share_of(why, "all_gather") == pytest.approx(1.0, rel=1e-2)
    assert why.adds_up and why.residual_fraction is not None and why.residual_fraction < 0.01
    assert top.interval_s is not None and top.interval_s < 0.01 and why.measured_interval_s is not None
    text = "\n".join(lines(why))
    assert "all_gather" in text and "residual" in text and "add up" in text


def test_a_window_that_does_not_move_like_the_timed_steps_leaves_a_residual():
    # B's timed step grows by 0.2 s but its window by nothing: the parts cannot explain it
    flat = [doc(1.20, {"compute matmul": 1.2, "transfer dp_shard all_gather": 0.4, "idle": 0.4}) for _ in range(3)]
    why = explain(A, flat)
    assert not why.adds_up and why.residual_fraction is not None and why.residual_fraction > 0.9
    assert "do NOT add up" in "\n".join(lines(why))


def test_a_single_run_a_side_has_no_interval():
    why = explain(A[:1], B[:1])
    assert why.measured_interval_s is None and all(p.interval_s is None for p in why.parts)


def test_a_run_without_its_analysis_is_refused_naming_the_field():
    with pytest.raises(NotExplained, match="critical_path.rank_parts_s"):
        explain(A, [{"summary": {"step_time_s": {"median": 1.0}}}])
    with pytest.raises(NotExplained, match="step_time_s"):
        explain([{"critical_path": {}}], B)
