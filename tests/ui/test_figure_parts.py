"""The step-time split the run and compare pages draw."""

from __future__ import annotations

import pytest

from backend.figures.common import step_parts


def test_step_split_without_a_pipeline() -> None:
    parts = step_parts({"step_times_s": [0.9, 1.0, 1.1], "comm": [{"time_s": 0.3}, {"time_s": 0.1}]})
    assert parts == pytest.approx({"compute": 0.6, "communication": 0.4, "bubble": 0.0})


def test_pipeline_bubble_is_carved_out_of_the_receive_time_not_counted_twice() -> None:
    # 0.5 s of P2P per step, of which 0.3 s is the stage waiting for its neighbour (the bubble).
    parts = step_parts({"step_times_s": [1.0], "comm": [{"time_s": 0.4}, {"time_s": 0.1}], "bubble_fraction": 0.3})
    assert parts == pytest.approx({"compute": 0.5, "communication": 0.2, "bubble": 0.3})
    assert sum(parts.values()) == pytest.approx(1.0)
