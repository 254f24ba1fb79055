"""Per-rank measurement that every strategy shares: model-state bytes, peak RSS, device peaks,
and the profiled window of a traced job.

Runs inside the ranks (imports torch); writes files in the run directory only — the rank's record
is a JSON file the worker merges. This module drives `torch.profiler`, kernels on the c10d ops that
record the communication asked for, and the memory watch (`workers.harness.memwatch`: MemTracker and
the phase marks); what their output means (op kinds, bytes,
which backend event timed which request, where a step's time goes, the pipeline's actions, the
timeline) is decided in `workers.harness.attribution`, which needs no torch and is tested on its own.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName, _resolve_process_group
from torch.distributed.tensor import DTensor

from parallab.core import tracestream
from parallab.core.critpath import StepSegments
from parallab.core.result import CommOp, MemoryPeak, MemoryPoint, ModelStateBytes, StepBreakdown, TimelineEvent
from parallab.core.rundir import RunDir
from parallab.core.stragglers import GroupTimes, columns
from workers.harness import attribution, critsegments, memtimeline
from workers.harness.attribution import CommRequest
from workers.harness.memwatch import (
    cuda_history,
    cuda_snapshot,
    known_storages,
    mark_phase,
    memory_sampler,
    peak_breakdown,
    phase_marks,
    storage_names,
    track_memory,
)


def local_nbytes(t: object) -> int:
    """Bytes this rank actually holds for tensor `t` (a DTensor's local shard, not the global size); 0 for non-tensors."""
    if not isinstance(t, torch.Tensor):
        return 0
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> ModelStateBytes:
    """Exact params / grads / optimizer-state bytes held by this rank, from its own local tensors."""
    params = list({id(p): p for p in model.parameters()}.values())
    opt_bytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            opt_bytes += sum(local_nbytes(value) for value in state.values())
    return ModelStateBytes(
        params=sum(local_nbytes(p) for p in params),
        grads=sum(local_nbytes(p.grad) for p in params if p.grad is not None),
        optimizer=opt_bytes,
    )


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def live_memory_bytes(device: torch.device) -> int:
    """This rank's memory now, for the live chart: the CUDA allocator's allocated bytes, or the
    process' resident set size on CPU (what the profiler's peak is not: it is read after the run)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


def reset_device_peaks(device: torch.device) -> None:
    """Start the CUDA allocator's peak counters afresh (no-op on CPU, which keeps no allocator stats)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_peaks(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since `reset_device_peaks`: the CUDA allocator's own
    counters, everything it held (parameters included); (None, None) on CPU."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def group_size(args: Mapping[str, object]) -> int | None:
    """The size of the process group a c10d op runs on: its `group_size` argument (functional
    all-gather / reduce-scatter), its `group_name` (functional ops: resolved to the group), or its
    `process_group` (c10d ops); None when none of them tells."""
    named = attribution.group_size_arg(args)
    if named is not None:
        return named
    name = args.get("group_name")
    if isinstance(name, str):
        return int(_resolve_process_group(GroupName(name)).size())
    group = args.get("process_group")
    if isinstance(group, torch.ScriptObject):  # what the dispatcher passes for a c10d op's group
        return int(dist.ProcessGroup.unbox(group).size())
    if isinstance(group, dist.ProcessGroup):
        return int(group.size())
    return None


def group_key(args: Mapping[str, object]) -> str | None:
    """The op's process group as its global ranks, comma-separated (the key that matches one
    collective across ranks); None when the op names no group."""
    name = args.get("group_name")
    group: object = _resolve_process_group(GroupName(name)) if isinstance(name, str) else args.get("process_group")
    if isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    if not isinstance(group, dist.ProcessGroup):
        return None
    return ",".join(map(str, sorted(dist.get_process_group_ranks(group))))


def peer_of(args: Mapping[str, object]) -> int | None:
    """The global rank at the other end of a c10d send (`dst`) or receive (`src`): the op names it
    by its rank in the group; None for other ops or when it does not tell."""
    peer = args.get("dst", args.get("src"))
    if not isinstance(peer, int):
        return None
    key = group_key(args)
    if key is None:
        return peer
    members = [int(x) for x in key.split(",")]
    return members[peer] if 0 <= peer < len(members) else None


_PRE_DISPATCH = torch._C.DispatchKeySet(torch._C.DispatchKey.PreDispatch)
_ACTIVE: list[_CommRecorder] = []
"""The recorders now entered, innermost last: the one the c10d kernels record into."""
_KERNELS: list[torch.library.Library] = []
"""The recording kernels' registration, made once a process (see `_CommRecorder`)."""


def _recorded(op: torch._ops.OpOverload, *args: object, **kwargs: object) -> object:
    """A c10d op's kernel at the PreDispatch key: tell the active recorder, then run the op below it."""
    if _ACTIVE:
        _ACTIVE[-1].record(op, args, kwargs)
    with torch._C._ExcludeDispatchKeyGuard(_PRE_DISPATCH):
        return op(*args, **kwargs)


def _install_kernels() -> None:
    if _KERNELS:
        return
    lib = torch.library.Library("c10d", "IMPL")
    for name in attribution.C10D_OPS:
        namespace, op = name.split("::")
        if namespace == "c10d":
            lib.impl(op, functools.partial(_recorded, getattr(torch.ops.c10d, op).default), "PreDispatch")
    _KERNELS.append(lib)


class _CommRecorder:
    """Records every c10d op issued while it is active: what each asked for, in issue order.

    Every path to a process group ends in a c10d op (`c10d::allreduce_`, `c10d::_allgather_base_`,
    `c10d::send`, …): DDP's reducer, FSDP2, DTensor's and the functional collectives (which call the
    process group, which dispatches the c10d op), the functional autograd collectives,
    `batch_isend_irecv` (one send or receive each). A Python kernel at the PreDispatch key of each
    c10d op records the call and runs the op below that key; the key is in this thread's dispatch
    keys only while a recorder is active (the autograd engine carries a thread's keys into its
    own threads, so backward's collectives come through), and every other op falls through it in
    C++. So each request is counted once, as the process group ran it, and the profiled step pays
    for its collectives alone. (A TorchDispatchMode over every aten op, the recorder before, cost
    40–90 ms of a ~50–100 ms tiny or small step on CPU even as a bare pass-through: every op's
    arguments boxed into Python; the profiled window's steps were that much longer than the timed
    ones, and that cost's noise was most of a diff's residual.) The kernels are registered once a
    process and stay: outside a recorder the key is never dispatched to.
    """

    def __init__(self) -> None:
        self.requests: list[CommRequest] = []
        self.peers: list[int | None] = []
        """Request i's other end (global rank) for a send or receive whose peer the op names; else None."""
        self.step = 0
        self._guard: Any = None

    def record(self, op: torch._ops.OpOverload, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        named: dict[str, object] = dict(zip((a.name for a in op._schema.arguments), args, strict=False))
        named.update(kwargs)
        made = attribution.record(
            op._schema.name, named, local_nbytes, step=self.step, group_size=group_size(named), group=group_key(named)
        )
        self.requests += made
        self.peers += [peer_of(named)] * len(made)

    def __enter__(self) -> _CommRecorder:
        _install_kernels()
        self._guard = torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.PreDispatch)
        self._guard.__enter__()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)
        self._guard.__exit__(*exc)
        self._guard = None


# ---- the profiled window ----

CLOCK_ANCHOR = "parallab.clock"
"""A profiler range opened right after reading the wall clock, once per profiled step: trace
times are per process, and the pipeline's bubble compares every stage's actions on one clock."""


@dataclass
class ProfileResult:
    """What the profiled window measured, under the names the rank record (`RankRecord`) gives them."""

    comm: list[CommOp] = field(default_factory=list)
    comm_time_fraction: float | None = None
    exposed_comm_time_s: float | None = None
    step_time_breakdown: StepBreakdown | None = None
    pipeline_actions_us: list[list[tuple[float, float]]] | None = None
    memory_breakdown: dict[str, int] | None = None
    peak_allocated_bytes: int | None = None
    timeline: list[TimelineEvent] = field(default_factory=list)
    memory_timeline: list[MemoryPoint] = field(default_factory=list)
    memory_peak: MemoryPeak | None = None
    profiled_steps: int = 0
    trace_file: str | None = None
    trace_note: str | None = None
    collective_times: list[GroupTimes] | None = None
    step_segments: list[StepSegments] | None = None

    def record_fields(self) -> dict[str, Any]:
        """The fields as keyword arguments of `RankRecord` (a CUDA peak comes from the allocator, not from here)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class StepProfiler:
    """The profiled window of a traced job: extra steps run *after* the timed ones, so no timed
    step ever runs under the profiler, the collective recorder or MemTracker.

    :meth:`run` drives `skip + window` steps. The first `skip` are the profiler's warm-up (its
    start-up cost lands there, and they are not exported); the first of them runs under MemTracker,
    which splits that step's peak memory (`memory_breakdown`; on CPU `peak_allocated_bytes` is its
    total). The `window` steps after them are profiled with the comm recorder active; from them
    :meth:`results` derives the per-step comm ops, ``comm_time_fraction`` (the union of the comm
    spans over the step: calls that overlap each other count once), the step-time split
    (`step_time_breakdown`, ``exposed_comm_time_s``), a pipeline stage's actions per step on the
    host's wall clock (``pipeline_actions_us``: the bubble needs every stage's, so the merge
    computes it, `parallab.core.metrics.pipeline_bubble`), the timeline of the last profiled step
    and the Chrome trace. Times are those of the profiled steps (slower than the timed ones: the
    profiler's per-op cost); the fractions are what they are measured for.

    The CUDA path (kernel intervals per stream, NCCL kernel names) follows the same attribution
    and is unit-tested on synthetic CUDA traces; it has not been run on a GPU yet.

    `trace_cap_bytes` bounds the stored (gzipped) Chrome trace — the worker's
    `Settings.max_trace_bytes`, passed by the launcher; None: no cap.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        out_dir: Path,
        device: torch.device,
        window: int = 3,
        skip: int = 1,
        trace_cap_bytes: int | None = None,
        max_timeline_events: int = 5000,
    ):
        if skip < 1 or window < 1:
            raise ValueError(
                f"the profiled window needs skip ≥ 1 (MemTracker's step, the profiler's warm-up) and window ≥ 1: {skip}, {window}"
            )
        self.rank = rank
        self.world_size = world_size
        self.run_dir = RunDir(Path(out_dir))
        self.device = torch.device(device)
        self.window = window
        self.skip = skip
        self.trace_cap_bytes = trace_cap_bytes
        self.max_timeline_events = max_timeline_events
        self._recorder = _CommRecorder()
        self._anchors: list[float] = []
        self._memory: tuple[dict[str, int], int] | None = None
        self._profiled = 0
        self._raw_trace: Path | None = None
        self._results: ProfileResult | None = None
        self._known = memtimeline.Known()
        self._cuda_snapshot: dict[str, Any] | None = None

    @property
    def steps(self) -> int:
        """Steps the window adds after the timed ones."""
        return self.skip + self.window

    def run(
        self,
        step: Callable[[int], object],
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        synchronize: Callable[[], None],
    ) -> None:
        """Run `step(i)` for i in range(self.steps) as described above; `synchronize` waits for the device."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=self.skip, active=self.window, repeat=1),
            profile_memory=True,
            on_trace_ready=self._save_raw,
        )
        prof.start()
        try:
            for i in range(self.steps):
                synchronize()
                if i == 0:
                    with track_memory(model, optimizer) as tracker:
                        step(i)
                        synchronize()
                    self._memory = peak_breakdown(tracker, self.device)
                    del tracker
                elif i >= self.skip:
                    self._recorder.step = i - self.skip
                    # The wall clock beside a profiler range: puts this rank's trace on the clock every rank shares.
                    self._anchors.append(time.time_ns() / 1e3)
                    with torch.profiler.record_function(CLOCK_ANCHOR):
                        pass
                    last = i == self.steps - 1
                    sample = memory_sampler(self.device) if last else None
                    if last:
                        with torch.profiler.record_function(critsegments.HARNESS_RANGE):
                            self._known.start = known_storages(model, optimizer, self.device, others=True)
                            self._known.names = storage_names(model, optimizer, self.device)
                        if self.device.type == "cuda":
                            cuda_history(True)
                        mark_phase("step start", sample)
                    with self._recorder, phase_marks(model, sample):
                        step(i)
                        synchronize()
                    if last:
                        with torch.profiler.record_function(critsegments.HARNESS_RANGE):
                            self._known.end = {
                                a: c for a, (c, _) in known_storages(model, optimizer, self.device, others=False).items() if c != "params"
                            }
                            self._known.names.update(storage_names(model, optimizer, self.device))
                        if self.device.type == "cuda":
                            self._cuda_snapshot = cuda_snapshot()
                            cuda_history(False)
                    self._profiled += 1
                else:
                    step(i)
                synchronize()
                prof.step()
        finally:
            prof.stop()

    def _save_raw(self, prof: torch.profiler.profile) -> None:
        self.run_dir.create()
        self._raw_trace = self.run_dir.raw_trace(self.rank)
        prof.export_chrome_trace(str(self._raw_trace))

    # -- results --

    def results(self) -> ProfileResult:
        if self._results is None:
            self._results = self._compute()
        return self._results

    def _window_spans(self, events: Sequence[attribution.TraceEvent]) -> list[attribution.TraceEvent]:
        """The profiled steps' spans, `ProfilerStep#skip` … (the warm-up steps are #0 … #skip-1)."""
        names = {f"ProfilerStep#{self.skip + i}" for i in range(self._profiled)}
        return sorted((e for e in events if e.get("ph") == "X" and e.get("name") in names), key=lambda e: float(e["ts"]))

    def _compute(self) -> ProfileResult:
        out = ProfileResult(profiled_steps=self._profiled)
        if self._memory is not None:
            out.memory_breakdown, total = self._memory
            if self.device.type != "cuda":
                out.peak_allocated_bytes = total
        doc: dict[str, Any] = {}
        unread: str | None = None
        if self._raw_trace is not None and self._raw_trace.exists():
            try:
                doc = tracestream.read_document(self._raw_trace)
            except (tracestream.NotATrace, UnicodeDecodeError) as exc:
                unread = f"the profiler's trace could not be read ({exc}); its analyses were skipped"
        events: list[dict[str, Any]] = doc.get("traceEvents", [])
        spans = self._window_spans(events)
        if spans:
            steps = len(spans)
            requests = attribution.attribute(self._recorder.requests, events)
            out.comm = attribution.summarize_comm(requests, steps, self.world_size)
            split = attribution.Breakdown(0.0, 0.0, 0.0, 0.0, 0.0)
            stage_steps: list[list[tuple[float, float]]] = []
            busy: list[attribution.Interval] = []
            for span, own in zip(spans, attribution.within(events, spans), strict=True):
                busy = attribution.busy(own, span, device=self.device.type)
                split += attribution.breakdown(busy, attribution.comm_intervals(requests, span), span)
                stage_steps.append([(a.start, a.end) for a in attribution.actions(own, span, device=self.device.type)])
            per_step = split.scaled(1e-6 / steps)  # µs over the window -> seconds per step
            out.step_time_breakdown = StepBreakdown(
                compute_s=per_step.compute,
                exposed_comm_s=per_step.exposed_comm,
                overlapped_comm_s=per_step.overlapped_comm,
                idle_s=per_step.idle,
                step_s=per_step.step,
            )
            out.exposed_comm_time_s = per_step.exposed_comm
            # The union of the comm spans on this rank's timeline (overlapping calls counted once),
            # so exposed ≤ total by construction: both come from the same intervals.
            out.comm_time_fraction = attribution.comm_time_fraction(split)
            offset = self._clock_offset(events)
            if offset is not None:
                out.collective_times = columns(attribution.arrivals(requests, offset))
                out.step_segments = critsegments.step_segments(
                    events, requests, self._recorder.peers, spans, rank=self.rank, offset_us=offset, device=self.device.type
                )
            if offset is not None and any(stage_steps):
                out.pipeline_actions_us = [[(a + offset, b + offset) for a, b in step] for step in stage_steps]
            kind = 1 if self.device.type == "cuda" else 0  # the profiler's device codes
            out.memory_timeline = memtimeline.downsample(memtimeline.timeline(events, spans[-1], self._known, device_type=kind))
            stacks = memtimeline.stacks_by_address(self._cuda_snapshot) if self._cuda_snapshot is not None else None
            out.memory_peak = memtimeline.live_at_peak(events, spans[-1], self._known, device_type=kind, stacks=stacks)
            out.timeline = attribution.timeline(
                events, requests, span=spans[-1], busy=busy, rank=self.rank, max_events=self.max_timeline_events, device=self.device.type
            )
        if doc:
            out.trace_file, out.trace_note = self._keep_trace(doc)
        elif unread is not None:
            out.trace_note = unread
        if self._raw_trace is not None:
            self._raw_trace.unlink(missing_ok=True)
        return out

    def _clock_offset(self, events: Sequence[attribution.TraceEvent]) -> float | None:
        """Wall-clock µs minus trace µs, from the anchors (median over the profiled steps); None without them."""
        marks = sorted(float(e["ts"]) for e in events if e.get("ph") == "X" and e.get("name") == CLOCK_ANCHOR)
        if not marks or len(marks) != len(self._anchors):
            return None
        return statistics.median(wall - mark for wall, mark in zip(self._anchors, marks, strict=True))

    def _last_step_span(self, events: Sequence[attribution.TraceEvent]) -> attribution.TraceEvent | None:
        """The span of the last profiled step."""
        return attribution.step_span(events, self.skip + self._profiled - 1)

    def _keep_trace(self, doc: dict[str, Any]) -> tuple[str | None, str | None]:
        """(file name, note): the Chrome trace gzipped; over the cap only the last step, else nothing."""
        path = self.run_dir.trace(self.rank)
        cap = self.trace_cap_bytes
        note = None
        if self._raw_trace is not None and self._raw_trace.exists():  # the profiler's file, gzipped as it streams
            tmp = path.with_name(f".{path.name}.tmp")
            with self._raw_trace.open("rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            if cap is None or tmp.stat().st_size <= cap:
                tmp.replace(path)
                return path.name, note
            tmp.unlink(missing_ok=True)
        data = gzip.compress(json.dumps(doc).encode(), compresslevel=6)
        if cap is not None and len(data) > cap:
            last = self._last_step_span(doc["traceEvents"])
            if last is not None:
                data = gzip.compress(json.dumps(attribution.from_span(doc, last)).encode(), compresslevel=6)
                note = f"trace over {cap} bytes; kept the last profiled step only"
            if len(data) > cap:
                return None, f"trace over the {cap}-byte cap even for one step; not kept"
        self.run_dir.write_atomic(path, data)
        return path.name, note
