"""A sweep on an uncalibrated pool calibrates first: one `calibrate` run queued on the pool ahead
of the sweep's runs (the broker hands it out first, and it is the pool's oldest queued run), none
on a calibrated pool, one for two sweeps; the report says "calibrating first" with the run's link
until the calibration lands, then predicts on it. Real databases (SQLite and Postgres) and the
deployment's own broker (kombu's SQLite transport under the test home)."""

from __future__ import annotations

import queue

import pytest

from backend.db import session_scope
from backend.models import Run
from backend.queue import make_celery, pool_queue
from backend.services import hardware, sweeps
from backend.services.ingest import attach_result
from backend.store import pools as pool_store
from parallab.core.planner import spearman
from tests.backend.test_planning_api import calibrate_document, store_calibration, sweep
from tests.ui.factories import make_document


def calibrations(settings) -> list[Run]:
    with session_scope(settings.sqlalchemy_url) as session:
        runs = session.query(Run).filter(Run.strategy == "calibrate").order_by(Run.created_at).all()
        session.expunge_all()
        return runs


def queued_in_order(settings, pool: str) -> list[str]:
    """The run ids on the pool's queue, in the order the broker hands them to a worker."""
    out = []
    with make_celery(settings).connection_for_read() as conn, conn.SimpleQueue(pool_queue(settings, pool), no_ack=True) as q:
        while True:
            try:
                message = q.get(timeout=1)
            except queue.Empty:
                return out
            args = message.payload[0] if isinstance(message.payload, list) else message.payload["args"]
            out.append(args[0])


def sweep_run_ids(view: dict) -> list[str]:
    return [run_id for p in view["points"] for run_id in p["run_ids"]]


def test_a_sweep_on_an_uncalibrated_pool_queues_a_calibrate_run_ahead_of_its_own(client, settings) -> None:
    pool = hardware.pool_of(settings)
    view = sweep(client).json()
    (calibrate,) = calibrations(settings)
    assert calibrate.status == "queued" and calibrate.pool == pool and calibrate.sweep_id is None and calibrate.user_id is None
    assert calibrate.spec["strategy"]["world_size"] == 2 and calibrate.spec["workload"]["model"] == "tiny"
    assert view["calibration"]["state"] == "calibrating first" and view["calibration"]["run_id"] == calibrate.id
    assert view["calibration"]["url"] == f"/runs/{calibrate.id}"
    own = sweep_run_ids(view)
    # the worker's claim order: the pool's FIFO queue, and (a Slurm pool's agent) the oldest queued run
    assert queued_in_order(settings, pool) == [calibrate.id, *own]
    with session_scope(settings.sqlalchemy_url) as session:
        assert pool_store.next_unsubmitted(session, pool).id == calibrate.id
        assert all(session.get(Run, i).created_at > calibrate.created_at for i in own)
    page = client.get(f"/sweeps/{view['id']}").text
    assert 'data-state="calibrating first"' in page and f'href="/runs/{calibrate.id}" id="calibrate-run"' in page


def test_a_sweep_on_a_calibrated_pool_queues_no_calibration(client, settings) -> None:
    store_calibration(settings, hardware.pool_of(settings))
    view = sweep(client).json()
    assert [r.status for r in calibrations(settings)] == ["succeeded"], "only the stored calibration"
    assert view["hardware"]["calibrated"] and view["calibration"]["state"] == "calibrated" and view["calibration"]["run_id"] is None
    assert 'id="calibration-state"' not in client.get(f"/sweeps/{view['id']}").text


def test_two_sweeps_wait_for_one_calibration(client, settings) -> None:
    first = sweep(client).json()
    second = sweep(client, top=2, controls=0).json()
    (calibrate,) = calibrations(settings)
    assert first["calibration"]["run_id"] == second["calibration"]["run_id"] == calibrate.id
    assert queued_in_order(settings, hardware.pool_of(settings)) == [calibrate.id, *sweep_run_ids(first), *sweep_run_ids(second)]


def test_the_report_predicts_on_the_calibration_once_it_lands(client, settings) -> None:
    view = sweep(client, top=3, controls=1).json()
    calibrate_id = view["calibration"]["run_id"]
    measured = [9_000.0, 12_000.0, 4_000.0, 3_000.0]
    with session_scope(settings.sqlalchemy_url) as session:
        attach_result(session, run=session.get(Run, calibrate_id), document=calibrate_document(), pool=hardware.pool_of(settings))
        for point, tps in zip(view["points"], measured, strict=True):
            run = session.get(Run, point["run_id"])
            attach_result(session, run=run, document=make_document(strategy=point["strategy"], world_size=2, tokens_per_s=tps))
    done = client.get(f"/api/v1/sweeps/{view['id']}").json()
    assert done["calibration"]["state"] == "calibrated since" and "calibrated on 2 rank(s)" in done["calibration"]["predicted_on"]
    with session_scope(settings.sqlalchemy_url) as session:
        hw = hardware.pool_hardware(session=session, settings=settings, pool=hardware.pool_of(settings))
        expected = [sweeps.evaluate(session.get(Run, p["run_id"]).spec, hw).tokens_per_s for p in view["points"]]
    predicted = [p["predicted"]["tokens_per_s"] for p in done["points"]]
    assert predicted == pytest.approx(expected)
    assert [p["predicted_uncalibrated"]["tokens_per_s"] for p in done["points"]] == [p["predicted"]["tokens_per_s"] for p in view["points"]]
    assert predicted != pytest.approx([p["predicted"]["tokens_per_s"] for p in view["points"]]), "the calibration moves them"
    assert done["spearman"] == pytest.approx(spearman(predicted, measured))
    page = client.get(f"/sweeps/{view['id']}").text
    assert 'data-state="calibrated since"' in page and "re-made on the pool&#39;s calibration" in page


def test_the_datasheet_prediction_is_reproduced_from_a_runs_spec(client, settings) -> None:
    """What `repredict` rests on: a queued run's spec (steps, name, tags and all) predicts what its plan row did."""
    view = sweep(client).json()
    with session_scope(settings.sqlalchemy_url) as session:
        hw = hardware.pool_hardware(session=session, settings=settings, pool=hardware.pool_of(settings))
        again = [sweeps.evaluate(session.get(Run, p["run_id"]).spec, hw).tokens_per_s for p in view["points"]]
    assert again == pytest.approx([p["predicted"]["tokens_per_s"] for p in view["points"]])
