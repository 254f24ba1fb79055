"""`benchmarks/sweep.py`'s accuracy line: each configuration's step-time error and their mean
against the goals a calibrated sweep is held to (mean absolute error ≤ 15 %, ρ ≥ 0.9), read
against the sweep's one calibration, at the runs' host speed, and against each round's own."""

from __future__ import annotations

import pytest

from benchmarks.sweep import (
    RHO_GOAL,
    STEP_ERROR_GOAL,
    accuracy_line,
    host_speed_section,
    probe_rates,
    recalibrated_section,
    step_errors,
)


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


def test_each_configurations_error_is_read_again_at_its_runs_host_speed():
    """Predicted 100 tokens/s on a calibration at 50 Mops/s; its runs' probe read 40, 45 and 60
    (median 45: the host at 0.9 of the calibration's speed), measured 81 tokens/s: −19 % as
    predicted, −10 % at the runs' host speed. A launch-side probe is another unit and is not read.
    The mean over configurations is of the carried errors."""
    stored = {
        "cal": {"ops_per_s": 50e6, "where": "steps"},
        "r1": {"ops_per_s": 40e6, "where": "steps"},
        "r2": {"ops_per_s": 45e6, "where": "steps"},
        "r3": {"ops_per_s": 60e6, "where": "steps"},
        "r4": {"ops_per_s": 10e6, "where": "launch"},
    }
    point = {
        **_point(100.0, 81.0),
        "run_ids": ["r1", "r2", "r3", "r4"],
        "label": "ddp dp4",
        "precision": "fp32",
        "activation_checkpointing": "none",
        "grad_accumulation_steps": 1,
    }
    other = {**point, **_point(50.0, 50.0), "run_ids": ["r3"], "label": "pp pp4"}  # at 1.2: 60 tokens/s carried, −16.7 %
    third = {**point, **_point(200.0, 150.0), "run_ids": ["r1"], "label": "fsdp dp4"}  # at 0.8: 160 carried, −6.25 %
    text = host_speed_section({"points": [point, other, third]}, probe_rates(stored), "cal")
    row = next(line for line in text.splitlines() if line.startswith("| ddp dp4"))
    assert "| 0.90 (0.80–1.20) | -19.0% | -10.0% |" in row
    assert "Mean absolute step-time error over 3 configurations: 11.0%" in text and "ρ 1.00" in text


def test_a_calibration_without_an_in_rank_probe_is_said():
    text = host_speed_section({"points": [_point(100.0, 81.0)]}, probe_rates({"cal": {"ops_per_s": 5e7, "where": "launch"}}), "cal")
    assert "no probe timed in its ranks" in text


def _labelled(label: str, run_ids: list[str]) -> dict:
    return {
        **_point(0.0, None),
        "run_ids": run_ids,
        "label": label,
        "precision": "fp32",
        "activation_checkpointing": "none",
        "grad_accumulation_steps": 1,
    }


def test_each_run_is_read_against_the_calibration_of_its_own_round():
    """ddp's three rounds predicted 100, 80 and 90 tokens/s (each round's calibration) and measured
    90, 84 and 81: −10 %, +5 %, −10 %, median −10 %. pp's two rounds: +10 % and +30 %, median +20 %
    (a round whose run failed, or that was not predicted, is not read); fsdp's one round 0 %. The
    mean is 10 %, and ρ ranks the median predictions (90, 45, 30) against the measured medians
    (84, 53.5, 30)."""
    predicted = {"d1": 100.0, "d2": 80.0, "d3": 90.0, "p1": 50.0, "p2": 40.0, "p4": 70.0, "f1": 30.0}
    measured: dict[str, float | None] = {"d1": 90.0, "d2": 84.0, "d3": 81.0, "p1": 55.0, "p2": 52.0, "p3": 60.0, "p4": None, "f1": 30.0}
    points = [_labelled("ddp dp4", ["d1", "d2", "d3"]), _labelled("pp pp4", ["p1", "p2", "p3", "p4"]), _labelled("fsdp dp4", ["f1"])]
    view = {"points": points}
    text = recalibrated_section(view, predicted, measured)
    ddp = next(line for line in text.splitlines() if line.startswith("| ddp dp4"))
    pp = next(line for line in text.splitlines() if line.startswith("| pp pp4"))
    assert ddp.endswith("| 100, 80, 90 | 90, 84, 81 | -10.0% |")
    assert pp.endswith("| 50, 40 | 55, 52 | +20.0% |")
    assert "Mean absolute step-time error over 3 configurations: 10.0%" in text and "ρ 1.00" in text
