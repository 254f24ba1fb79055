"""The calibrate job's timing (workers.harness.everyrank.timed): each point spans enough calls.
A fake clock makes each call last exactly what the test says, whatever the host's load."""

from __future__ import annotations

import pytest
import torch

from workers.harness import everyrank


def clocked(monkeypatch: pytest.MonkeyPatch, seconds_per_call: float) -> tuple[list[int], object]:
    clock, calls = [0.0], []

    def call() -> None:
        calls.append(1)
        clock[0] += seconds_per_call

    monkeypatch.setattr(everyrank.time, "perf_counter", lambda: clock[0])
    return calls, call


def test_a_short_call_is_repeated_until_the_points_time_spans_min_seconds(monkeypatch):
    calls, call = clocked(monkeypatch, 0.002)
    seconds = everyrank.timed(call, 3, torch.device("cpu"), 1, min_seconds=0.05)
    assert len(calls) == 1 + 25  # the untimed call, then 50 ms of 2 ms calls (not the 3 asked for)
    assert seconds == pytest.approx(0.002)


def test_a_call_longer_than_min_seconds_is_timed_once_after_the_untimed_one(monkeypatch):
    calls, call = clocked(monkeypatch, 0.03)
    everyrank.timed(call, 3, torch.device("cpu"), 1, min_seconds=0.02)
    assert len(calls) == 2
    calls.clear()
    everyrank.timed(call, 3, torch.device("cpu"), 1, min_seconds=0)  # no minimum: the count asked for
    assert len(calls) == 4
