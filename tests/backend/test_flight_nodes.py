"""A gang's flight-recorder dumps in the lab database: the dumps a non-zero node hands on are read
back by node 0 (`node_flight`), and those that come after the run already ended failed are merged
into the dumps it kept and analysed again (`merge_late_flight`). Node 0's end and another node's
hand-over race: whichever is written second merges the other's dumps, under the run's lock."""

from __future__ import annotations

import threading

import pytest

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run
from backend.services.ledger import DbLedger
from backend.store import runs as store
from parallab.core.hangs import kept
from parallab.core.jobs import Limits, resolve_job
from parallab.core.ledger import End, Ending
from parallab.core.spec import JobSpec
from tests.backend.test_fleet import info
from tests.core.test_hangs import agreeing, dump, entry

SPEC = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}, "placement": {"nodes": 2}}
GROUPS = {"0": {"desc": "default_pg", "ranks": [0, 1]}}


def add_run(settings: Settings, status: str) -> str:
    job = resolve_job(JobSpec.model_validate(SPEC), Limits(max_world_size=8))
    with session_scope(settings.sqlalchemy_url) as session:
        run = Run(
            name=None, status=status, source="api", spec=SPEC, job=job.model_dump(mode="json"), strategy="ddp", world_size=2, model="tiny"
        )
        return store.add_run(session, run).id


def rank_dumps(run_id: str) -> tuple[str, str]:
    """Rank 0 in all_reduce, rank 1 in barrier at the same collective: the two ranks' dumps."""
    rank0 = dump(0, [*agreeing(2), entry("0", 3, "all_reduce")], world=2, run=run_id, groups=GROUPS).decode()
    rank1 = dump(1, [*agreeing(2), entry("0", 3, "barrier", [])], world=2, run=run_id, groups=GROUPS).decode()
    return rank0, rank1


def hand_on(settings: Settings, run_id: str, rank1: str) -> None:
    """Node 1 ends, stopped, and hands its rank's dump on."""
    DbLedger(settings).finish_node(
        run_id, 1, info("host-1"), status="stopped", reason="stopped", records=None, traces={}, flight={1: rank1}
    )


def kept_report(settings: Settings, run_id: str) -> dict:
    with session_scope(settings.sqlalchemy_url) as session:
        value = store.get_flight_recorder(session, run_id)
    assert value is not None
    return value["report"]


def test_a_late_nodes_dumps_are_merged_into_the_kept_ones_and_analysed_with_them(settings: Settings) -> None:
    run_id = add_run(settings, "failed")
    rank0, rank1 = rank_dumps(run_id)
    with session_scope(settings.sqlalchemy_url) as session:
        first = kept({0: rank0}, world_size=2, run=run_id)  # node 0's end: rank 1's dump not here yet
        assert first is not None and first["report"]["dumps"] == {"0": "ok", "1": "missing"}
        store.set_flight_recorder(session, run_id, first)
    with session_scope(settings.sqlalchemy_url) as session:  # node 1 ends after the run did
        store.add_node_flight(session, run_id, 1, {1: rank1})
        store.merge_late_flight(session, run_id, world_size=2, files={1: rank1})
    with session_scope(settings.sqlalchemy_url) as session:
        assert store.node_flight(session, run_id) == {1: rank1}
        value = store.get_flight_recorder(session, run_id)
        assert store.flight_recorder_dumps(session, run_id) == 2
    assert value is not None and value["dumps"]["1"]["rank"] == 1 and value["dumps"]["0"]["rank"] == 0
    report = value["report"]
    assert report["dumps"] == {"0": "ok", "1": "ok"} and report["calls"] == {"0": "all_reduce(Float[8])", "1": "barrier"}
    assert report["sentence"].endswith("rank 0 called all_reduce(Float[8]); rank 1 called barrier")


def test_dumps_handed_on_after_node_0_read_them_are_merged_into_its_end(settings: Settings) -> None:
    """Node 0 read the handed-on dumps (none yet), node 1 then hands its on while the run still
    runs (nothing to merge into), and node 0 writes the run's end with its own rank's alone: the
    end merges what is there by then."""
    run_id = add_run(settings, "running")
    rank0, rank1 = rank_dumps(run_id)
    hand_on(settings, run_id, rank1)
    assert DbLedger(settings).finish(run_id, Ending(End.FAILED, "hang", flight=kept({0: rank0}, world_size=2, run=run_id))) == "failed"
    report = kept_report(settings, run_id)
    assert report["dumps"] == {"0": "ok", "1": "ok"} and report["calls"] == {"0": "all_reduce(Float[8])", "1": "barrier"}, report


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_hand_over_waits_for_the_run_end_being_written_and_then_merges(settings: Settings) -> None:
    """While node 0 writes the run's end (its lock on the run held), node 1's hand-over waits for it
    and then merges into the end: read without the lock, it saw the run still running, merged
    nothing, and node 0's end, already past reading, kept rank 0's dump alone."""
    run_id = add_run(settings, "running")
    rank0, rank1 = rank_dumps(run_id)
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run_for_update(session, run_id)  # node 0's end, being written
        assert run is not None
        handing = threading.Thread(target=hand_on, args=(settings, run_id, rank1))
        handing.start()
        handing.join(timeout=1.5)
        assert handing.is_alive(), "the hand-over did not wait for the run's end"
        store.set_status(session, run, "failed", error="hang")
        ends = kept({0: rank0}, world_size=2, run=run_id)
        assert ends is not None
        store.set_flight_recorder(session, run_id, ends)
    handing.join(timeout=30)
    assert not handing.is_alive()
    assert kept_report(settings, run_id)["dumps"] == {"0": "ok", "1": "ok"}
