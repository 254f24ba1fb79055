"""Calibration first: an uncalibrated pool plans on its own device's name and says how to calibrate
it (plan page and CLI); the plan page's device is the one the ranking is for."""

from __future__ import annotations

import re

from backend.db import session_scope
from backend.services import hardware
from backend.services import workers as fleet
from backend.services.workers import WorkerInfo
from tests.backend.plan_cli import run_plan_cli
from tests.backend.test_planning_api import store_calibration

EPYC = "AMD EPYC 7B13 64-Core Processor"


def register(settings, pool: str, device_name: str) -> None:
    info = WorkerInfo(
        id=f"w-{pool}",
        host="bench-host",
        machine="bench-host:boot",
        address="127.0.0.1",
        pid=1,
        pool=pool,
        device="cpu",
        device_name=device_name,
        device_count=2,
        memory_per_device_bytes=8 << 30,
        interconnect="cpu",
    )
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=info)


def test_an_uncalibrated_pool_plans_on_its_own_cpu_and_says_to_calibrate_until_it_is(client, settings) -> None:
    register(settings, "cpu", EPYC)
    with session_scope(settings.sqlalchemy_url) as session:
        hw = hardware.pool_hardware(session=session, settings=settings, pool="cpu")
        advice = hardware.calibration_advice(session=session, settings=settings, pool="cpu")
    assert EPYC in hw.label and "Xeon" not in hw.label and not hw.calibrated and hw.per_node == 2
    assert advice is not None and "pool 'cpu' has no calibration" in advice and "--strategy calibrate" in advice
    page = client.get("/plan", params={"model": "tiny", "device": "pool"}).text
    assert 'id="calibration-advice"' in page and "has no calibration" in page
    store_calibration(settings, "cpu")
    with session_scope(settings.sqlalchemy_url) as session:
        assert hardware.calibration_advice(session=session, settings=settings, pool="cpu") is None
        assert hardware.pool_hardware(session=session, settings=settings, pool="cpu").calibrated
    assert 'id="calibration-advice"' not in client.get("/plan", params={"model": "tiny", "device": "pool"}).text


def test_the_plan_cli_says_a_pool_is_uncalibrated(settings, monkeypatch) -> None:
    result = run_plan_cli(settings, monkeypatch, ["--model", "tiny", "--pool", "nowhere", "--top", "1"])
    assert result.exit_code == 0, result.output
    assert "pool 'nowhere' has no calibration" in result.stderr and "calibrate" in result.stderr


def test_the_plan_page_selects_the_device_it_ranked_on(client) -> None:
    page = client.get("/plan", params={"model": "tiny", "device": "h100", "nodes": 1, "gpus_per_node": 4}).text
    selected = re.findall(r'<option value="([\w-]+)" selected>', page)
    assert "h100-sxm" in selected and "a100-40gb" not in selected
    assert "4 ranks on 1 × 4 NVIDIA H100 SXM5" in page
