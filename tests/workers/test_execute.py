"""The worker's claim reads the job frozen into the run row; a row queued before jobs were frozen is
resolved once there and the job stored with it. On SQLite and Postgres; no ranks launched."""

from __future__ import annotations

from typing import Any

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run
from backend.store import runs as store
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.ledger import Claimed, Refusal, Refused
from parallab.core.spec import JobSpec
from workers.execute import claim_run
from workers.fleet import current

SPEC: dict[str, Any] = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "fsdp", "world_size": 2}}


def _claim(settings: Settings, run_id: str) -> ResolvedJob | Refusal:
    """The claimed job, or why the run was not started."""
    got = claim_run(settings, run_id, current(settings))
    assert isinstance(got, (Claimed, Refused))
    return got.job if isinstance(got, Claimed) else got.refusal


def add_run(settings: Settings, spec: dict[str, Any], job: ResolvedJob | None, status: str = "queued") -> str:
    with session_scope(settings.sqlalchemy_url) as session:
        run = Run(
            name=None,
            status=status,
            source="api",
            spec=spec,
            job=job.model_dump(mode="json") if job else None,
            strategy=spec["strategy"]["name"],
            world_size=spec["strategy"]["world_size"],
            model="tiny",
        )
        return store.add_run(session, run).id


def stored(settings: Settings, run_id: str) -> Run:
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run(session, run_id)
        assert run is not None
        session.expunge(run)
        return run


def test_a_run_without_a_frozen_job_is_resolved_once_and_keeps_it(settings: Settings) -> None:
    run_id = add_run(settings, SPEC, job=None)
    job = _claim(settings, run_id)
    expected = resolve_job(JobSpec.model_validate(SPEC), settings.limits)
    assert job == expected
    run = stored(settings, run_id)
    assert run.status == "running" and run.job is not None
    assert ResolvedJob.model_validate(run.job) == expected


def test_the_frozen_job_is_run_as_it_was_resolved(settings: Settings) -> None:
    """No rule runs again at the claim: the frozen job wins over the row's spec and today's limits."""
    frozen = resolve_job(JobSpec.model_validate({**SPEC, "strategy": {"name": "ddp", "world_size": 8}}))
    assert frozen.world_size > settings.limits.max_world_size
    run_id = add_run(settings, SPEC, job=frozen)
    assert _claim(settings, run_id) == frozen
    assert stored(settings, run_id).status == "running"


def test_an_invalid_unfrozen_spec_fails_the_run_naming_the_field(settings: Settings) -> None:
    run_id = add_run(settings, {**SPEC, "strategy": {"name": "tp", "world_size": 64}}, job=None)
    assert _claim(settings, run_id) is Refusal.FAILED
    run = stored(settings, run_id)
    assert run.status == "failed" and run.job is None
    assert run.error is not None and run.error.startswith("invalid spec:") and "strategy.world_size" in run.error


def test_a_run_that_is_not_queued_is_not_claimed(settings: Settings) -> None:
    run_id = add_run(settings, SPEC, job=None, status="cancelled")
    assert _claim(settings, run_id) is Refusal.SKIP
    run = stored(settings, run_id)
    assert run.status == "cancelled" and run.job is None


# ---- issue 13: a node's launch, the merge of every node's records; issue 10: faults as data ----


def test_a_node_of_a_multi_node_job_runs_its_share_over_a_c10d_rendezvous(tmp_path) -> None:
    from parallab.core.rundir import RunDir
    from workers.launcher import NodeLaunch, torchrun_command

    job = resolve_job(JobSpec.model_validate({**SPEC, "strategy": {"name": "ddp", "world_size": 4}, "placement": {"nodes": 2}}))
    assert (job.nodes, job.ranks_per_node) == (2, 2)
    node = NodeLaunch(nnodes=2, node_rank=1, endpoint="10.0.0.1:29500", rdzv_id="abc")
    cmd = torchrun_command(job, RunDir(tmp_path), trace_cap_bytes=1, cache_dir=None, node=node)
    flags = dict(zip(cmd[3:17:2], cmd[4:18:2], strict=True))
    assert "--standalone" not in cmd
    assert flags == {
        "--nnodes": "2",
        "--node-rank": "1",
        "--nproc-per-node": "2",
        "--rdzv-backend": "c10d",
        "--rdzv-endpoint": "10.0.0.1:29500",
        "--rdzv-id": "abc",
        "--rdzv-conf": "is_host=false,join_timeout=600",
    }
    assert NodeLaunch(2, 0, "h:1", "abc").is_host


def record(rank: int) -> Any:
    from parallab.core.result import ModelStateBytes, RankRecord

    return RankRecord(rank=rank, model_state_bytes=ModelStateBytes(params=1, grads=1, optimizer=2), step_times_s=[0.1])


def test_node_records_merge_into_rank_order_and_a_gap_or_a_twin_is_named(tmp_path) -> None:
    import pytest

    from parallab.core.rundir import RunDir
    from workers.aggregate import merge_nodes, read_node_records

    files = RunDir(tmp_path)
    for rank in (3, 2):
        files.write_atomic(files.rank_record(rank), record(rank).model_dump_json().encode())
    (tmp_path / "rank_notes.json").write_text("{}")  # not a record
    local = read_node_records(files)
    assert [r.rank for r in local] == [2, 3]
    assert [r.rank for r in merge_nodes([local, [record(1), record(0)]], 4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"no record from rank\(s\) 0, 1"):
        merge_nodes([local], 4)
    with pytest.raises(ValueError, match="rank 2 reported twice"):
        merge_nodes([local, [record(2)]], 4)


def test_the_topology_is_part_of_the_hardware_key_only_beyond_one_host() -> None:
    from backend.services.ingest import hardware_key

    one = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}
    assert hardware_key(one) == "cuda:NVIDIA H100 80GB HBM3"  # stored keys stay valid
    assert hardware_key({**one, "nodes": 1, "devices_per_host": 8}) == "cuda:NVIDIA H100 80GB HBM3"
    two_by_four = hardware_key({**one, "nodes": 2, "devices_per_host": 4})
    assert two_by_four == "cuda:NVIDIA H100 80GB HBM3 [2x4]" and two_by_four != hardware_key({**one, "nodes": 1, "devices_per_host": 8})
    assert len(hardware_key({"device": "cpu", "device_name": "x" * 300, "nodes": 2, "devices_per_host": 2})) == 200


def test_a_diverged_loss_is_reported_as_a_record_the_worker_turns_into_the_runs_reason(tmp_path) -> None:
    import math

    import pytest

    from parallab.core.rundir import RunDir
    from workers.execute import failure_reason
    from workers.harness import divergence
    from workers.launcher import LaunchOutcome

    divergence.check_curve([2.0, 1.5], first_step=3, rank=0)
    with pytest.raises(divergence.Diverged) as caught:
        divergence.check_curve([2.0, math.inf, math.nan], first_step=3, rank=1)
    assert caught.value.record.step == 4 and caught.value.record.value == "inf"
    files = RunDir(tmp_path)
    divergence.write_failure(files, caught.value.record)
    divergence.write_failure(files, caught.value.record.model_copy(update={"step": 9}))  # the first report wins
    reason = failure_reason(files, LaunchOutcome(1, "exit code 1", "Traceback ..."))
    assert reason.startswith("loss diverged at step 4 (inf on rank 1)\n--- log tail ---\nTraceback")
    assert failure_reason(RunDir(tmp_path / "none"), LaunchOutcome(1, "exit code 1", "")).startswith("training process failed: exit code 1")


def test_progress_lines_lose_their_non_finite_values_before_any_json_column_sees_them(settings: Settings, tmp_path) -> None:
    from workers.launcher import ProgressTail

    path = tmp_path / "progress.jsonl"
    path.write_text('{"phase": "train", "step": 1, "loss": NaN, "extra": [Infinity, 1.5]}\n')
    line = ProgressTail(path).poll()
    assert line == {"phase": "train", "step": 1, "loss": None, "extra": [None, 1.5]}
    run_id = add_run(settings, SPEC, job=None)
    with session_scope(settings.sqlalchemy_url) as session:
        store.set_progress(session, run_id, line)  # JSONB on Postgres refuses NaN: this must not raise
    assert stored(settings, run_id).progress == line


def test_every_node_stops_for_a_cancel_a_fault_elsewhere_a_lost_worker_or_a_node_that_never_started(settings: Settings) -> None:
    from datetime import timedelta

    from backend.models import utcnow
    from backend.services.ledger import DbLedger
    from parallab.core.ledger import GangState, NodeState
    from tests.backend.test_fleet import info
    from workers.watch import Watcher

    now = utcnow()

    def state(*nodes: NodeState, status: str = "running", cancel: bool = False) -> GangState:
        return GangState(status=status, cancel_requested=cancel, nodes=list(nodes), records={})

    def node(rank: int, status: str, *, alive: bool = True, age_s: float = 0, reason: str | None = None) -> NodeState:
        return NodeState(rank, f"host-{rank}", status, reason, alive, now - timedelta(seconds=age_s))

    timeouts = {"reservation_timeout_s": settings.worker.reservation_timeout_s, "heartbeat_s": settings.worker.heartbeat_s}
    lead = Watcher(DbLedger(settings), run_id="r", node_rank=0, me=info("host-0"), **timeouts)
    other = Watcher(DbLedger(settings), run_id="r", node_rank=1, me=info("host-1"), **timeouts)
    healthy = state(node(0, "running"), node(1, "running"))
    assert lead.reason(healthy) is None and other.reason(healthy) is None
    assert lead.reason(state(node(0, "running"), node(1, "succeeded"))) is None
    assert other.reason(state(node(0, "running"), node(1, "running"), cancel=True)) == "cancelled"
    assert other.reason(state(node(0, "failed"), node(1, "running"), status="failed")) == "the run ended (failed) elsewhere"
    crashed = lead.reason(state(node(0, "running"), node(1, "failed", reason="exit code 1")))
    assert crashed == "node 1 (host host-1) failed: exit code 1"
    assert other.reason(state(node(0, "running", alive=False), node(1, "running"))) == (
        "worker lost on node 0 (host host-0): it stopped heartbeating"
    )
    late = state(node(0, "running"), node(1, "reserved", age_s=settings.worker.reservation_timeout_s + 1))
    assert lead.reason(late) == f"node 1 (host host-1) did not start its part within {settings.worker.reservation_timeout_s:.0f} s"
    assert other.reason(None) == "the run was deleted"


def test_a_hosts_default_pool_and_interconnect_come_from_its_gpus_names_and_nvidia_smi_topo() -> None:
    from workers.topology import interconnect_from_topo, pool_name, short_gpu_name

    assert pool_name(None) == "cpu"
    assert pool_name(["NVIDIA H100 80GB HBM3"] * 8) == "h100x8"
    assert [short_gpu_name(n) for n in ("NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "NVIDIA L4")] == [
        "a100",
        "rtx4090",
        "v100",
        "l4",
    ]
    nvlink = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
    pcie = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n"
    assert interconnect_from_topo(nvlink) == "nvlink" and interconnect_from_topo(pcie) == "pcie"


def test_the_host_engine_stops_its_ranks_through_its_cancel_and_fails_them_for_any_other_stop(
    settings: Settings, tmp_path, monkeypatch
) -> None:
    """A cancel the watch sees goes through `HostTorchrun.cancel` (the run ends cancelled); another
    node's fault stops the ranks without it (the run fails); bench's `LocalWatch` cancels the same
    way. The launcher is stood in for: it polls `should_stop` once and ends as asked."""
    from workers.engines import host_torchrun
    from workers.engines.host_torchrun import HostTorchrun, LocalWatch
    from workers.launcher import LaunchOutcome

    def fake_launch(job: ResolvedJob, run_dir: Any, *, should_stop: Any, **_: Any) -> LaunchOutcome:
        return LaunchOutcome(returncode=-15, reason=should_stop(), log_tail="")

    monkeypatch.setattr(host_torchrun, "launch", fake_launch)
    job = resolve_job(JobSpec.model_validate(SPEC), Limits(max_world_size=2, max_steps=10))

    class Stub:
        def __init__(self, reason: str) -> None:
            self.reason, self.stop_reason, self.cancelled = reason, None, False

        def progress(self, line: dict[str, Any]) -> None:
            pass

        def started(self, pgid: int) -> None:
            pass

        def should_stop(self) -> str | None:
            self.stop_reason, self.cancelled = self.reason, self.reason == "cancelled"
            return self.reason

    cancels: list[str] = []
    real_cancel = HostTorchrun.cancel

    def counted(self: HostTorchrun, handle: Any, reason: str = "cancelled") -> None:
        cancels.append(reason)
        real_cancel(self, handle, reason)

    monkeypatch.setattr(HostTorchrun, "cancel", counted)
    for watch, status in ((Stub("cancelled"), "cancelled"), (Stub("node 1 (host b) failed: exit code 1"), "failed")):
        engine = HostTorchrun(settings, watcher=watch, runs_dir=tmp_path)
        handle = engine.launch(job, f"r-{status}")
        assert engine.stopped(handle) and engine.state(handle) == host_torchrun.EngineState(status, watch.reason, stopped=True)
    assert cancels == ["cancelled"]
    engine = HostTorchrun(settings, watcher=LocalWatch(should_cancel=lambda: True), runs_dir=tmp_path)
    assert engine.state(engine.launch(job, "bench")).status == "cancelled" and cancels == ["cancelled", "cancelled"]
