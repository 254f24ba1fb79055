"""Communication attribution: which collective or P2P op a strategy asked for, and how long it ran.

Pure on purpose — no torch — so every rule here is unit-tested on synthetic trace events
(tests/workers/test_attribution.py). The profiler driver (`workers.harness.measure`) feeds it what
a `TorchDispatchMode` saw and what the profiler exported. Verified on torch 2.13, gloo:

- KIND and BYTES come from what the strategy asked for: every top-level `c10d::*` /
  `_c10d_functional::*` op, with its arguments (`requests_of`), in nccl-tests' buffer convention —
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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from parallab.core.metrics import bandwidths_gbps
from parallab.core.result import CommOp, TimelineEvent

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
NCCL_KERNELS = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("broadcast", "broadcast"),
    ("sendrecv", "p2p"),
    ("send", "p2p"),
    ("recv", "p2p"),
    ("reduce", "reduce"),
)
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


def record(name: str, args: Mapping[str, object], nbytes: Callable[[object], int], *, step: int) -> list[CommRequest]:
    """The requests of one op call, P2P tagged as the pipeline's when made under `pipeline_comm`."""
    pipeline = in_pipeline()
    return [CommRequest(kind, size, step, pipeline and kind in P2P) for kind, size in requests_of(name, args, nbytes)]


# ---- the backend's side: when each op really ran ----


@dataclass
class BackendEvent:
    label: str
    ts: float
    dur: float
    used: bool = False


def backend_label(name: str, cat: str) -> str | None:
    """The op a backend event ran ("all_reduce", "send", "p2p", ...); None for other events."""
    if name.startswith("gloo:"):
        return name[5:]
    lowered = name.lower()
    if cat == "kernel" and lowered.startswith("nccl"):
        kernel = lowered.split("_", 1)[1] if "_" in lowered else lowered
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
        labels = BACKEND_LABELS.get(req.kind, (req.kind,))
        for ev in events:
            if not ev.used and ev.label in labels:
                ev.used = True
                req.time_us, req.start_us = ev.dur, ev.ts
                break
    return requests


def summarize_comm(requests: list[CommRequest], steps: int, world_size: int) -> list[CommOp]:
    """Per-step CommOps by kind (count, bytes, time, algbw, busbw), kinds in name order."""
    by_kind: dict[str, list[CommRequest]] = {}
    for req in requests:
        by_kind.setdefault(req.kind, []).append(req)
    out = []
    for kind in sorted(by_kind):
        reqs = by_kind[kind]
        nbytes = sum(r.nbytes for r in reqs) / steps
        seconds = sum(r.time_us for r in reqs) / 1e6 / steps
        algbw, busbw = bandwidths_gbps(kind, nbytes, seconds, world_size)
        out.append(CommOp(op=kind, count=round(len(reqs) / steps), bytes=round(nbytes), time_s=seconds, algbw_gbps=algbw, busbw_gbps=busbw))
    return out


def window_fractions(comm: list[CommOp], requests: list[CommRequest], *, steps: int, window_s: float) -> tuple[float | None, float | None]:
    """(comm_time_fraction, bubble_fraction) of the profiled window of `steps` steps.

    The bubble is reported only when the pipeline communicated: idle per stage ≈ time spent
    waiting for P2P receives (a gloo recv's span ends when the message has arrived, so it holds
    the wait for the upstream / downstream stage).
    """
    step_s = window_s / steps if steps else 0.0
    if step_s <= 0:
        return None, None
    comm_fraction = min(sum(op.time_s for op in comm) / step_s, 1.0)
    if not any(r.pipeline for r in requests):
        return comm_fraction, None
    recv_s = sum(r.time_us for r in requests if r.kind == "recv") / 1e6 / steps
    return comm_fraction, min(recv_s / step_s, 1.0)


# ---- memory and the timeline, from the profile ----


def peak_total_allocated(trace_events: Sequence[TraceEvent]) -> int | None:
    """Max "Total Allocated" over the profile's CPU `[memory]` events."""
    totals = [
        int(e["args"]["Total Allocated"])
        for e in trace_events
        if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}) and e["args"].get("Device Type", 0) == 0
    ]
    return max(totals) if totals else None


def step_span(trace_events: Sequence[TraceEvent], index: int) -> TraceEvent | None:
    """The `ProfilerStep#index` span, or the latest step span when there is no such one."""
    spans = sorted(
        (e for e in trace_events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: float(e["ts"])
    )
    wanted = f"ProfilerStep#{index}"
    return next((e for e in spans if e["name"] == wanted), spans[-1] if spans else None)


def timeline(
    trace_events: Sequence[TraceEvent], requests: list[CommRequest], *, span: TraceEvent, rank: int, max_events: int
) -> list[TimelineEvent]:
    """Events of one step `span`: comm ops (by requested kind) and the top-level main-thread ops
    as "compute", at most `max_events` (communication first, then the earliest compute)."""
    t0 = float(span["ts"])
    t1, main_tid = t0 + float(span["dur"]), span.get("tid")
    comm = [
        TimelineEvent(rank=rank, op=req.kind, start_us=req.start_us - t0, dur_us=req.time_us, bytes=req.nbytes)
        for req in requests
        if req.start_us is not None and t0 <= req.start_us <= t1
    ]
    compute: list[TimelineEvent] = []
    end_of_last = t0  # top-level only: skip what starts inside the previous kept op
    candidates = (
        e
        for e in trace_events
        if e.get("ph") == "X" and e.get("tid") == main_tid and e.get("cat") in ("cpu_op", "user_annotation") and e is not span
    )
    for e in sorted(candidates, key=lambda e: float(e["ts"])):
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        if ts < end_of_last or ts > t1 or str(e.get("name", "")).startswith(COMM_EVENT_PREFIXES):
            continue
        end_of_last = ts + dur
        compute.append(TimelineEvent(rank=rank, op="compute", start_us=ts - t0, dur_us=dur, bytes=None))
    kept = comm[:max_events] + compute[: max(max_events - len(comm), 0)]
    return sorted(kept, key=lambda e: e.start_us)


def from_span(doc: Mapping[str, Any], span: TraceEvent) -> dict[str, Any]:
    """The Chrome trace `doc` cut to what starts at `span` or later (metadata events kept)."""
    t0 = float(span["ts"])
    return dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("ph") == "M" or float(e.get("ts", 0.0)) >= t0])
