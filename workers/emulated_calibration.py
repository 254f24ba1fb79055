"""Calibrate an emulated cluster's pool: the `calibrate` job run inside one node's namespace.

The emulated nodes (`workers.netns.EmulatedCluster`) are namespaces of one host, so their ranks
share its cores: a CPU plan of the pool is only as good as the compute figures it uses, and the
catalogue's generic CPU is off by an order of magnitude on a host under load. This runs the
project's `calibrate` job kind (GEMM FLOP/s at the model's shapes, memory bandwidth, op and
DTensor dispatch overhead, the collectives sweep) with `world_size` ranks inside one node — the
ranks a job of that size puts on the host at once, each measuring what it gets while the others
work — and returns the profile the result document carries, for `parallab lab emulate` to record
for the pool and for `benchmarks/emulated_layouts.py` to predict with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallab.core.hardware import HardwareProfile
from parallab.core.hostspeed import HostSpeed
from parallab.core.jobs import Limits, resolve_job
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from workers.aggregate import build_result, read_node_records
from workers.launcher import launch

LIGHT_OPTIONS: dict[str, Any] = {"precisions": ["fp32"], "max_bytes": 4 << 20, "iters": 5}
"""A short sweep: fp32 only (a CPU pool's training precision), messages up to 4 MiB (a small
model's collectives are below that), five timed calls a size."""


class CalibrationFailed(RuntimeError):
    """The calibrate job did not finish, or its result carried no profile."""


def calibrate_node(
    netns: str,
    world_size: int,
    run_dir: Path,
    *,
    model: str = "tiny",
    options: dict[str, Any] | None = None,
    timeout_s: float = 900,
) -> HardwareProfile:
    """The pool's hardware profile, measured by `world_size` ranks at once inside namespace `netns`
    at `model`'s GEMM shapes (`options`: the calibrate job's, default `LIGHT_OPTIONS`)."""
    doc = {
        "name": f"calibrate {world_size} rank(s) in {netns}",
        "workload": {"model": model, "steps": 1},
        "strategy": {"name": "calibrate", "world_size": world_size, "options": options if options is not None else LIGHT_OPTIONS},
    }
    job = resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=max(world_size, 1), max_steps=10))
    where = RunDir(run_dir)
    outcome = launch(job, where, timeout_s=timeout_s, trace_cap_bytes=0, netns=netns)
    if not outcome.ok:
        raise CalibrationFailed(f"calibrate in {netns}: {outcome.reason}: {outcome.log_tail[-1500:]}")
    records = sorted(read_node_records(where), key=lambda r: r.rank)
    profile = build_result(job, records).calibration
    if profile is None:
        raise CalibrationFailed(f"calibrate in {netns}: the result carries no profile")
    LAST_SPEED[netns] = outcome.host_speed
    return profile


LAST_SPEED: dict[str, HostSpeed | None] = {}
"""The host-speed probe (`parallab.core.hostspeed`) the launcher timed around the last calibration
in each namespace: how loaded the host was when the profile was taken."""
