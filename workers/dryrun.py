"""A dry run at full scale: the real rank code of a layout, one rank at a time, in one process.

`parallab plan --dry-run` asks what a layout would do on, say, 512 GPUs before any are booked.
For each rank it looks at, this module

1. initialises torch's fake process group (`dist.init_process_group("fake", ...)` over a
   `FakeStore`: every collective completes at once and moves no data) at the target world size,
   and builds the job's `DeviceMesh` with its named dims in torchtitan's order;
2. builds the seeded model under `FakeTensorMode` (tensors that claim the CPU but hold no memory,
   so a 405B-parameter model costs nothing), and applies the layout through the one rank-side
   composition (`workers.strategies.compose`: pipeline split, TP, FSDP/HSDP, DDP);
3. runs one real optimizer step of the shared loop (`workers.harness.loop.train`) under the fake
   mode, recording every collective the code issues with the mesh dim its group is;
4. measures the rank's parameter, gradient and optimizer-state bytes (`measure.model_state_bytes`).

It then holds them against the planner's formulas: each rank's model state against its stage's
prediction, and each dimension's bytes by op (the max over the ranks looked at) against that
dimension's `CommItem`s from `parallab.core.dims.compose`.

The ranks looked at are one per pipeline stage plus the world's last rank: every other dim's ranks
are symmetric (same shapes, same group sizes), and a stage is what differs. Each runs in a forked
child (a fresh process group; the imports are shared). Under a pipeline the schedule's shape
handshake with its peers is answered on their behalf (`answered_handshake`), and the step that
does it is a warm-up before the recorded one. fp16 is refused: its loss-scale check reads a value
(`.item()`) that a fake tensor does not have (bf16 moves the same bytes). So are cp and ep: ring
attention skips the K/V blocks its causal mask hides and MoE splits its rows by the router's
per-expert counts, decisions read from values a fake tensor has none of.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.distributed_c10d import GroupName, _resolve_process_group
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from parallab.core import dims
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.layout import Layout
from parallab.core.prediction import predict
from parallab.core.spec import JobSpec
from workers import strategies
from workers.harness import attribution, loop, measure
from workers.harness.main import new_model
from workers.harness.runtime import RunContext

TOLERANCE = 0.01
"""Dry-run bytes agree with the formulas within 1%."""


class DryRunRefused(ValueError):
    """A job the dry run cannot run, with the reason (the CLI prints it and exits 2)."""


class DryRunFailed(RuntimeError):
    """The rank code raised under the dry run (a layout the ranks cannot apply): its traceback."""


@dataclass(frozen=True)
class Call:
    """One collective request: the mesh dim its group is, the op, its bytes (nccl-tests' convention)."""

    dim: str
    op: str
    nbytes: int
    group_size: int


@dataclass
class RankRun:
    rank: int
    coordinates: dict[str, int]
    """This rank's index on each mesh dim."""
    state: dict[str, int]
    """Measured {params, grads, optimizer} bytes."""
    predicted_state: dict[str, int]
    calls: list[Call] | None
    """Every collective of the step (None: the step was not run)."""
    seconds: float
    stage: int | None = None
    """Its pipeline stage (None without a pipeline)."""
    sent: object | None = None
    """The shape metadata its stage sent the next one (the pipeline's handshake)."""

    def comm(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(dim, op) → (bytes, calls) of the step."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for c in self.calls or []:
            nbytes, calls = out.get((c.dim, c.op), (0, 0))
            out[(c.dim, c.op)] = (nbytes + c.nbytes, calls + 1)
        return out


@dataclass(frozen=True)
class Gap:
    """One measured figure beside its prediction."""

    what: str
    measured: int
    predicted: int

    @property
    def relative(self) -> float:
        if self.predicted == 0:
            return 0.0 if self.measured == 0 else float("inf")
        return abs(self.measured - self.predicted) / self.predicted

    @property
    def ok(self) -> bool:
        return self.relative <= TOLERANCE


@dataclass
class DryRun:
    job: ResolvedJob
    layout: Layout
    mesh: list[tuple[str, int]]
    ranks: list[RankRun] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    note: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.gaps) and all(g.ok for g in self.gaps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.label(),
            "world_size": self.job.world_size,
            "mesh": dict(self.mesh),
            "passed": self.passed,
            "tolerance": TOLERANCE,
            "seconds": round(self.seconds, 2),
            "note": self.note,
            "ranks": [
                {
                    "rank": r.rank,
                    "coordinates": r.coordinates,
                    "model_state_bytes": r.state,
                    "predicted_model_state_bytes": r.predicted_state,
                    "comm": None
                    if r.calls is None
                    else [{"dim": d, "op": op, "bytes": b, "calls": n} for (d, op), (b, n) in sorted(r.comm().items())],
                    "seconds": round(r.seconds, 2),
                }
                for r in self.ranks
            ],
            "checks": [
                {"what": g.what, "measured": g.measured, "predicted": g.predicted, "relative": g.relative, "ok": g.ok} for g in self.gaps
            ],
        }


# ---- the job as a layout ----


def as_layout_job(job: ResolvedJob) -> ResolvedJob:
    """The same job as the explicit `layout` strategy, one optimizer step, no warm-up: every
    layout runs through the one composition (a preset's descriptor predicts what its layout's does)."""
    layout = job.layout
    if layout is None:
        raise DryRunRefused(f"strategy.name: {job.strategy} trains nothing; there is nothing to dry-run")
    if job.workload.precision == "fp16":
        raise DryRunRefused(
            "workload.precision: fp16's loss-scale check reads a gradient value, which a fake tensor has none of; "
            "dry-run bf16 (the same bytes)"
        )
    valued = [f"{name}={degree}" for name, degree in (("cp", layout.cp), ("ep", layout.ep)) if degree > 1]
    if valued:
        raise DryRunRefused(
            f"strategy.options: {' and '.join(valued)} decide by values a fake tensor has none of (ring attention's causal "
            "blocks, MoE's per-expert row counts); run them on real ranks (`parallab bench`)"
        )
    if layout.pp > 1 and layout.virtual_stages > 1:
        raise DryRunRefused(
            f"strategy.options.virtual_stages: the dry run answers one stage's shape handshake per rank, not "
            f"{layout.virtual_stages} chunks' (schedule {layout.schedule}); run it on real ranks (`parallab bench`)"
        )
    doc = job.spec.model_dump(mode="json")
    doc["workload"].update(steps=1, warmup_steps=0)
    options = {k: v for k, v in layout.as_dict().items() if k in strategies_layout_fields()}
    doc["strategy"] = {"name": "layout", "world_size": job.world_size, "options": options}
    doc["trace"] = False
    return resolve_job(JobSpec.model_validate(doc), Limits())


def strategies_layout_fields() -> frozenset[str]:
    from parallab.core.strategies.layout import LayoutOptions

    return frozenset(LayoutOptions.model_fields)


# ---- one rank ----


def _group(named: Mapping[str, object]) -> dist.ProcessGroup | None:
    """The process group a c10d or functional collective runs on (see `measure.group_size`)."""
    name = named.get("group_name")
    if isinstance(name, str):
        return _resolve_process_group(GroupName(name))
    group = named.get("process_group")
    if isinstance(group, torch.ScriptObject):
        return dist.ProcessGroup.unbox(group)
    return group if isinstance(group, dist.ProcessGroup) else None


class _DimRecorder(TorchDispatchMode):
    """Every collective the step asks for (as the profiler's recorder counts it), tagged with the
    mesh dim whose group it runs on ("world" for the default group)."""

    def __init__(self, dim_of: dict[frozenset[int], str]):
        super().__init__()
        self.dim_of = dim_of
        self.calls: list[Call] = []

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Sequence[type], args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None
    ) -> object:
        kwargs = kwargs or {}
        name = func._schema.name
        if attribution.is_comm_op(name):
            named: dict[str, object] = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
            named.update(kwargs)
            group = _group(named)
            ranks = frozenset(dist.get_process_group_ranks(group)) if group is not None else frozenset()
            dim = self.dim_of.get(ranks, "world" if len(ranks) in (0, dist.get_world_size()) else "?")
            size = len(ranks) or dist.get_world_size()
            self.calls += [Call(dim, kind, n, size) for kind, n in attribution.requests_of(name, named, measure.local_nbytes)]
        return func(*args, **kwargs)


@contextmanager
def answered_handshake(received: object | None, sent: list[object]) -> Iterator[None]:
    """The pipeline's shape handshake answered on the peers' behalf (torch 2.13's private
    `torch.distributed.pipelining` methods, patched for the dry run only). Before its first
    micro-batch each stage votes on static or dynamic shapes and, when dynamic, receives its
    input's metadata from the previous stage and its output gradients' from the next — P2P of
    values a process group that moves no data cannot deliver. Here the vote is dynamic, the
    forward metadata is `received` (what the previous stage's dry run sent, recorded in `sent`),
    and the output gradients' metadata is derived from this stage's own outputs (a gradient has
    its tensor's shape and dtype), exactly what the next stage would send."""
    from torch.distributed.pipelining import _utils, schedules, stage

    def vote(self: object, stages: list[stage.PipelineStage], has_backward: bool, p2p_done: bool) -> None:
        for s in stages:
            s._inference_mode = _utils.InferenceMode.DYNAMIC

    def recv_meta(self: stage.PipelineStage, src_stage: int) -> object:
        if src_stage < self.stage_index:
            return received
        outputs = self._stage_meta.outputs
        assert outputs is not None, "forward inference ran first"
        return _utils._StageBackwardMeta(backward_metas=_utils._derive_grad_metas(outputs))

    def send_meta(self: stage.PipelineStage, meta: object, dst_stage: int) -> None:
        if dst_stage > self.stage_index:
            sent.append(meta)

    saved = (schedules._PipelineSchedule._warmup_p2p, stage.PipelineStage._recv_meta, stage.PipelineStage._send_meta)
    schedules._PipelineSchedule._warmup_p2p = vote  # type: ignore[method-assign,assignment]
    stage.PipelineStage._recv_meta = recv_meta  # type: ignore[method-assign]
    stage.PipelineStage._send_meta = send_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        schedules._PipelineSchedule._warmup_p2p, stage.PipelineStage._recv_meta, stage.PipelineStage._send_meta = saved  # type: ignore[method-assign]


def _dims_of(mesh: DeviceMesh | None) -> dict[frozenset[int], str]:
    if mesh is None:
        return {}
    names = mesh.mesh_dim_names or ()
    return {frozenset(dist.get_process_group_ranks(mesh[n].get_group() if mesh.ndim > 1 else mesh.get_group())): n for n in names}


def run_rank(job: ResolvedJob, rank: int, predicted: dict[str, Any], received: object | None = None) -> RankRun:
    """Rank `rank` of `job` (a `layout` job) on the fake process group: build, apply, one step."""
    start = time.perf_counter()
    layout = job.layout
    assert layout is not None, "a layout job trains"
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=job.world_size)
    try:
        shape = tuple(d.size for d in job.mesh)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(d.name for d in job.mesh)) if shape else None
        ctx = RunContext(
            rank=rank,
            world_size=job.world_size,
            local_rank=0,
            local_world_size=1,
            device=torch.device("cpu"),
            backend="fake",
            accum_steps=job.accum_steps,
            precision=job.workload.precision,
            mesh=mesh,
        )
        coordinates = (
            {n: mesh[n].get_local_rank() if mesh.ndim > 1 else mesh.get_local_rank() for n in mesh.mesh_dim_names or ()} if mesh else {}
        )
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        with fake:
            model = new_model(job)
        # The mesh's own index tensors must stay real (DeviceMesh reads them), so the composition
        # runs outside the mode; the parameters it shards are fake, and so is all it derives.
        strategy = strategies.get(job.strategy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TP's plan names the head a non-last stage dropped
            applied = strategy.apply(model, ctx, job.options)
        recorder = _DimRecorder(_dims_of(mesh))
        sent: list[object] = []

        def step() -> torch.optim.Optimizer:
            return loop.train(
                applied=applied, strategy=strategy, options=job.options, ctx=ctx, job=job, progress=loop.Progress(None, False)
            ).optimizer

        with fake, answered_handshake(received, sent):
            if layout.pp > 1:
                step()  # the schedule's first step infers shapes (forward and backward): a warm-up, as on the ranks
            with recorder:
                optimizer = step()
        calls = recorder.calls
        state = measure.model_state_bytes(applied.model, optimizer)
        stage = ctx.mesh_dim("pp").get_local_rank() if layout.pp > 1 else None
        per_stage = predicted.get("model_state_bytes_per_stage")
        expected = per_stage[stage] if per_stage and stage is not None else predicted["model_state_bytes_per_rank"]
        run = RankRun(rank, coordinates, state.model_dump(), dict(expected), calls, time.perf_counter() - start, stage)
        run.sent = sent[0] if sent else None
        return run
    finally:
        dist.destroy_process_group()


def run_forked(job: ResolvedJob, rank: int, predicted: dict[str, Any], received: object | None = None) -> RankRun:
    """`run_rank` in a forked child: each rank needs a fresh process group, and the meshes and
    DTensor placements of the last one outlive `destroy_process_group` in torch's caches. A fork
    shares the imports already made (seconds of torch), so a rank costs its own work only."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, job, rank, predicted, received), daemon=True)
    child.start()
    send.close()
    try:
        ok, value = receive.recv()
    except EOFError:
        ok, value = False, f"rank {rank}'s dry run died (exit code {child.exitcode})"
    child.join()
    if not ok:
        raise DryRunFailed(value)
    assert isinstance(value, RankRun)
    return value


def _child(send: Connection, job: ResolvedJob, rank: int, predicted: dict[str, Any], received: object | None) -> None:
    try:
        send.send((True, run_rank(job, rank, predicted, received)))
    except BaseException:  # noqa: BLE001 — the parent reports it
        send.send((False, f"rank {rank}: {traceback.format_exc()}"))
    finally:
        send.close()


# ---- the whole run ----


def ranks_to_run(layout: Layout, world_size: int) -> list[int]:
    """One rank per pipeline stage (the first of its block: pp is the outermost dim), and the last rank."""
    per_stage = layout.inner("pp")
    return sorted({s * per_stage for s in range(layout.pp)} | {world_size - 1})


def dry_run(job: ResolvedJob, *, ranks: Sequence[int] | None = None) -> DryRun:
    """Dry-run `job` at its world size and hold what it did against the planner's formulas."""
    start = time.perf_counter()
    if dist.is_initialized():
        raise DryRunRefused("a process group is already initialised in this process; the dry run needs its own")
    job = as_layout_job(job)
    layout = job.layout
    assert layout is not None
    predicted = predict(job)
    out = DryRun(job=job, layout=layout, mesh=[(d.name, d.size) for d in job.mesh])
    per_stage = layout.inner("pp")
    sent: dict[int, object] = {}  # stage → the shape metadata it sent on (ranks run in stage order)
    for rank in sorted(ranks if ranks is not None else ranks_to_run(layout, job.world_size)):
        if not 0 <= rank < job.world_size:
            raise DryRunRefused(f"rank {rank} is not in a world of {job.world_size}")
        stage = rank // per_stage
        # every stage before the last sends the same residual-stream metadata on: the latest one does
        run = run_forked(job, rank, predicted, sent[max(sent)] if sent else None)
        if run.sent is not None:
            sent[stage] = run.sent
        out.ranks.append(run)
    out.gaps += state_gaps(out.ranks) + comm_gaps(job, layout, out.ranks)
    out.seconds = time.perf_counter() - start
    return out


def state_gaps(ranks: list[RankRun]) -> list[Gap]:
    """Per stage, the most any of its ranks holds of each part, against the prediction (which is
    the busiest rank's: FSDP's last shard may be smaller). Gradients and AdamW's state exist only
    after a step."""
    out = []
    for stage in sorted({r.stage or 0 for r in ranks}):
        group = [r for r in ranks if (r.stage or 0) == stage]
        stepped = all(r.calls is not None for r in group)
        where = f"stage {stage} " if group[0].stage is not None else ""
        for part in ("params", "grads", "optimizer") if stepped else ("params",):
            busiest = max(group, key=lambda r: r.state[part])
            out.append(
                Gap(
                    f"{where}{part} bytes per rank (ranks {', '.join(str(r.rank) for r in group)})",
                    busiest.state[part],
                    busiest.predicted_state[part],
                )
            )
    return out


def comm_gaps(job: ResolvedJob, layout: Layout, ranks: list[RankRun]) -> list[Gap]:
    """Each dimension's bytes by op: the most any rank looked at issued, against its `CommItem`s."""
    composition = dims.compose(job, layout)
    predicted: dict[tuple[str, str], int] = {}
    for dim in dims.APPLY_ORDER:
        for item in dim.comm(composition.plan):
            predicted[(dim.name, item.op)] = predicted.get((dim.name, item.op), 0) + item.bytes_per_step
    measured: dict[tuple[str, str], int] = {}
    for r in ranks:
        for key, (nbytes, _calls) in r.comm().items():
            measured[key] = max(measured.get(key, 0), nbytes)
    return [
        Gap(f"{dim} {op} bytes per step", measured.get((dim, op), 0), predicted.get((dim, op), 0))
        for dim, op in sorted(set(predicted) | set(measured))
    ]
