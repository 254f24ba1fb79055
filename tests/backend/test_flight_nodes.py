"""A gang's flight-recorder dumps in the lab database: the dumps a non-zero node hands on are read
back by node 0 (`node_flight`), and those that come after the run already ended failed are merged
into the dumps it kept and analysed again (`merge_late_flight`)."""

from __future__ import annotations

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run
from backend.store import runs as store
from parallab.core.hangs import kept
from parallab.core.jobs import Limits, resolve_job
from parallab.core.spec import JobSpec
from tests.core.test_hangs import agreeing, dump, entry

SPEC = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}, "placement": {"nodes": 2}}
GROUPS = {"0": {"desc": "default_pg", "ranks": [0, 1]}}


def test_a_late_nodes_dumps_are_merged_into_the_kept_ones_and_analysed_with_them(settings: Settings) -> None:
    job = resolve_job(JobSpec.model_validate(SPEC), Limits(max_world_size=8))
    with session_scope(settings.sqlalchemy_url) as session:
        run = Run(
            name=None, status="failed", source="api", spec=SPEC, job=job.model_dump(mode="json"), strategy="ddp", world_size=2, model="tiny"
        )
        run_id = store.add_run(session, run).id
    rank0 = dump(0, [*agreeing(2), entry("0", 3, "all_reduce")], world=2, run=run_id, groups=GROUPS).decode()
    rank1 = dump(1, [*agreeing(2), entry("0", 3, "barrier", [])], world=2, run=run_id, groups=GROUPS).decode()
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
