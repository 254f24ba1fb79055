"""Rank entry point: `python -m torch.distributed.run --standalone --nproc-per-node N
-m workers.harness.main --job JOB.json --run-dir DIR --trace-cap-bytes B [--cache-dir CACHE]`.

Every strategy, `single` included, runs this one path: load the frozen `ResolvedJob` the launcher
wrote (resolved once, at submission — never again here), set up the rank (runtime), build the
seeded model on CPU, let the strategy shard it, train with the shared loop (a traced job adds
the StepProfiler's window after the timed steps; an untraced one runs no profiler at all),
combine the losses once, then — on rank 0, with the trained model freed — obtain
the fp32 reference curve (computed here, or read from the cache) and write the rank's
`RankRecord` (`RunDir.rank_record`, which `workers.aggregate` merges). Job kinds that train
nothing (`job.trains` false: the collectives sweep, the calibration) run their own sweep instead.

The reference is the `single` run of the same workload and seed in fp32 with no recomputation
and no accumulation (`parallab.core.recipes`): every recipe is held against it, each within the
tolerance of its format. A rank first checks that its device can train in the job's precision.
Any exception exits non-zero with its traceback on stderr and the rank's flight-recorder dump in
the run directory (`workers.harness.flight`; a SIGTERM dumps it too); the process group is always destroyed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.metadata
import os
import platform
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parallab.core.checks import replays_routing
from parallab.core.hardware import DeviceDescription
from parallab.core.jobs import ResolvedJob
from parallab.core.reference import ReferenceSource, aux_loss_coef, cache_path, is_reference, read_cached, reference_job, write_cached
from parallab.core.result import LossCurve, ModelStateBytes, RankRecord
from parallab.core.rundir import RunDir
from parallab.core.spec import Precision
from parallab.core.strategies.base import NoOptions
from parallab.core.strategies.calibrate import CalibrateOptions
from parallab.core.strategies.collectives import CollectivesOptions
from workers import hostspeed, lifeline, strategies, topology
from workers.harness import amp, divergence, faults, flight, frozen, gradcheck, loop, measure, replicas
from workers.harness import routing as routing_module
from workers.harness.families import build_model
from workers.harness.model import Transformer, apply_activation_checkpointing, compile_blocks
from workers.harness.routing import Routing
from workers.harness.runtime import RunContext, init_runtime, shutdown

GRADIENTS_FILE = "gradients.rank0.pt"
"""Rank 0's whole step-0 gradients between the check's step and the comparison (then deleted)."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="workers.harness.main")
    parser.add_argument("--job", type=Path, required=True, help="the frozen ResolvedJob as JSON (RunDir.job)")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--trace-cap-bytes", type=int, required=True, help="cap on one rank's stored (gzipped) Chrome trace")
    parser.add_argument("--cache-dir", type=Path, default=None, help="reference loss curves, by workload hash")
    return parser.parse_args(argv)


def load_job(path: Path) -> ResolvedJob:
    """The job exactly as it was resolved at submission (loading re-runs no rule)."""
    return ResolvedJob.model_validate_json(path.read_text())


def new_model(job: ResolvedJob, *, route_groups: int = 1) -> Transformer:
    """The seeded model with the job's recipe applied: recomputation, fp8's Float8Linear layers, compiled blocks."""
    model = build_model(job.model, seed=job.workload.seed, aux_loss_coef=aux_loss_coef(job), route_groups=route_groups)
    apply_activation_checkpointing(model, job.workload.activation_checkpointing)
    if job.workload.precision == "fp8":
        layout = job.layout
        amp.convert_to_fp8(model, fsdp_all_gather=layout is not None and layout.dp_shard > 1)
    if job.workload.compile:
        compile_blocks(model)
    return model


# ---- the reference: the fp32 `single` curve of the same workload ----


def compute_reference(job: ResolvedJob, ctx: RunContext, progress: loop.Progress) -> list[float]:
    """Train the plain fp32 model on one device (no collectives), routing MoE in dp groups (expert_parallel.py)."""
    single = strategies.get("single")
    ref = reference_job(job)
    solo = dataclasses.replace(
        ctx, rank=0, world_size=1, local_rank=0, local_world_size=1, backend="none", mesh=None, accum_steps=1, precision="fp32"
    )
    options = NoOptions()
    applied = single.apply(new_model(ref, route_groups=job.dp_degree if job.model.is_moe else 1), solo, options)
    result = loop.train(applied=applied, strategy=single, options=options, ctx=solo, job=ref, progress=progress, phase="reference")
    return [float(x) for x in torch.stack(result.losses).cpu()]


def reference_gradients(job: ResolvedJob, ctx: RunContext, routing: Routing | None = None) -> gradcheck.Gradients:
    """Step 0's gradients of the reference model (plain fp32 `single`, MoE routed in dp groups, or
    to the experts the run chose where `routing` has them), whole."""
    return single_gradients(job, ctx, routing)[0]


def single_gradients(
    job: ResolvedJob, ctx: RunContext, routing: Routing | None = None, *, precision: Precision = "fp32", near_tie_gap: float = 0.0
) -> tuple[gradcheck.Gradients, dict[str, routing_module.Tally]]:
    """Step 0's gradients of `single` on the reference workload in `precision` (fp32: the
    reference itself; the run's 16-bit format: its noise), whole, and each router's tally of its
    own choices against the replayed ones (`routing_module.cross_check`)."""
    single = strategies.get("single")
    ref = reference_job(job)
    if precision != ref.workload.precision:
        ref = ResolvedJob(spec=ref.spec.model_copy(update={"workload": ref.spec.workload.model_copy(update={"precision": precision})}))
    solo = dataclasses.replace(
        ctx, rank=0, world_size=1, local_rank=0, local_world_size=1, backend="none", mesh=None, accum_steps=1, precision=precision
    )
    applied = single.apply(new_model(ref, route_groups=job.dp_degree if job.model.is_moe else 1), solo, NoOptions())
    with routing_module.replaying(applied.model, routing or {}, near_tie_gap=near_tie_gap) as tallies:
        grads = gradcheck.strategy_gradients(applied, single, NoOptions(), solo, ref)
    assert grads is not None, "a one-process context is its own rank 0"
    return grads, tallies


def checks_after_training(job: ResolvedJob, ctx: RunContext, run_grads: gradcheck.Gradients, routing: Routing | None) -> dict[str, Any]:
    """Rank 0, with the trained model freed: the gradient check (a 16-bit run against a tolerance
    derived from its format's noise, `gradcheck.tolerance`) and the routing cross-check."""
    precision = job.workload.precision
    gap = routing_module.NEAR_TIE_GAP.get(precision, routing_module.NEAR_TIE_GAP["fp8"])
    reference, tallies = single_gradients(job, ctx, routing, near_tie_gap=gap)
    noise = None
    if precision != "fp32":
        own, _ = single_gradients(job, ctx, routing, precision=precision)
        noise = gradcheck.compare(own, reference, tol=gradcheck.ERROR_CAP).max_rel_err
    tol = gradcheck.tolerance(precision, noise)
    return {
        "gradient_check": gradcheck.compare(run_grads, reference, tol=tol, noise=noise, rule=gradcheck.tolerance_rule(precision, noise)),
        "routing_check": routing_module.cross_check(tallies, precision),
    }


def reference_curve(
    job: ResolvedJob, ctx: RunContext, cache_dir: Path | None, progress: loop.Progress, own: list[float]
) -> tuple[list[float], ReferenceSource]:
    """The reference curve and where it came from: a reference-recipe `single` is its own reference
    (and fills the cache); the others read the cache (which the worker may have filled from the lab
    database) or compute it (and fill the cache)."""
    path = cache_path(cache_dir, job) if cache_dir is not None else None
    source: ReferenceSource
    if is_reference(job):
        curve, source = own, "own"
    elif path is not None and (cached := read_cached(path)) is not None:
        return cached, "host cache"
    else:
        curve, source = compute_reference(job, ctx, progress), "computed"
    if path is not None:
        write_cached(path, job, curve)
    return curve, source


# ---- what rank 0 adds ----


def hardware(ctx: RunContext) -> dict[str, Any]:
    """The host rank 0 runs on, and the job's topology: nodes × devices per host and how the devices
    of a host are wired (the worker adds every node's host name; `hardware_key` groups by this)."""
    cuda = ctx.device.type == "cuda"
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except ImportError:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "device": ctx.device.type,
        "device_name": torch.cuda.get_device_name(ctx.device) if cuda else topology.cpu_name(),
        "device_count": torch.cuda.device_count() if cuda else 1,
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
        "nodes": max(1, ctx.world_size // max(1, ctx.local_world_size)),
        "devices_per_host": ctx.local_world_size,
        "interconnect": topology.interconnect() if cuda else "cpu",
    }


def environment(ctx: RunContext) -> dict[str, Any]:
    try:
        version = importlib.metadata.version("parallab")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"torch": torch.__version__, "python": platform.python_version(), "backend": ctx.backend, "parallab_version": version}


def write_record(run_dir: RunDir, record: RankRecord) -> None:
    run_dir.write_atomic(run_dir.rank_record(record.rank), record.model_dump_json().encode())


# ---- the two kinds of job ----


def describe_device(ctx: RunContext) -> DeviceDescription:
    """This rank's device as the core describes it (a CPU by its model name and the host's memory)."""
    described = amp.describe_device(ctx.device)
    if ctx.device.type != "cuda":
        info = hardware(ctx)
        described = described.model_copy(
            update={"name": info["device_name"], "memory_bytes": info["memory_bytes"], "cores": info["cpu_count"]}
        )
    return described


def run_sweep(job: ResolvedJob, ctx: RunContext, run_dir: RunDir) -> None:
    """A job that trains nothing — the collectives sweep or the calibration — timed as one step."""
    from workers.harness import calibrate, collectives  # only these job kinds need them

    assert isinstance(job.options, CollectivesOptions), f"{job.strategy} is not a sweep"
    # The host's speed right before and after the measurements, every rank at once, as a training
    # run times it around its steps: a prediction from this calibration can be read against a run
    # at the host speed each was measured at.
    probe_before = hostspeed.rates(hostspeed.IN_STEPS)
    start = time.perf_counter()
    profile = None
    if isinstance(job.options, CalibrateOptions):
        profile, points = calibrate.run_calibration(
            model=job.model, options=job.options, rank=ctx.rank, world_size=ctx.world_size, device=ctx.device, describe=describe_device(ctx)
        )
    else:
        points = collectives.run_collectives(ctx.rank, ctx.world_size, ctx.device, job.options)
    seconds = time.perf_counter() - start
    record = RankRecord(
        rank=ctx.rank,
        model_state_bytes=ModelStateBytes(params=0, grads=0, optimizer=0),
        peak_rss_bytes=measure.peak_rss_bytes(),
        step_times_s=[seconds],
        host_probe_before=probe_before,
        host_probe_after=hostspeed.rates(hostspeed.IN_STEPS),
    )
    if ctx.is_lead:
        record = record.model_copy(
            update={
                "collectives": points,
                "calibration": profile,
                "loss": LossCurve(),
                "hardware": hardware(ctx),
                "environment": environment(ctx),
            }
        )
    write_record(run_dir, record)


def run_training(job: ResolvedJob, ctx: RunContext, run_dir: RunDir, cache_dir: Path | None, trace_cap_bytes: int) -> None:
    amp.require_precision(job.workload.precision, ctx.device)
    strategy, options = strategies.get(job.strategy), job.options
    progress = loop.Progress(run_dir, ctx.rank == strategy.progress_rank(ctx, options))
    applied = strategy.apply(new_model(job), ctx, options)
    # The gradient check's step (before warm-up, untimed, no optimizer step): rank 0 keeps the
    # whole gradients on disk, not in memory, while the run trains.
    grads_file = run_dir.path / GRADIENTS_FILE
    progress.phase("gradcheck")
    tol = gradcheck.tolerance(job.workload.precision)
    scans: list[replicas.Scan] = []
    snapshots: list[frozen.Snapshot] = []

    def on_synced(model: torch.nn.Module) -> None:
        scans.append(replicas.scan(model, ctx, of="step-0 gradients", grads=True, tol=tol))
        snapshots.append(frozen.snapshot(model))

    replay = replays_routing(job)
    recorder: contextlib.AbstractContextManager[routing_module.Calls] = (
        routing_module.recording(applied.model) if replay else contextlib.nullcontext({})
    )
    with recorder as calls:
        grads = gradcheck.strategy_gradients(
            applied,
            strategy,
            options,
            ctx,
            job,
            on_synced=on_synced,
        )
    routing = routing_module.gathered(calls, ctx, strategy.data_rank(ctx, options)) if replay else None  # collective
    if grads is not None:
        gradcheck.save(grads, grads_file)
    del grads
    profiler = (
        measure.StepProfiler(
            rank=ctx.rank,
            world_size=ctx.world_size,
            out_dir=run_dir.path,
            device=ctx.device,
            window=job.workload.profiled_steps,
            trace_cap_bytes=trace_cap_bytes,
        )
        if job.spec.trace
        else None
    )
    faults.inject(ctx.rank, ctx.device)  # a test's fault (PARALLAB_TEST_FAULT), none otherwise
    result = loop.train(applied=applied, strategy=strategy, options=options, ctx=ctx, job=job, progress=progress, profiler=profiler)

    # After the measured steps (and the profiled window): the collectives of the bookkeeping, then the measurements.
    losses = loop.global_losses(result, weight=strategy.loss_weight(ctx, options), ctx=ctx)
    divergence.check_curve(losses, first_step=job.workload.warmup_steps + 1, rank=ctx.rank)
    # An untraced run says so (no profiled step): its comm, bubble and breakdown were not measured.
    profiled: dict[str, Any] = profiler.results().record_fields() if profiler is not None else {"profiled_steps": 0}
    if result.peak_allocated_bytes is not None:  # CUDA: the allocator's own peak over the timed steps
        profiled.update(peak_allocated_bytes=result.peak_allocated_bytes, peak_reserved_bytes=result.peak_reserved_bytes)
    # Every copy that should be identical, after the last step (collective: before rank 0 goes on alone).
    scans.append(replicas.scan(applied.model, ctx, of="final parameters", grads=False, tol=tol))
    # The end-of-run check: the parameters now against their copies at the check's step.
    last_step = job.workload.warmup_steps + job.workload.steps + (profiler.steps if profiler is not None else 0)
    began = time.perf_counter()
    frozen_check = frozen.verdict(applied.model, snapshots[0], ctx, last_step=last_step)
    frozen_s = time.perf_counter() - began
    snapshots.clear()  # the copies at the check's step: not held into the reference run
    record = RankRecord(
        rank=ctx.rank,
        model_state_bytes=measure.model_state_bytes(applied.model, result.optimizer),
        step_times_s=result.step_times_s,
        host_probe_before=result.probe_before or None,
        host_probe_after=result.probe_after or None,
        moe=loop.moe_stats(applied.model, ctx=ctx),
        **profiled,
        peak_rss_bytes=measure.peak_rss_bytes(),  # before rank 0's reference run adds its own
    )

    del applied, result, profiler
    gc.collect()  # the pipeline schedule and its stage reference the module: cycles
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    if ctx.is_lead:
        lead_progress = loop.Progress(run_dir, True)
        reference, source = reference_curve(job, ctx, cache_dir, lead_progress, own=losses)
        lead_progress.phase("gradcheck")
        checks = checks_after_training(job, ctx, gradcheck.load(grads_file), routing)
        grads_file.unlink()
        record = record.model_copy(
            update={
                "loss": LossCurve(values=losses, reference=reference, reference_source=source),
                "hardware": hardware(ctx),
                "environment": environment(ctx),
                **checks,
                "replica_check": replicas.verdict(scans, tol=tol),
                "frozen_check": frozen_check,
            }
        )
        print(f"parallab: end-of-run frozen-parameter check {frozen_s * 1e3:.1f} ms", file=sys.stderr, flush=True)
    progress.phase("storing")
    write_record(run_dir, record)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    code = 0
    recorder: flight.Recorder | None = None
    try:
        run_dir = RunDir(args.run_dir).create()
        job = load_job(args.job)
        ctx = init_runtime(job)
        recorder = flight.Recorder(run_dir, rank=ctx.rank, world_size=ctx.world_size, backend=ctx.backend)
        recorder.arm()  # a SIGTERM (torchrun's, after another rank failed; the worker's timeout) dumps it too
        if job.trains:
            run_training(job, ctx, run_dir, args.cache_dir, args.trace_cap_bytes)
        else:
            run_sweep(job, ctx, run_dir)
        if dist.is_initialized() and ctx.world_size > 1:
            dist.barrier()  # nobody tears the group down while rank 0 still computes the reference
    except divergence.Diverged as exc:  # a fault the worker reports as data, not as a traceback
        divergence.write_failure(RunDir(args.run_dir), exc.record)
        print(f"parallab: {exc}", file=sys.stderr, flush=True)
        code = 1
    except BaseException as exc:  # noqa: BLE001 — any failure: traceback to stderr, non-zero exit
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        if recorder is not None:  # where this rank stood among the collectives, for the worker's analysis
            recorder.dump(f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        shutdown()
    return code


if __name__ == "__main__":
    # torchrun starts each rank in a session of its own: without this, a killed agent would leave
    # the rank training under PID 1 (see workers.lifeline).
    lifeline.die_with_parent(signal.SIGKILL)
    exit_code = main()
    # Leave without the interpreter's teardown: by now the rank's record and traces are written
    # and closed and its group is left (`main`'s finally). Unwinding torch's modules and gloo's
    # threads took 1.2–1.5 s of a 4-rank torchrun's wall on a 2-core host (a torch no-op job:
    # 1.7–2.1 s from the ranks' last line to torchrun's exit, 0.5–0.6 s with `os._exit`).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
