"""The host-speed probe: its stored value is bounded, its normalisation cancels a host slowdown,
and the worker's timing of it returns what the model accepts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from parallab.core import hostspeed
from parallab.core.hostspeed import HostSpeed, from_samples, normalise
from parallab.core.result import ResultDocument
from workers.hostspeed import SpeedProbe, rates


def test_a_probe_is_stored_with_its_definition_and_its_mean() -> None:
    speed = from_samples([1e7, 2e7], [3e7])
    assert speed.probe == hostspeed.PROBE and speed.version == hostspeed.PROBE_VERSION and speed.ops == hostspeed.PROBE_OPS
    assert speed.ops_per_s == pytest.approx(2e7)
    assert HostSpeed.model_validate_json(speed.model_dump_json()) == speed


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"before_ops_per_s": [-1.0]}, "before_ops_per_s[0]"),
        ({"after_ops_per_s": [1e7, 1e13]}, "after_ops_per_s[1]"),
        ({"ops_per_s": 0.0}, "ops_per_s"),
        ({"ops_per_s": 1e13}, "ops_per_s"),
        ({"before_ops_per_s": []}, "before_ops_per_s"),
        ({"before_ops_per_s": [1e7] * 65}, "before_ops_per_s"),
        ({"probe": "my-own-loop"}, "probe"),
        ({"version": 0}, "version"),
        ({"lanes": 0}, "lanes"),
        ({"extra": 1}, "extra"),
    ],
)
def test_a_bad_probe_is_refused_naming_its_field(change: dict[str, object], field: str) -> None:
    good = from_samples([1e7], [1e7]).model_dump()
    with pytest.raises(ValidationError) as err:
        HostSpeed.model_validate({**good, **change})
    assert field in str(err.value)
    with pytest.raises(ValidationError):
        HostSpeed.model_validate({**good, "ops_per_s": math.inf})


def test_no_probe_is_refused() -> None:
    with pytest.raises(ValueError, match="no probe sample"):
        from_samples([], [])


def test_normalisation_cancels_a_host_that_runs_everything_slower() -> None:
    tokens, step, speed = 5000.0, 0.1, 2e7
    for f in (1.0, 0.5, 0.8):  # the host runs the job and the probe f times as fast
        assert normalise(tokens * f, speed * f, higher_is_better=True) == pytest.approx(250.0)  # tokens per Mop
        assert normalise(step / f, speed * f, higher_is_better=False) == pytest.approx(2.0)  # Mops a step
    # a code change (the job slower, the probe not) stays in the normalised value
    assert normalise(tokens * 0.8, speed, higher_is_better=True) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="ops_per_s"):
        normalise(tokens, 0.0, higher_is_better=True)


def test_the_worker_times_the_probe_before_and_after() -> None:
    assert all(r > 0 for r in rates(2))
    probe = SpeedProbe(repeats=2)
    assert probe.stop() is None, "not started: nothing to say"
    probe.start()
    speed = probe.stop()
    assert speed is not None and len(speed.before_ops_per_s) == len(speed.after_ops_per_s) == 2
    unfinished = SpeedProbe(repeats=1)
    unfinished.start()
    ended = unfinished.stop(ended=False)
    assert ended is not None and ended.after_ops_per_s == [] and ended.ops_per_s == ended.before_ops_per_s[0]


def test_the_probe_runs_in_one_lane_per_rank_and_a_slower_lane_shows() -> None:
    probe = SpeedProbe(repeats=2, lanes=2)
    probe.start()
    speed = probe.stop()
    assert speed is not None and speed.lanes == 2 and len(speed.before_ops_per_s) == len(speed.after_ops_per_s) == 2
    assert probe._pool is None, "the lanes are closed with the probe"
    one, two = from_samples([1e7], [], lanes=1), from_samples([1e7], [], lanes=2)
    assert not hostspeed.comparable(one, two) and hostspeed.comparable(two, from_samples([2e7], [3e7], lanes=2))


def test_the_result_document_field_is_optional() -> None:
    field = ResultDocument.model_fields["host_speed"]
    assert field.default is None and not field.is_required()


def test_the_probe_timed_in_the_ranks_is_the_mean_over_them_sample_by_sample() -> None:
    speed = hostspeed.from_ranks([[1e7, 2e7], [3e7, 4e7]], [[5e7], [7e7]])
    assert speed is not None and speed.where == "steps" and speed.lanes == 2
    assert speed.before_ops_per_s == [2e7, 3e7] and speed.after_ops_per_s == [6e7] and speed.ops_per_s == pytest.approx(11e7 / 3)
    assert hostspeed.from_ranks([[], []], [[], []]) is None, "no rank timed it: the launcher's probe stands"
    one = hostspeed.from_ranks([[1e7], []], [[2e7], []])
    assert one is not None and one.lanes == 1
    assert not hostspeed.comparable(speed, from_samples([2e7], [6e7], lanes=2)), "timed around the launch: another unit"


def test_a_probe_lane_imports_no_pydantic() -> None:
    """Each lane is a spawned process that imports `workers.hostspeed` to run the probe: it does
    not pay for the core's pydantic models, which only the rates' caller needs."""
    code = "import sys, workers.hostspeed; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'parallab')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
