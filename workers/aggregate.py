"""Merge the ranks' records into one result document.

Runs in the worker (or `parallab bench`) after torchrun exits. Pure Python, no torch: each rank
wrote its `RankRecord` (`parallab.core.result`) to `RunDir.rank_record(r)`; this reads them back
and builds the `ResultDocument` with the core's formulas — the summary (`metrics.summarize`), the
prediction (`prediction.predict`) and the gap rule (`flags.prediction_flags`).

A multi-node job's ranks write into each host's own run directory; every node's worker reads its
host's records (`read_node_records`) and hands them on through the database (`run_nodes.records`);
node 0 merges them (`merge_nodes`) and builds the one document here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from parallab.core import hostspeed
from parallab.core.critpath import CriticalPath, PathSummary, analyse
from parallab.core.families import model_flops_per_token
from parallab.core.flags import prediction_flags
from parallab.core.hardware import Catalogue, HardwareProfile, load_catalogue
from parallab.core.hostspeed import HostSpeed
from parallab.core.jobs import ResolvedJob
from parallab.core.metrics import rank_bubbles, summarize
from parallab.core.noise import HostNoise
from parallab.core.plan_hardware import Hardware, hardware_for
from parallab.core.pools import PoolTopology
from parallab.core.prediction import predict
from parallab.core.result import SCHEMA_VERSION, LossCurve, RankRecord, ResultDocument
from parallab.core.rundir import RunDir
from parallab.core.stragglers import CollectivesMatched, match, name_stragglers, rows


def read_rank_records(run_dir: RunDir, world_size: int) -> list[RankRecord]:
    """Each rank's record, in rank order; a missing one means that rank died before the end."""
    records = []
    for rank in range(world_size):
        path = run_dir.rank_record(rank)
        if not path.exists():
            raise FileNotFoundError(f"rank {rank} wrote no record ({path.name})")
        records.append(RankRecord.model_validate_json(path.read_text()))
    return records


_RECORD = re.compile(r"rank(\d+)\.json")


def read_node_records(run_dir: RunDir) -> list[RankRecord]:
    """The records of whichever ranks ran on this host (c10d numbers the nodes, so which global
    ranks landed here is read from the files, not assumed), in rank order."""
    found = sorted((int(m.group(1)), path) for path in run_dir.path.iterdir() if (m := _RECORD.fullmatch(path.name)))
    return [RankRecord.model_validate_json(path.read_text()) for _, path in found]


def merge_nodes(per_node: Sequence[Sequence[RankRecord]], world_size: int) -> list[RankRecord]:
    """Every node's records as one list in rank order; each rank exactly once, or a ValueError naming the gap."""
    by_rank: dict[int, RankRecord] = {}
    for records in per_node:
        for record in records:
            if record.rank in by_rank:
                raise ValueError(f"rank {record.rank} reported twice")
            by_rank[record.rank] = record
    missing = [r for r in range(world_size) if r not in by_rank]
    if missing:
        raise ValueError(f"no record from rank(s) {', '.join(map(str, missing))}")
    return [by_rank[r] for r in range(world_size)]


def run_hardware(
    hardware: dict[str, Any],
    profile: HardwareProfile | None,
    catalogue: Catalogue | None = None,
    *,
    job: ResolvedJob | None = None,
    topology: PoolTopology | None = None,
) -> Hardware | None:
    """What the step-time estimate runs on: the catalogue entry of the device the ranks reported,
    with the pool's calibrated profile when there is one; None for a device the catalogue lacks.
    A `job` over several nodes is planned on its nodes × ranks per node, its collectives across
    nodes on the pool's `topology` (its recorded inter-node link) when there is one."""
    catalogue = catalogue or load_catalogue()
    spec = catalogue.for_device(hardware.get("device_name"), hardware.get("device"))
    if spec is None:
        return None
    if job is not None and job.nodes > 1:
        return hardware_for(spec, profile=profile, nodes=job.nodes, devices_per_node=job.ranks_per_node, topology=topology)
    return hardware_for(
        spec, profile=profile, devices_per_node=hardware.get("device_count") if profile is None else None, topology=topology
    )


def match_collectives(job: ResolvedJob, records: Sequence[RankRecord], hosts: Sequence[str] | None = None) -> CollectivesMatched | None:
    """The profiled window's collectives matched across the ranks; None for an untraced run (no
    rank profiled a step). Ranks on other hosts are aligned on collective ends (`hosts` by node)."""
    if not any(r.profiled_steps for r in records):
        return None
    host_of = {r.rank: hosts[min(job.node_of(r.rank), len(hosts) - 1)] for r in records} if hosts and len(hosts) > 1 else None
    return match(
        {r.rank: None if r.collective_times is None else rows(r.collective_times) for r in records},
        world_size=job.world_size,
        mesh=[(d.name, d.size) for d in job.mesh],
        steps=max(r.profiled_steps or 0 for r in records),
        host_of=host_of,
        unread=trace_notes(records),
    )


def critical_path(job: ResolvedJob, records: Sequence[RankRecord], matched: CollectivesMatched | None) -> CriticalPath | None:
    """The profiled steps' critical path across the ranks; None for an untraced run. Ranks on
    other hosts are not shifted here: their clocks are compared as they are (one host's runs)."""
    if not any(r.profiled_steps for r in records):
        return None
    return analyse(
        {r.rank: r.step_segments for r in records},
        world_size=job.world_size,
        mesh=[(d.name, d.size) for d in job.mesh],
        unread=trace_notes(records),
    )


def trace_notes(records: Sequence[RankRecord]) -> dict[int, str]:
    """The note of each rank whose trace was not analysed (why it could not be read: cut short, not
    JSON), told where the merged analyses skip that rank — the record keeps it only until the merge.
    A note beside an analysed trace (kept in part, over the cap) says nothing of the analyses."""
    return {r.rank: r.trace_note for r in records if r.trace_note and r.step_time_breakdown is None}


def build_result(
    job: ResolvedJob,
    records: list[RankRecord],
    *,
    hosts: Sequence[str] | None = None,
    profile: HardwareProfile | None = None,
    catalogue: Catalogue | None = None,
    noise: HostNoise | None = None,
    topology: PoolTopology | None = None,
    host_speed: HostSpeed | None = None,
) -> ResultDocument:
    """The result document of a finished job from its ranks' records (rank order); `hosts`: the
    job's hosts by node, when a worker ran it (added to `hardware`); the prediction carries the
    step-time estimate on the run's hardware (`profile`: the pool's calibration); `noise`: node 0's
    host around the run, as the launcher sampled it; `topology`: how the pool's hosts are wired
    (the estimate times the collectives that cross nodes on its inter-node link); `host_speed`: the
    speed probe around it."""
    lead = records[0]
    ranks = [record.rank_result() for record in records]
    on_host = [r for r in records if job.node_of(r.rank) == 0]  # node 0's ranks, as `noise` is node 0's host
    in_steps = hostspeed.from_ranks([r.host_probe_before or [] for r in on_host], [r.host_probe_after or [] for r in on_host])
    host_speed = in_steps or host_speed  # timed beside the steps, when the ranks did
    rank_dicts: list[Mapping[str, Any]] = [rank.model_dump(mode="json") for rank in ranks]
    hardware = dict(lead.hardware or {})
    if hosts:
        hardware["hosts"] = list(hosts)
        if len(hosts) > 1:  # which dimensions' collectives cross the inter-node link, as the placement laid the mesh
            hardware["inter_node_dims"] = job.crossing_dims
            hardware["placement_order"] = job.placement_order
    loss = lead.loss or LossCurve()
    summary = summarize(
        ranks=rank_dicts,
        tokens_per_step=job.tokens_per_step,
        samples_per_step=job.global_batch_size if job.trains else 0,
        flops_per_token=model_flops_per_token(job.model) if job.trains else None,
        device_name=hardware.get("device_name"),
        world_size=job.world_size,
        loss=loss.model_dump(),
    )
    pipeline = rank_bubbles(rank_dicts)
    if pipeline is not None:
        # Each stage's own bubble, within the window every stage shares (the summary has their mean).
        staged = iter(pipeline.per_stage)
        ranks = [r.model_copy(update={"bubble_fraction": next(staged)}) if r.pipeline_actions_us else r for r in ranks]
    for name in ("gradient_check", "replica_check", "routing_check", "frozen_check"):
        check = getattr(lead, name)
        if check is not None:
            summary[name] = check.model_dump(mode="json")
    matched = match_collectives(job, records, hosts)
    path = critical_path(job, records, matched)
    if path is not None and path.steps:
        summary["critical_path"] = PathSummary.of(path).model_dump()
    if matched is not None and any(g.matched for g in matched.groups):  # nothing matched: not analysed, not "none stands out"
        summary["stragglers"] = [s.model_dump() for s in name_stragglers(matched)]
    prediction = predict(job, run_hardware(hardware, profile, catalogue, job=job, topology=topology)) if job.trains else predict(job)
    flags = (
        prediction_flags(prediction=prediction, summary=summary, ranks=rank_dicts, precision=job.workload.precision) if job.trains else []
    )
    return ResultDocument.model_validate(
        {
            "schema_version": SCHEMA_VERSION,
            "name": job.spec.name,
            "workload": job.workload_document(),
            "strategy": job.strategy_document(),
            "hardware": hardware,
            "environment": lead.environment or {},
            "summary": summary,
            "ranks": ranks,
            "loss": loss,
            "prediction": prediction,
            "flags": flags,
            "timeline": [event for record in records for event in record.timeline],
            "collectives": lead.collectives or [],
            "calibration": lead.calibration,
            "tags": job.spec.tags,
            "noise": noise,
            "host_speed": host_speed,
            "collectives_matched": matched,
            "critical_path": path,
        }
    )
