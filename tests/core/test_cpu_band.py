"""A calibrated CPU pool's prediction carries the band measured on such a pool (`profiles/bands_cpu.json`);
an uncalibrated one stays outside every validated regime, and a run's own row can be held out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parallab.core import accuracy
from parallab.core.accuracy import OUTSIDE, accuracy_of, band_for, cpu_bands
from parallab.core.hardware import DeviceDescription, HardwareProfile, load_catalogue
from parallab.core.jobs import Limits, resolve_job
from parallab.core.plan_hardware import hardware_for
from parallab.core.spec import JobSpec

CPU = load_catalogue().get("cpu")
PROFILE = HardwareProfile(device=DeviceDescription(kind="cpu", name="a test CPU", cores=2), world_size=2, op_overhead_s=5e-6)


def tp2():
    doc = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "tp", "world_size": 2}}
    return resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=8, max_steps=10))


@pytest.fixture()
def bands_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bands_cpu.json"
    rows = [{"name": "tp=2 across at 50mbit", "step_time_error": -0.31}, {"name": "tp 4 at 500mbit", "step_time_error": 0.12}]
    path.write_text(json.dumps({"source": "test", "bands": {"tp/eager": rows}}))
    monkeypatch.setattr(accuracy, "cpu_bands", lambda: accuracy._read(path))
    return path


def test_a_calibrated_cpu_pool_states_the_band_of_its_measured_runs(bands_file: Path) -> None:
    said = accuracy_of(tp2(), hardware_for(CPU, profile=PROFILE))
    band = said["band"]
    assert said["regime"] == "validated" and band is not None
    assert (band["kind"], band["step_time_share"], band["n"], band["memory_share"]) == ("tp/eager", 0.31, 2, None)
    assert "calibrated CPU pool" in band["basis"]


def test_an_uncalibrated_cpu_pool_states_none(bands_file: Path) -> None:
    said = accuracy_of(tp2(), hardware_for(CPU, devices_per_node=2))
    assert said["band"] is None and said["regime"].startswith(OUTSIDE)


def test_a_run_held_out_of_its_own_band_leaves_the_others() -> None:
    rows = {"tp/eager": [{"name": "a", "step_time_error": -0.31}, {"name": "b", "step_time_error": 0.12}]}
    held = band_for("tp/eager", leave_out="a", bands=rows)
    assert held is not None and (held["step_time_share"], held["n"]) == (0.12, 1)
    assert band_for("tp/eager", leave_out="a", bands={"tp/eager": rows["tp/eager"][:1]}) is None


def test_the_packaged_cpu_band_covers_the_layouts_it_was_measured_on() -> None:
    bands = cpu_bands()
    assert set(bands) >= {"dp/eager", "tp/eager"}
    assert all(r["name"] and isinstance(r["step_time_error"], float) for runs in bands.values() for r in runs)
