"""Communication attribution: which collective or P2P op a strategy asked for, and how long it ran.

Pure on purpose — no torch — so every rule here is unit-tested on synthetic trace events
(tests/workers/test_attribution.py). The profiler driver (`workers.harness.measure`) feeds it what
the recorder's kernels on the c10d ops saw and what the profiler exported. Verified on torch 2.13, gloo:

- KIND and BYTES come from what the strategy asked for: every `c10d::*` op (the functional
  `_c10d_functional::*` ops reach the process group through one), with its arguments (`requests_of`), in nccl-tests' buffer convention —
  the buffer for all_reduce and broadcast, the gathered output for all_gather, the full input for
  reduce_scatter and all_to_all, the message for send/recv.
- TIME comes from the backend's events in the profile: `gloo:<op>` on CPU (worker threads for
  collectives; the main thread for send/recv, whose span runs until the message has arrived),
  NCCL kernels on CUDA. `c10d::<op>` events on the main thread time only the enqueue, and gloo
  runs a reduce-scatter as an all-reduce labelled `gloo:all_reduce`, so a request is matched, in
  issue order, to the earliest unused backend event whose label it may carry (`attribute`).
- The profiler's `record_param_comms` collective fields appear only with NCCL; they are not used.
- Pipeline P2P is told apart from other P2P (ring attention's) by an explicit tag: the pipeline
  strategy runs its schedule under `pipeline_comm()`, and requests made meanwhile carry it.

Where a step's time goes (`busy`, `comm_intervals`, `breakdown`) is HTA's comm/compute overlap: busy intervals (the
main thread's operators on CPU, compute kernels on CUDA) against communication intervals (the
backend events above, every collective and P2P op, a pipeline's send/recv included);
communication while busy is overlapped, the rest exposed, and what is neither is idle. On a
pipeline stage a receive waiting for the previous stage is exposed communication, as in HTA; the
bubble is measured apart, from the schedule's own actions (`actions`), which the pipeline strategy
marks with profiler ranges; it needs every stage's, so the merge computes it
(`parallab.core.metrics.pipeline_bubble`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import astuple, dataclass
from typing import Any

from parallab.core.metrics import bandwidths_gbps, wire_bytes
from parallab.core.result import CommOp, TimelineEvent
from parallab.core.stragglers import CollectiveArrival

TraceEvent = Mapping[str, Any]
"""One Chrome-trace event as the profiler exports it (JSON)."""

# op name (namespace::name, no overload) -> (kind, schema argument whose tensors are the buffer)
C10D_OPS: dict[str, tuple[str, str]] = {
    "c10d::allreduce_": ("all_reduce", "tensors"),
    "c10d::allreduce_coalesced_": ("all_reduce", "tensors"),
    "c10d::_allgather_base_": ("all_gather", "output_tensor"),
    "c10d::allgather_": ("all_gather", "output_tensors"),
    "c10d::allgather_coalesced_": ("all_gather", "output_lists"),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", "outputs"),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "input_tensor"),
    "c10d::reduce_scatter_": ("reduce_scatter", "input_tensors"),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs"),
    "c10d::alltoall_base_": ("all_to_all", "input"),
    "c10d::alltoall_": ("all_to_all", "input_tensors"),
    "c10d::broadcast_": ("broadcast", "tensors"),
    "c10d::send": ("send", "tensors"),
    "c10d::recv_": ("recv", "tensors"),
    "c10d::recv_any_source_": ("recv", "tensors"),
    "c10d::reduce_": ("reduce", "tensors"),
    "c10d::gather_": ("gather", "input_tensors"),
    "c10d::scatter_": ("scatter", "output_tensors"),
    "_c10d_functional::all_reduce": ("all_reduce", "input"),
    "_c10d_functional::all_reduce_": ("all_reduce", "input"),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", "inputs"),
    "_c10d_functional::all_reduce_coalesced_": ("all_reduce", "inputs"),
    # functional all-gathers name only the input: bytes = input × group_size (see requests_of)
    "_c10d_functional::all_gather_into_tensor": ("all_gather", "input"),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", "input"),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", "inputs"),
    "_c10d_functional_autograd::all_gather_into_tensor": ("all_gather", "input"),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_c10d_functional::reduce_scatter_tensor_out": ("reduce_scatter", "input"),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", "inputs"),
    "_c10d_functional_autograd::reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_c10d_functional::all_to_all_single": ("all_to_all", "input"),
    "_c10d_functional_autograd::all_to_all_single": ("all_to_all", "input"),
    "_c10d_functional::broadcast": ("broadcast", "input"),
    "_c10d_functional::broadcast_": ("broadcast", "input"),
    "_c10d_functional::isend": ("send", "tensor"),
    "_c10d_functional::irecv": ("recv", "tensor"),
}
BATCH_P2P = "_c10d_functional::batch_p2p_ops"
"""`batch_isend_irecv` as one op: `op_list` names each entry ("isend"/"irecv"), `tensors` its buffer."""

BACKEND_LABELS: dict[str, tuple[str, ...]] = {
    "reduce_scatter": ("reduce_scatter", "all_reduce"),
    "all_to_all": ("all_to_all", "p2p"),
    "send": ("send", "p2p"),
    "recv": ("recv", "p2p"),
}
"""Labels a request's backend event may carry besides its own kind. gloo runs reduce-scatter as
an all-reduce; NCCL runs all-to-all and P2P as grouped send/recv kernels ("p2p")."""
P2P = ("send", "recv")
NCCL_PREFIXES = ("nccldevkernel_", "ncclkernel_", "nccl")
"""What comes before the op in an NCCL kernel's name (lowered), newest naming first:
`ncclDevKernel_AllReduce_Sum_f32_RING_LL` (NCCL 2.19 on), `ncclKernel_AllReduce_RING_LL_Sum_float`
(2.7 to 2.18), `ncclAllReduceRingLLKernel_sum_f32` (before 2.7)."""
NCCL_ANY = "nccl"
"""The label of an NCCL kernel that can run any collective (`ncclDevKernel_Generic`, the kernel
NCCL launches when no kernel is specialised for the op): any request matches it, in issue order
(the kernels of a communicator run in the order their ops were issued)."""
NCCL_KERNELS = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("broadcast", "broadcast"),
    ("sendrecv", "p2p"),
    ("send", "p2p"),
    ("recv", "p2p"),
    ("reduce", "reduce"),
    ("generic", NCCL_ANY),
)
GLOO_LABELS = {"recvAnySource": "recv"}
"""gloo's event names that are not the request's kind: a receive from any source is a receive."""
COMM_EVENT_PREFIXES = ("c10d::", "_c10d_functional", "gloo:")
"""Main-thread events that are communication, never compute, on the timeline."""


# ---- the pipeline's tag ----

_PIPELINE: ContextVar[bool] = ContextVar("parallab_pipeline_comm", default=False)


@contextmanager
def pipeline_comm() -> Iterator[None]:
    """Mark the P2P requested inside as a pipeline's (its receive waits are the bubble)."""
    token = _PIPELINE.set(True)
    try:
        yield
    finally:
        _PIPELINE.reset(token)


def in_pipeline() -> bool:
    return _PIPELINE.get()


# ---- what the strategy asked for ----


@dataclass
class CommRequest:
    """One collective or P2P op as the strategy asked for it, and (once attributed) when it ran."""

    kind: str
    nbytes: int
    step: int
    pipeline: bool = False
    """A pipeline's P2P (requested under `pipeline_comm`)."""
    time_us: float = 0.0
    start_us: float | None = None
    group_size: int | None = None
    """Ranks in the process group the op ran on (None: not known, taken as the world)."""
    group: str | None = None
    """The group's global ranks, comma-separated (matches one collective across ranks); None: not known."""


def is_comm_op(name: str) -> bool:
    """Whether the op `name` (namespace::name) is communication the recorder counts."""
    return name in C10D_OPS or name == BATCH_P2P


def _buffer_bytes(value: object, nbytes: Callable[[object], int]) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_buffer_bytes(v, nbytes) for v in value)
    return nbytes(value)


def requests_of(name: str, args: Mapping[str, object], nbytes: Callable[[object], int]) -> list[tuple[str, int]]:
    """(kind, bytes) of each request one op call makes; `args` are its arguments by schema name,
    `nbytes` gives the local byte size of one tensor (lists and tuples are walked here)."""
    if name == BATCH_P2P:
        kinds = ["send" if str(op).startswith("isend") else "recv" for op in _as_list(args["op_list"])]
        return [(k, _buffer_bytes(t, nbytes)) for k, t in zip(kinds, _as_list(args["tensors"]), strict=True)]
    kind, arg = C10D_OPS[name]
    total = _buffer_bytes(args.get(arg, ()), nbytes)
    if name.startswith("_c10d_functional") and kind == "all_gather":
        group_size = args["group_size"]
        if not isinstance(group_size, int):
            raise TypeError(f"{name}: group_size is {type(group_size).__name__}, not int")
        total *= group_size
    return [(kind, total)]


def _as_list(value: object) -> list[object]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return list(value)


def record(
    name: str,
    args: Mapping[str, object],
    nbytes: Callable[[object], int],
    *,
    step: int,
    group_size: int | None = None,
    group: str | None = None,
) -> list[CommRequest]:
    """The requests of one op call, P2P tagged as the pipeline's when made under `pipeline_comm`;
    `group_size`: the size of the op's process group, when the caller could tell."""
    pipeline = in_pipeline()
    return [
        CommRequest(kind, size, step, pipeline and kind in P2P, group_size=group_size, group=group)
        for kind, size in requests_of(name, args, nbytes)
    ]


def group_size_arg(args: Mapping[str, object]) -> int | None:
    """The group size an op names itself (the functional all-gather's and reduce-scatter's `group_size`)."""
    value = args.get("group_size")
    return value if isinstance(value, int) else None


# ---- the backend's side: when each op really ran ----


@dataclass
class BackendEvent:
    label: str
    ts: float
    dur: float
    used: bool = False


def backend_label(name: str, cat: str) -> str | None:
    """The op a backend event ran ("all_reduce", "send", "p2p", ..., `NCCL_ANY` for a kernel that runs
    any); None for other events."""
    if name.startswith("gloo:"):
        return GLOO_LABELS.get(name[5:], name[5:])
    lowered = name.lower()
    if cat == "kernel" and lowered.startswith("nccl"):
        kernel = next(lowered[len(p) :] for p in NCCL_PREFIXES if lowered.startswith(p))
        for needle, label in NCCL_KERNELS:
            if kernel.startswith(needle):
                return label
    return None


def backend_events(trace_events: Sequence[TraceEvent]) -> list[BackendEvent]:
    """The backend's complete ("X") comm events, earliest first."""
    events = []
    for e in trace_events:
        if e.get("ph") != "X":
            continue
        label = backend_label(str(e.get("name", "")), str(e.get("cat", "")))
        if label is not None:
            events.append(BackendEvent(label, float(e["ts"]), float(e.get("dur", 0.0))))
    return sorted(events, key=lambda ev: ev.ts)


def attribute(requests: list[CommRequest], trace_events: Sequence[TraceEvent]) -> list[CommRequest]:
    """Give each request the duration of its backend event (issue order, earliest unused match)."""
    events = backend_events(trace_events)
    for req in requests:
        labels = (*BACKEND_LABELS.get(req.kind, (req.kind,)), NCCL_ANY)
        for ev in events:
            if not ev.used and ev.label in labels:
                ev.used = True
                req.time_us, req.start_us = ev.dur, ev.ts
                break
    return requests


def arrivals(requests: Sequence[CommRequest], offset_us: float) -> list[CollectiveArrival]:
    """Each collective's (not P2P's) group, sequence number in that group (issue order on this
    rank) and backend start and end on the wall clock (`offset_us`: wall minus trace µs).
    Requests the backend's events did not time keep their sequence number but are left out."""
    seq: dict[str, int] = {}
    out = []
    for req in requests:
        if req.group is None or req.kind in P2P:
            continue
        n = seq[req.group] = seq.get(req.group, -1) + 1
        if req.start_us is not None:
            start = req.start_us + offset_us
            out.append(CollectiveArrival(req.group, n, req.kind, start, start + req.time_us))
    return out


def summarize_comm(requests: list[CommRequest], steps: int, world_size: int) -> list[CommOp]:
    """Per-step CommOps by kind (count, bytes, time, algbw, busbw, group size, bytes on the wire),
    kinds in name order. Each request's wire bytes use its own group's size (the world when not
    known); an op's `group_size` is that size when all its calls share one, else None — and its
    busbw then uses the world's factor."""
    by_kind: dict[str, list[CommRequest]] = {}
    for req in requests:
        by_kind.setdefault(req.kind, []).append(req)
    out = []
    for kind in sorted(by_kind):
        reqs = by_kind[kind]
        nbytes = sum(r.nbytes for r in reqs) / steps
        wire = sum(wire_bytes(kind, r.nbytes, r.group_size or world_size) for r in reqs) / steps
        sizes = {r.group_size or world_size for r in reqs}
        group = sizes.pop() if len(sizes) == 1 else None
        seconds = sum(r.time_us for r in reqs) / 1e6 / steps
        algbw, busbw = bandwidths_gbps(kind, nbytes, seconds, group or world_size)
        out.append(
            CommOp(
                op=kind,
                count=round(len(reqs) / steps),
                bytes=round(nbytes),
                time_s=seconds,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                group_size=group,
                wire_bytes=round(wire),
            )
        )
    return out


# ---- intervals (µs, as the trace gives them) ----

Interval = tuple[float, float]
"""[start, end) in the trace's microseconds."""


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged: sorted, disjoint, empty ones dropped."""
    out: list[Interval] = []
    for start, end in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: Iterable[Interval]) -> float:
    """Total length covered (overlaps counted once)."""
    return sum(end - start for start, end in union(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """What both cover."""
    left, right = union(a), union(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(left) and j < len(right):
        start, end = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        if end > start:
            out.append((start, end))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """What `a` covers and `b` does not."""
    out: list[Interval] = []
    cuts = union(b)
    for start, end in union(a):
        cursor = start
        for cut_start, cut_end in cuts:
            if cut_end <= cursor or cut_start >= end:
                continue
            if cut_start > cursor:
                out.append((cursor, cut_start))
            cursor = max(cursor, cut_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """The intervals cut to [lo, hi)."""
    return union((max(start, lo), min(end, hi)) for start, end in intervals)


# ---- where a step's time goes (HTA's comm/compute overlap) ----

COMPUTE_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Device work in a CUDA trace; the NCCL kernels among them are communication, the rest compute."""


def _span(span: TraceEvent) -> Interval:
    return float(span["ts"]), float(span["ts"]) + float(span.get("dur", 0.0))


def _is_comm_name(name: str) -> bool:
    return name.startswith(COMM_EVENT_PREFIXES)


def cpu_busy(trace_events: Sequence[TraceEvent], span: TraceEvent) -> list[Interval]:
    """When the rank's main thread computed during the step `span` (CPU).

    Compute is the union of the main thread's operator events (`cpu_op`) that are not
    communication, minus the main-thread communication operators themselves (a `c10d::*` enqueue,
    a `_c10d_functional::wait_tensor`) when nested inside one. Annotations (`user_annotation`:
    the schedule's "Forward i", FSDP's phases) are not compute: they wrap waits as well. gloo's
    own `gloo:*` spans are not subtracted: they are the backend's view of the op (on worker
    threads, or for P2P an asynchronous span on the main thread that may run beside compute).
    Time on the main thread outside any operator (blocked in `Work.wait()`, Python between ops)
    is not compute.
    """
    t0, t1 = _span(span)
    main = span.get("tid")
    ops = [e for e in trace_events if e.get("ph") == "X" and e.get("tid") == main and e.get("cat") == "cpu_op" and e is not span]
    compute = [_span(e) for e in ops if not _is_comm_name(str(e.get("name", "")))]
    blocking = [_span(e) for e in ops if _is_comm_name(str(e.get("name", "")))]
    return clip(subtract(compute, blocking), t0, t1)


def gpu_busy(trace_events: Sequence[TraceEvent], span: TraceEvent) -> list[Interval]:
    """When the device computed during the step `span` (CUDA): every non-NCCL kernel, memcpy and
    memset, on any stream, merged (HTA counts a moment as compute when any compute kernel runs)."""
    t0, t1 = _span(span)
    return clip(
        (
            _span(e)
            for e in trace_events
            if e.get("ph") == "X"
            and e.get("cat") in COMPUTE_KERNEL_CATS
            and backend_label(str(e.get("name", "")), str(e.get("cat", ""))) is None
        ),
        t0,
        t1,
    )


def comm_intervals(requests: Sequence[CommRequest], span: TraceEvent) -> list[Interval]:
    """When communication ran during `span`: each attributed request's backend event (gloo's span
    on CPU, its NCCL kernel on CUDA), collectives and P2P alike, a pipeline's send/recv included
    (HTA counts every communication kernel, SendRecv among them). A stage's receive that waits for
    the previous stage is exposed communication here, as it is in HTA; how much of a stage's time
    is such waiting is the bubble, measured apart from the schedule's actions (`actions`)."""
    t0, t1 = _span(span)
    return clip(((r.start_us, r.start_us + r.time_us) for r in requests if r.start_us is not None), t0, t1)


@dataclass(frozen=True)
class Breakdown:
    """One step split as the result document's `StepBreakdown` (µs): compute + exposed + idle = step."""

    compute: float
    exposed_comm: float
    overlapped_comm: float
    idle: float
    step: float

    def __add__(self, other: Breakdown) -> Breakdown:
        return Breakdown(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def scaled(self, factor: float) -> Breakdown:
        return Breakdown(*(value * factor for value in astuple(self)))


def breakdown(busy: Sequence[Interval], comm: Sequence[Interval], span: TraceEvent) -> Breakdown:
    """Split the step `span`: compute = busy; overlapped = comm while busy; exposed = comm while not
    busy; idle = the rest (neither)."""
    t0, t1 = _span(span)
    busy_in, comm_in = clip(busy, t0, t1), clip(comm, t0, t1)
    overlapped = length(intersect(comm_in, busy_in))
    exposed = length(comm_in) - overlapped
    compute = length(busy_in)
    step = t1 - t0
    return Breakdown(compute=compute, exposed_comm=exposed, overlapped_comm=overlapped, idle=max(step - compute - exposed, 0.0), step=step)


def comm_time_fraction(split: Breakdown) -> float | None:
    """The rank's communication time over its step time: the union of its comm spans (exposed +
    overlapped, from the same clipped intervals, so calls overlapping each other count once and
    exposed ≤ total by construction; no cap needed — the union lies within the steps)."""
    if split.step <= 0:
        return None
    return (split.exposed_comm + split.overlapped_comm) / split.step


def within(trace_events: Sequence[TraceEvent], spans: Sequence[TraceEvent]) -> list[list[TraceEvent]]:
    """For each of `spans`, the complete events (`ph` X) that overlap it, in file order.

    `busy` and `actions` keep only what lies in their span (clipped, or starting there), so on a
    span's events they answer as on the whole trace; handing each step its own events makes one
    pass over the window's events instead of two per step (the trace holds every step's operators)."""
    bounds = [_span(s) for s in spans]
    out: list[list[TraceEvent]] = [[] for _ in spans]
    for e in trace_events:
        if e.get("ph") != "X":
            continue
        a, b = _span(e)
        for (t0, t1), kept in zip(bounds, out, strict=True):
            if a <= t1 and b >= t0:
                kept.append(e)
    return out


def busy(trace_events: Sequence[TraceEvent], span: TraceEvent, *, device: str) -> list[Interval]:
    """What counts as compute in the step `span`: the main thread's operators on CPU, kernels on CUDA."""
    return gpu_busy(trace_events, span) if device == "cuda" else cpu_busy(trace_events, span)


# ---- the pipeline's schedule actions ----

ACTION_PREFIX = "parallab.pp::"
"""The pipeline strategy wraps each stage action (a micro-batch's forward, backward — under the
zero-bubble schedules its input half — its weight half, or the last stage's loss) in a profiler
range named `parallab.pp::<kind> <micro-batch>`."""
ACTION_KINDS = ("forward", "backward", "weight", "loss")


def action_name(kind: str, microbatch: int | None = None) -> str:
    """The range name of one action (`microbatch` None: not known at the hook, e.g. the loss)."""
    if kind not in ACTION_KINDS:
        raise ValueError(f"unknown pipeline action {kind!r}; known: {', '.join(ACTION_KINDS)}")
    return f"{ACTION_PREFIX}{kind}" + ("" if microbatch is None else f" {microbatch}")


@dataclass(frozen=True)
class Action:
    kind: str
    microbatch: int | None
    start: float
    end: float


def actions(trace_events: Sequence[TraceEvent], span: TraceEvent, *, device: str = "cpu") -> list[Action]:
    """The stage's actions that start within the step `span`, earliest first. On CPU, the ranges
    as the main thread ran them (`user_annotation`); on CUDA, the device time of the kernels each
    range launched (Kineto's `gpu_user_annotation` copy of the range), since launches are async."""
    t0, t1 = _span(span)
    cat = "gpu_user_annotation" if device == "cuda" else "user_annotation"
    out = []
    for e in trace_events:
        name = str(e.get("name", ""))
        if e.get("ph") != "X" or e.get("cat") != cat or not name.startswith(ACTION_PREFIX):
            continue
        start, end = _span(e)
        if t0 <= start <= t1:
            kind, _, mb = name[len(ACTION_PREFIX) :].partition(" ")
            out.append(Action(kind, int(mb) if mb else None, start, end))
    return sorted(out, key=lambda a: a.start)


# ---- the timeline, from the profile ----


def step_span(trace_events: Sequence[TraceEvent], index: int) -> TraceEvent | None:
    """The `ProfilerStep#index` span, or the latest step span when there is no such one."""
    spans = sorted(
        (e for e in trace_events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: float(e["ts"])
    )
    wanted = f"ProfilerStep#{index}"
    return next((e for e in spans if e["name"] == wanted), spans[-1] if spans else None)


def timeline(
    trace_events: Sequence[TraceEvent],
    requests: list[CommRequest],
    *,
    span: TraceEvent,
    busy: Sequence[Interval],
    rank: int,
    max_events: int,
    device: str = "cpu",
) -> list[TimelineEvent]:
    """Events of one step `span`: comm ops (by requested kind), a pipeline stage's actions
    ("forward", "backward", "weight", "loss"), and the `busy` intervals (`cpu_busy`/`gpu_busy`: what the
    step-time split counts as compute) as "compute"; at most `max_events` — communication
    first, then the actions, then the earliest compute. Times are relative to the step's start."""
    t0, t1 = _span(span)
    comm = [
        TimelineEvent(rank=rank, op=req.kind, start_us=req.start_us - t0, dur_us=req.time_us, bytes=req.nbytes)
        for req in requests
        if req.start_us is not None and t0 <= req.start_us <= t1
    ]
    stage = [
        TimelineEvent(rank=rank, op=a.kind, start_us=a.start - t0, dur_us=a.end - a.start)
        for a in actions(trace_events, span, device=device)
    ]
    compute = [TimelineEvent(rank=rank, op="compute", start_us=start - t0, dur_us=end - start) for start, end in clip(busy, t0, t1)]
    kept = (comm + stage)[:max_events] + compute[: max(max_events - len(comm) - len(stage), 0)]
    return sorted(kept, key=lambda e: e.start_us)


def from_span(doc: Mapping[str, Any], span: TraceEvent) -> dict[str, Any]:
    """The Chrome trace `doc` cut to what starts at `span` or later (metadata events kept)."""
    t0 = float(span["ts"])
    return dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("ph") == "M" or float(e.get("ts", 0.0)) >= t0])
