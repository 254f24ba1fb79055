"""Devices are what the pool declares, the same everywhere: a CPU host's worker registers its
devices (on CPU, `max_world_size` ranks, whatever its core count), and the submit form, the
workers page, the /plan page, the plan API and `parallab plan` all count those — a calibration
run at 2 ranks does not make the planner's pool 2 devices while the form offers 8."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from backend.db import session_scope
from backend.services import hardware
from backend.services import workers as fleet
from tests.backend.plan_cli import run_plan_cli
from tests.backend.test_planning_api import store_calibration
from workers.fleet import describe


def _one(pattern: str, text: str, where: str) -> int:
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{where}: {pattern!r} found {found}"
    return int(found[0])


def devices_everywhere(client, settings, monkeypatch) -> dict[str, int]:
    """The pool 'cpu''s devices per host as each place shows them."""
    cli = run_plan_cli(settings, monkeypatch, ["--model", "tiny", "--pool", "cpu", "--top", "1"])
    assert cli.exit_code == 0, cli.output
    ranked = client.get("/api/v1/plan", params={"mode": "rank", "model": "tiny", "pool": "cpu"}).json()
    return {
        "form": _one(r'<option value="cpu" data-hosts="\d+" data-devices="(\d+)"', client.get("/runs/new").text, "form"),
        "workers page": _one(r"<dt>Devices per host</dt><dd>(\d+)</dd>", client.get("/workers").text, "workers page"),
        "plan page": _one(r"\d+ ranks on 1 × (\d+) ", client.get("/plan", params={"model": "tiny", "device": "pool"}).text, "plan page"),
        "plan api": ranked["world_size"],
        "plan cli": _one(r"on 1 × (\d+) ", cli.stdout, "plan cli"),
    }


def check_agree(seen: dict[str, int], declared: int) -> None:
    assert set(seen.values()) == {declared}, seen


def _declared(monkeypatch: pytest.MonkeyPatch) -> None:
    pass


def _calibrations_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's old source: a calibrated CPU pool is as many devices as its calibration had ranks."""
    monkeypatch.setattr(hardware, "declared_devices", lambda **_: None)


@pytest.mark.parametrize("source", [_declared, _calibrations_ranks], ids=["declared", "calibration-ranks"])
def test_the_form_the_workers_page_and_the_planner_count_the_pools_declared_devices(
    client, settings, monkeypatch, source: Callable[[pytest.MonkeyPatch], None]
) -> None:
    info = describe(settings, pool="cpu")  # this host's worker, as `parallab worker` registers it
    assert info.device == "cpu" and info.device_count == settings.limits.max_world_size > 2  # not the calibration's 2 ranks
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=info)
    store_calibration(settings, "cpu")  # a calibration run at 2 ranks
    with session_scope(settings.sqlalchemy_url) as session:
        hw = hardware.pool_hardware(session=session, settings=settings, pool="cpu")
    assert hw.calibrated and "calibrated on 2 rank(s)" in hw.label

    source(monkeypatch)
    seen = devices_everywhere(client, settings, monkeypatch)
    if source is _declared:
        check_agree(seen, info.device_count)
    else:  # the check catches a planner that reads another source
        assert seen["plan page"] == seen["plan api"] == seen["plan cli"] == 2 and seen["form"] == seen["workers page"] == info.device_count
        with pytest.raises(AssertionError):
            check_agree(seen, info.device_count)


def test_a_pool_whose_workers_are_gone_plans_on_what_they_declared(settings) -> None:
    """No live worker: the form offers nothing, and the planner keeps the devices the pool last declared."""
    info = describe(settings, pool="cpu")
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=info)
        worker = fleet.store.get_worker(session, info.id)
        worker.heartbeat_at = worker.heartbeat_at.replace(year=2000)
    store_calibration(settings, "cpu")
    with session_scope(settings.sqlalchemy_url) as session:
        assert fleet.pool_capacities(session, settings)["cpu"].hosts == 0
        assert hardware.declared_devices(session=session, settings=settings, pool="cpu") == info.device_count
        assert hardware.pool_hardware(session=session, settings=settings, pool="cpu").devices == info.device_count
        assert hardware.declared_devices(session=session, settings=settings, pool="nowhere") is None
