"""The planner's datasheet models held against published training runs (benchmarks/published_runs.json).

Each row's error is printed (`pytest -s`); memory must land within 10% of the reported peak, and
tokens/s within 25% or the row carries its written reason (kernel efficiency, which calibration
measures).
"""

from __future__ import annotations

import json

import pytest

from benchmarks.published import MEMORY_TOLERANCE, STEP_TIME_TOLERANCE, Checked, evaluate_run, load_runs, table
from parallab.core.hardware import load_catalogue

RUNS = load_runs()


@pytest.fixture(scope="module")
def checked() -> dict[str, Checked]:
    rows = {run["name"]: evaluate_run(run)[1] for run in RUNS}
    print("\n" + table(list(rows.values())))
    return rows


def test_every_row_names_its_source_and_its_hardware_is_in_the_catalogue():
    for run in RUNS:
        assert run["source"].startswith("https://"), run["name"]
        spec = load_catalogue().get(run["device"])
        assert all(spec.sources.get(k) for k in ("flops", "memory_bytes", "memory_bandwidth")), run["device"]


def test_torchtitans_h100_is_the_96_gb_hbm2e_part_at_500_w():
    spec = load_catalogue().get("h100-96gb")
    assert spec.memory_bytes == 96_000_000_000
    assert spec.memory_bandwidth == 2.4e12
    assert "500 W" in spec.sources["power"]


@pytest.mark.parametrize("name", [r["name"] for r in RUNS])
def test_memory_lands_within_ten_percent_of_the_reported_peak(checked, name):
    row = checked[name]
    assert abs(row.memory_error) <= MEMORY_TOLERANCE, (
        f"{name}: {row.predicted_memory_gib:.1f} GiB vs {row.published_memory_gib} ({row.memory_error:+.1%})"
    )


@pytest.mark.parametrize("name", [r["name"] for r in RUNS])
def test_step_time_lands_within_25_percent_or_the_row_says_why(checked, name):
    row = checked[name]
    if abs(row.tokens_error) <= STEP_TIME_TOLERANCE:
        return
    assert "kernel efficiency" in row.step_time_reason and "calibration" in row.step_time_reason.lower(), (
        f"{name}: {row.tokens_error:+.1%} and no reason"
    )


def test_a_row_without_a_reason_fails_the_check(tmp_path):
    """The check can fail: the same row with its reason removed is off by more than 25%."""
    run = {**RUNS[0], "step_time_reason": ""}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [run]}))
    row = evaluate_run(load_runs(path)[0])[1]
    assert abs(row.tokens_error) > STEP_TIME_TOLERANCE and not row.step_time_reason


def test_memory_check_fails_on_a_wrong_reported_peak():
    """The memory bound bites: the 8-GPU row against the 128-GPU row's 67.0 GiB is out by more than 10%."""
    row = evaluate_run({**RUNS[0], "published_memory_gib": 67.0})[1]
    assert abs(row.memory_error) > MEMORY_TOLERANCE


def test_the_configuration_torchtitan_runs_ranks_as_fitting_on_its_hardware(checked):
    """With Llama 3's grouped-query attention (`llama-3-8b`: 8 KV heads, 8.03e9 parameters) the 8-GPU
    row fits, as torchtitan ran it; the multi-head `llama-8b` (8.8e9) did not."""
    assert {run["model"] for run in RUNS} == {"llama-3-8b"}
    assert all(row.fits for row in checked.values()), {n: r.reasons for n, r in checked.items() if not r.fits}


def test_the_multi_head_shape_of_the_same_run_does_not_fit():
    """The check can fail: the same 8-GPU row on the multi-head `llama-8b` is rejected for memory."""
    row = evaluate_run({**RUNS[0], "model": "llama-8b"})[1]
    assert not row.fits and any("memory" in reason for reason in row.reasons)
