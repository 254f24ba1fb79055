"""Hardware as the server knows it: the catalogue (built-in + the lab's file), each
pool's calibrated profile, and the precision check at submission.

A `calibrate` run's result carries the profile; ingest stores it for the pool the run ran on.
The latest profile of a pool is what the planner estimates with, and its device is the one
`parallab.core.hardware.precision_problem` is asked about when a job is submitted to that pool —
so fp8 sent to a CPU pool is refused with a 422 that names the device.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import HardwareProfileRow, Run, Worker
from backend.services import workers as fleet
from backend.store import planning as store
from backend.store import pools as pool_store
from backend.store import workers as worker_store
from parallab.core.hardware import Catalogue, DeviceDescription, HardwareProfile, load_catalogue, precision_problem
from parallab.core.jobs import ResolvedJob
from parallab.core.plan_hardware import Hardware, hardware_for
from parallab.core.pools import PoolTopology
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.result import ResultDocument


class UnknownDevice(LookupError):
    """A device name neither the catalogue nor a pool's calibration knows."""


def catalogue(settings: Settings) -> Catalogue:
    """The built-in catalogue with the lab's own file (`Settings.hardware_catalogue`) laid over it."""
    return load_catalogue(settings.planner.hardware_catalogue)


def pool_of(settings: Settings, pool: str | None = None) -> str:
    """The pool meant: the one named, else this deployment's default pool, else this worker's, else `cpu`."""
    return pool or settings.worker.default_pool or settings.worker.pool or "cpu"


def latest_profile(*, session: Session, pool: str) -> HardwareProfile | None:
    row = store.latest_profile(session, pool)
    return HardwareProfile.model_validate(row.profile) if row is not None else None


def record_profile(*, session: Session, run: Run, document: ResultDocument, pool: str | None, key: str) -> HardwareProfileRow | None:
    """Store a calibrate run's profile for its pool (default: its hardware `key`), in the caller's
    transaction; None when the result carries none."""
    profile = document.calibration
    if profile is None:
        return None
    return store_profile(session=session, profile=profile, pool=pool or key, key=key, run_id=run.id)


def store_profile(*, session: Session, profile: HardwareProfile, pool: str, key: str, run_id: str | None = None) -> HardwareProfileRow:
    """Store `profile` as `pool`'s latest calibration, in the caller's transaction; `run_id`: the
    calibrate run it came from (None: measured outside the queue, as `parallab lab emulate` does
    before its workers serve)."""
    return store.add_profile(
        session,
        HardwareProfileRow(
            pool=pool[:100],
            hardware_key=key,
            device_kind=profile.device.kind,
            device_name=profile.device.name,
            world_size=profile.world_size,
            profile=profile.model_dump(mode="json"),
            run_id=run_id,
        ),
    )


def pool_device(*, session: Session, pool: str) -> DeviceDescription | None:
    """The device a pool's latest calibration recorded; uncalibrated, a CPU pool's registered
    worker says enough (a CPU trains in no fp8 whatever its model); None: not known yet."""
    profile = latest_profile(session=session, pool=pool)
    if profile is not None:
        return profile.device
    worker = registered_worker(session=session, pool=pool)
    if worker is not None and worker.device == "cpu":
        return DeviceDescription(kind="cpu", name=worker.device_name)
    return None


def check_precision(*, session: Session, settings: Settings, job: ResolvedJob, pool: str | None = None) -> None:
    """Refuse (SpecError on workload.precision) a job whose pool's device cannot train in its precision."""
    if not job.trains:
        return
    device = pool_device(session=session, pool=pool_of(settings, pool))
    problem = precision_problem(job.workload.precision, device) if device is not None else None
    if problem:
        raise SpecError([SpecProblem(("workload", "precision"), f"pool {pool_of(settings, pool)!r}: {problem}")])


def registered_worker(*, session: Session, pool: str) -> Worker | None:
    """The latest worker that registered with a pool (None: none ever did): what device it has."""
    workers = [w for w in worker_store.list_workers(session) if w.pool == pool]
    return max(workers, key=lambda w: w.started_at) if workers else None


def declared_devices(*, session: Session, settings: Settings, pool: str) -> int | None:
    """Devices per host the pool declares, as the submit form and the workers page count them
    (`fleet.pool_capacities`: the most any live worker registered with); with none alive, what
    its latest worker registered with; None when no worker ever registered with it."""
    capacity = fleet.pool_capacities(session, settings).get(pool)
    if capacity is not None and capacity.devices_per_host > 0:
        return capacity.devices_per_host
    worker = registered_worker(session=session, pool=pool)
    return worker.device_count if worker is not None else None


def pool_hardware(*, session: Session, settings: Settings, pool: str | None = None) -> Hardware:
    """What a pool plans on: its latest calibration (with the catalogue entry its device matches);
    uncalibrated, the catalogue entry of the device its workers registered with — a CPU the
    catalogue does not know keeps its own name over the generic CPU's figures — said so in the label.
    Its devices are those the pool declares (`declared_devices`), calibrated or not, so the plan
    counts what the form and the workers page count; a pool no worker registered with has the
    calibration's ranks (a CPU's), else the deployment's ceiling.
    A pool with a recorded topology (`parallab lab emulate`, or declared) plans on its nodes × ranks
    per node, the collectives whose groups span nodes timed on its inter-node link."""
    hw = _pool_hardware(session=session, settings=settings, pool=pool)
    row = pool_store.get_pool(session, pool_of(settings, pool))
    said = (row.settings or {}).get("topology") if row is not None else None
    if not said:
        return hw
    topology = PoolTopology.model_validate(said)
    return replace(hw, nodes=topology.nodes, devices_per_node=topology.ranks_per_node, topology=topology)


def _pool_hardware(*, session: Session, settings: Settings, pool: str | None = None) -> Hardware:
    cat = catalogue(settings)
    name = pool_of(settings, pool)
    devices = declared_devices(session=session, settings=settings, pool=name)
    profile = latest_profile(session=session, pool=name)
    if profile is not None:
        spec = cat.for_device(profile.device.name, profile.device.kind) or cat.get("cpu")
        return hardware_for(spec, profile=profile, devices_per_node=devices)
    worker = registered_worker(session=session, pool=name)
    if worker is None:
        return hardware_for(cat.get("cpu"), devices_per_node=settings.limits.max_world_size)
    spec = cat.for_device(worker.device_name, worker.device) or cat.get("cpu")
    if spec.kind == "cpu" and not spec.match and worker.device_name:  # the pool's own CPU, not the catalogue's machine
        spec = spec.model_copy(update={"name": f"{worker.device_name} (the generic CPU's figures until calibrated)"})
    return hardware_for(spec, devices_per_node=devices)


def calibration_advice(*, session: Session, settings: Settings, pool: str | None = None) -> str | None:
    """What to do when a pool has no calibration (None: it has one): its plans rest on datasheet
    figures, which on a CPU can be off by more than an order of magnitude."""
    name = pool_of(settings, pool)
    if latest_profile(session=session, pool=name) is not None:
        return None
    return (
        f"pool {name!r} has no calibration: its plan uses datasheet figures, not what its hosts measure. "
        f"Calibrate it first: `parallab bench --strategy calibrate --world-size N` on one of its hosts, or submit a "
        f'`calibrate` run to it (POST /api/v1/runs with "strategy": {{"name": "calibrate", "world_size": N}}, '
        f'"placement": {{"pool": "{name}"}}), then plan again.'
    )


def device_hardware(*, settings: Settings, device: str, nodes: int = 1, gpus_per_node: int | None = None) -> Hardware:
    """A catalogue device (by key or alias) on `nodes` × `gpus_per_node` (UnknownDevice otherwise)."""
    try:
        spec = catalogue(settings).get(device)
    except KeyError as exc:
        raise UnknownDevice(str(exc.args[0])) from None
    return hardware_for(spec, nodes=nodes, devices_per_node=gpus_per_node)
