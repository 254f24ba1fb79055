"""`benchmarks/sweep.py`'s accuracy line: each configuration's step-time error and their mean
against the goals a calibrated sweep is held to (mean absolute error ≤ 15 %, ρ ≥ 0.9)."""

from __future__ import annotations

import pytest

from benchmarks.sweep import RHO_GOAL, STEP_ERROR_GOAL, accuracy_line, step_errors


def _point(predicted: float, measured: float | None) -> dict:
    return {"predicted": {"tokens_per_s": predicted}, "measured": {"tokens_per_s": measured}}


def test_a_configurations_step_time_error_is_the_inverse_of_its_tokens_ratio():
    """Predicted 100 tokens/s, measured 80: the predicted step is 20 % short; unfinished runs count for nothing."""
    assert step_errors([_point(100.0, 80.0), _point(100.0, 125.0), _point(100.0, None)]) == pytest.approx([-0.20, 0.25])


@pytest.mark.parametrize(
    ("measured", "rho", "met"),
    [((90.0, 110.0), 0.95, True), ((80.0, 110.0), 0.95, False), ((90.0, 110.0), 0.85, False)],
)
def test_the_accuracy_line_holds_both_goals(measured: tuple[float, float], rho: float, met: bool):
    errors = step_errors([_point(100.0, m) for m in measured])
    line = accuracy_line(errors, rho)
    mae = sum(abs(e) for e in errors) / len(errors)
    assert f"{mae:.1%}" in line and line.endswith("not met") != met
    assert (mae <= STEP_ERROR_GOAL and rho >= RHO_GOAL) == met


def test_no_finished_runs_say_so():
    assert "not enough finished runs" in accuracy_line([], None)
