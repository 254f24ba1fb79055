"""The fleet's rules on SQLite and Postgres, without launching anything (issues 10 and 13):
registration and liveness, placement (422 naming the pool and the limit), all-or-nothing
reservations that never deadlock, leases that lapse into "worker lost", cancel of an orphan."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run, Worker, utcnow
from backend.services import workers as fleet
from backend.services.runs import create_run
from backend.services.workers import NotReserved
from backend.store import workers as store
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.ledger import Refusal, Refused, WorkerInfo
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec

GIB = 1024**3


def info(host: str, *, pool: str = "cpu", devices: int = 2, memory: int | None = 8 * GIB) -> WorkerInfo:
    return WorkerInfo(
        id=uuid.uuid4().hex,
        host=host,
        machine="test-machine",
        address="127.0.0.1",
        pid=1,
        pool=pool,
        device="cpu",
        device_name="test cpu",
        device_count=devices,
        memory_per_device_bytes=memory,
        interconnect="cpu",
    )


def register(settings: Settings, *workers: WorkerInfo) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        for worker in workers:
            fleet.register(session=session, info=worker)


def silence(settings: Settings, worker: WorkerInfo, seconds: float = 3600) -> None:
    """Make a worker look as if it stopped heartbeating `seconds` ago."""
    with session_scope(settings.sqlalchemy_url) as session:
        session.execute(update(Worker).where(Worker.id == worker.id).values(heartbeat_at=utcnow() - timedelta(seconds=seconds)))


def job(world: int = 4, nodes: int = 2, pool: str | None = "cpu", **workload: Any) -> ResolvedJob:
    spec: dict[str, Any] = {"workload": {"model": "tiny", "steps": 3, **workload}, "strategy": {"name": "ddp", "world_size": world}}
    if nodes != 1 or pool:
        spec["placement"] = {"pool": pool, "nodes": nodes}
    return resolve_job(JobSpec.model_validate(spec))


def queued_run(settings: Settings, resolved: ResolvedJob) -> str:
    with session_scope(settings.sqlalchemy_url) as session:
        run = Run(
            status="queued",
            source="api",
            spec=resolved.spec.model_dump(mode="json"),
            job=resolved.model_dump(mode="json"),
            strategy="ddp",
            world_size=resolved.world_size,
            model="tiny",
            pool="cpu",
        )
        session.add(run)
        session.flush()
        return run.id


def reserve(settings: Settings, run_id: str, resolved: ResolvedJob, me: WorkerInfo) -> list[int] | NotReserved:
    """One coordinator's claim: the nodes' ranks, or why nothing was taken (rolled back)."""
    with session_scope(settings.sqlalchemy_url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        try:
            nodes = fleet.reserve(session=session, run=run, job=resolved, me=me, settings=settings, endpoint="127.0.0.1:1")
        except NotReserved as exc:
            session.rollback()
            return exc
        run.status = "running"
        return [n.node_rank for n in nodes]


def holders(settings: Settings) -> dict[str, str | None]:
    with session_scope(settings.sqlalchemy_url) as session:
        return {w.host: w.run_id for w in store.list_workers(session)}


# ---- registration, liveness, the API ----


def test_workers_register_and_the_api_lists_them_alive_or_dead(settings: Settings, client) -> None:
    a, b = info("host-a"), info("host-b", pool="h100x8", devices=8, memory=80 * GIB)
    register(settings, a, b)
    silence(settings, b)
    listed = client.get("/api/v1/workers").json()
    by_host = {w["host"]: w for w in listed["items"]}
    assert by_host["host-a"]["alive"] and not by_host["host-b"]["alive"]
    assert by_host["host-b"]["devices"] == 8 and by_host["host-b"]["pool"] == "h100x8" and by_host["host-a"]["run_id"] is None
    pools = {p["name"]: p for p in listed["pools"]}
    assert pools["cpu"]["alive"] == 1 and pools["h100x8"]["alive"] == 0 and pools["h100x8"]["hosts"] == 1
    assert pools["cpu"]["queue"].endswith(".cpu")
    page = client.get("/workers")
    assert page.status_code == 200 and "host-a" in page.text and "h100x8" in page.text


def test_a_heartbeat_renews_the_row_and_registers_a_forgotten_worker_again(settings: Settings) -> None:
    a = info("host-a")
    register(settings, a)
    silence(settings, a)
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.heartbeat(session=session, info=a)
        assert fleet.is_alive(store.get_worker(session, a.id), settings)
        fleet.deregister(session=session, worker_id=a.id)
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.heartbeat(session=session, info=a)
        assert store.get_worker(session, a.id) is not None


# ---- placement ----


@pytest.mark.parametrize(
    ("resolved", "field", "words"),
    [
        (job(pool="gpu"), "pool", "no worker has registered pool 'gpu'"),
        (job(world=6, nodes=3), "nodes", "pool 'cpu' has 2 live host(s); this job asks for 3 nodes"),
        (job(world=8, nodes=2), "world_size", "pool 'cpu' has 2 device(s) per host; this job puts 4 rank(s)"),
        (job(world=2, nodes=1, hidden_size=4096, num_layers=8, vocab_size=64000), "model", "GiB per rank is more than pool 'cpu'"),
    ],
)
def test_placement_refuses_what_no_live_pool_can_run_naming_the_pool_and_the_limit(
    settings: Settings, resolved: ResolvedJob, field: str, words: str
) -> None:
    register(settings, info("host-a", memory=GIB), info("host-b", memory=GIB))
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(SpecError) as caught:
        fleet.place(session=session, job=resolved, settings=settings)
    problems = {p.loc[-1]: p.msg for p in caught.value.problems}
    assert field in problems and words in problems[field], problems


def test_placement_picks_a_live_pool_that_fits_and_refuses_a_pool_whose_workers_are_dead(settings: Settings) -> None:
    a, b = info("host-a"), info("host-b")
    big = info("big", pool="wide", devices=8)
    register(settings, a, b, big)
    with session_scope(settings.sqlalchemy_url) as session:
        assert fleet.place(session=session, job=job(nodes=2), settings=settings) == "cpu"
        assert fleet.place(session=session, job=job(world=8, nodes=1, pool=None), settings=settings) == "wide"
    silence(settings, big)
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(SpecError) as caught:
        fleet.place(session=session, job=job(world=8, nodes=1, pool="wide"), settings=settings)
    assert caught.value.problems[0].msg == "pool 'wide' has no live worker"


def test_before_any_worker_registered_a_job_waits_on_its_pool(settings: Settings) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        assert fleet.place(session=session, job=job(nodes=1, pool=None), settings=settings) == "cpu"
        assert fleet.place(session=session, job=job(nodes=4, pool="later"), settings=settings) == "later"


def test_the_api_answers_422_for_a_job_no_pool_can_run_and_stores_the_pool_of_one_it_can(settings: Settings, client) -> None:
    register(settings, info("host-a"), info("host-b"))
    spec = {
        "workload": {"model": "tiny", "steps": 3},
        "strategy": {"name": "ddp", "world_size": 3},
        "placement": {"pool": "cpu", "nodes": 3},
    }
    refused = client.post("/api/v1/runs", json=spec)
    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert any(d["loc"][-2:] == ["placement", "nodes"] and "pool 'cpu' has 2 live host(s)" in d["msg"] for d in detail), detail
    uneven = client.post("/api/v1/runs", json={**spec, "strategy": {"name": "ddp", "world_size": 3}, "placement": {"nodes": 2}})
    assert uneven.status_code == 422 and "does not split evenly over 2 nodes" in uneven.text
    fits = {**spec, "strategy": {"name": "ddp", "world_size": 4}, "placement": {"nodes": 2}}
    with session_scope(settings.sqlalchemy_url) as session:
        run = create_run(session=session, spec=JobSpec.model_validate(fits), settings=settings, source="api")
        assert run.pool == "cpu"


# ---- reservations ----


def test_a_reservation_takes_every_host_or_none(settings: Settings) -> None:
    a, b, c = info("host-a"), info("host-b"), info("host-c")
    register(settings, a, b, c)
    two = job(nodes=2)
    first, second, third = (queued_run(settings, two) for _ in range(3))
    assert reserve(settings, first, two, a) == [0, 1]
    taken = holders(settings)
    assert taken["host-a"] == first and sum(1 for v in taken.values() if v == first) == 2
    # the third host alone cannot take a 2-node job: nothing is held meanwhile
    spare = next(w for w in (b, c) if taken[w.host] is None)
    outcome = reserve(settings, second, two, spare)
    assert isinstance(outcome, NotReserved) and not outcome.impossible and not outcome.mine_taken
    assert holders(settings)[spare.host] is None
    # a worker reserved by another job is told so (it must serve that job first)
    busy = next(w for w in (b, c) if taken[w.host] == first)
    outcome = reserve(settings, third, two, busy)
    assert isinstance(outcome, NotReserved) and outcome.mine_taken
    # a pool with fewer live hosts than nodes: waiting will not help
    assert reserve(settings, third, job(world=8, nodes=4), spare).impossible  # type: ignore[union-attr]


def race(
    settings: Settings, runs: list[str], resolved: ResolvedJob, coordinators: tuple[WorkerInfo, ...], *, start: bool
) -> dict[int, Any]:
    """Coordinator i reserves runs[i] in a thread of its own (all released at once when `start`):
    each one's outcome — its nodes, NotReserved, or the exception it raised."""
    gate = threading.Barrier(len(coordinators))
    outcomes: dict[int, Any] = {}

    def coordinator(i: int, me: WorkerInfo) -> None:
        if start:
            gate.wait()
        try:
            outcomes[i] = reserve(settings, runs[i], resolved, me)
        except Exception as exc:  # SQLite's "database is locked"; Postgres's DeadlockDetected
            outcomes[i] = exc

    threads = [threading.Thread(target=coordinator, args=(i, me)) for i, me in enumerate(coordinators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a coordinator hung"
    return outcomes


def test_two_coordinators_racing_for_the_same_two_hosts_never_deadlock_and_one_wins(settings: Settings) -> None:
    a, b = info("host-a"), info("host-b")
    register(settings, a, b)
    two = job(nodes=2)
    runs = [queued_run(settings, two), queued_run(settings, two)]
    outcomes = race(settings, runs, two, (a, b), start=True)  # SQLite may refuse one: still nothing taken twice
    winners = [i for i, o in outcomes.items() if isinstance(o, list)]
    assert len(winners) == 1 if settings.sqlalchemy_url.startswith("postgresql") else len(winners) <= 1, outcomes
    taken = set(holders(settings).values())
    assert taken == ({runs[winners[0]]} if winners else {None}), "hosts are taken by one job, whole, or by none"


def test_two_coordinators_that_each_refreshed_their_own_row_first_do_not_deadlock(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both reach the point where each has written its own worker row before taking the other's —
    the interleaving that deadlocked on Postgres (one task died of DeadlockDetected, its run left
    queued). Locking every host in one order first makes the second wait instead: one wins, the
    other is told its host was taken."""
    if not settings.sqlalchemy_url.startswith("postgresql"):
        pytest.skip("row locks and deadlocks are Postgres's; SQLite serialises writers")
    a, b = info("host-a"), info("host-b")
    register(settings, a, b)
    two = job(nodes=2)
    runs = [queued_run(settings, two), queued_run(settings, two)]
    both_registered = threading.Barrier(2, timeout=3)
    real_register = fleet.register

    def register_then_wait(*, session: Any, info: WorkerInfo) -> Worker:
        worker = real_register(session=session, info=info)
        session.flush()
        with contextlib.suppress(threading.BrokenBarrierError):  # the other waits on a lock: go on alone
            both_registered.wait()
        return worker

    monkeypatch.setattr(fleet, "register", register_then_wait)
    outcomes = race(settings, runs, two, (a, b), start=False)  # before the fix, one was DeadlockDetected
    assert sorted(type(o).__name__ for o in outcomes.values()) == ["NotReserved", "list"], outcomes
    (winner,) = (i for i, o in outcomes.items() if isinstance(o, list))
    assert set(holders(settings).values()) == {runs[winner]}


# ---- leases ----


def running_run(settings: Settings, me: WorkerInfo, *, cancel: bool = False) -> str:
    single = job(world=2, nodes=1)
    run_id = queued_run(settings, single)
    assert reserve(settings, run_id, single, me) == [0]
    if cancel:
        with session_scope(settings.sqlalchemy_url) as session:
            session.execute(update(Run).where(Run.id == run_id).values(cancel_requested=True))
    return run_id


def test_a_run_whose_worker_stopped_heartbeating_is_failed_as_worker_lost(settings: Settings) -> None:
    alive, dead = info("host-a"), info("host-b")
    register(settings, alive, dead)
    kept, lost = running_run(settings, alive), running_run(settings, dead)
    other = info("host-b")
    register(settings, other)
    cancelled = running_run(settings, other, cancel=True)
    silence(settings, dead)
    silence(settings, other)
    with session_scope(settings.sqlalchemy_url) as session:
        assert sorted(fleet.reconcile_lost_runs(session=session, settings=settings)) == sorted([lost, cancelled])
    with session_scope(settings.sqlalchemy_url) as session:
        runs = {r: session.get(Run, r) for r in (kept, lost, cancelled)}
        assert runs[kept].status == "running"
        assert runs[lost].status == "failed" and runs[lost].error.startswith("worker lost: the worker on host host-b")
        assert runs[cancelled].status == "cancelled" and "worker lost" in runs[cancelled].error
        nodes = store.get_nodes(session, lost)
        assert [n.status for n in nodes] == ["lost"]
        assert store.get_worker(session, dead.id).run_id is None


def test_cancel_of_an_orphaned_run_ends_it_at_once(settings: Settings, client) -> None:
    live, gone = info("host-a"), info("host-b")
    register(settings, live, gone)
    watched, orphan = running_run(settings, live), running_run(settings, gone)
    silence(settings, gone)
    answer = client.post(f"/api/v1/runs/{orphan}/cancel").json()
    assert answer["status"] == "cancelled" and "worker lost" in answer["error"]
    answer = client.post(f"/api/v1/runs/{watched}/cancel").json()
    assert answer["status"] == "running" and answer["cancel_requested"] is True


def test_a_redelivered_message_does_not_reserve_a_running_run_again(settings: Settings) -> None:
    from workers.execute import claim_run

    a = info("host-a")
    register(settings, a)
    run_id = running_run(settings, a)
    assert claim_run(settings, run_id, a) == Refused(Refusal.SKIP)
    with session_scope(settings.sqlalchemy_url) as session:
        assert len(store.get_nodes(session, run_id)) == 1


def test_a_worker_reserved_by_a_gang_puts_a_single_node_job_back(settings: Settings) -> None:
    from workers.execute import claim_run

    a, b = info("host-a"), info("host-b")
    register(settings, a, b)
    gang = queued_run(settings, job(nodes=2))
    assert reserve(settings, gang, job(nodes=2), a) == [0, 1]
    single = queued_run(settings, job(world=2, nodes=1))
    assert claim_run(settings, single, b) == Refused(Refusal.REQUEUE_NOW, "cpu")
    with session_scope(settings.sqlalchemy_url) as session:
        assert session.get(Run, single).status == "queued"


def test_a_claim_while_the_database_is_away_puts_the_run_back_on_its_queue(tmp_path) -> None:
    """Nothing answers on the database's port: the claim is retried until it gives up, then the run
    goes back on its queue (still queued: nothing committed) rather than the task raising and the
    queue's message being lost with the run left queued."""
    from backend.services.ledger import DbLedger

    away = Settings(home=tmp_path / "home", database_url="postgresql+psycopg://postgres@127.0.0.1:9/parallab")
    started = time.monotonic()
    assert DbLedger(away, give_up_after_s=1.0).claim("some-run", info("host-a"), "127.0.0.1:29400") == Refused(Refusal.REQUEUE, None)
    assert time.monotonic() - started >= 1.0, "given up without retrying"
