"""Per-rank measurement that every strategy shares: model-state bytes, peak RSS, step profiling.

Runs inside the ranks (imports torch); writes nothing to the database — the rank's record is a
JSON file the worker merges.

How communication is attributed (verified on torch 2.13, gloo):

- KIND and BYTES come from what the strategy asked for. While the profiled steps run, a
  `TorchDispatchMode` sees every top-level `c10d::*` / `_c10d_functional::*` op — DDP's reducer
  (C++, autograd thread), FSDP2's all-gather / reduce-scatter, DTensor redistributions (TP),
  `batch_isend_irecv` (pipelining, ring) and `all_to_all_single` (MoE) included — with its
  tensors. Ops a collective issues internally (a functional all_reduce calls `c10d::allreduce_`)
  run while the mode is popped, so each request is counted once.
- TIME comes from the backend's events in the profile: `gloo:<op>` on CPU (worker threads for
  collectives; the main thread for send/recv, whose span runs until the message has arrived),
  NCCL kernels on CUDA. `c10d::<op>` events on the main thread time only the enqueue, and gloo
  runs a reduce-scatter as an all-reduce labelled `gloo:all_reduce`, so a request is matched, in
  issue order, to the earliest unused backend event whose label it may carry.
- The profiler's `record_param_comms` collective fields appear only with NCCL; they are not used.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from backend.services.metrics import bandwidths_gbps


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes this rank actually holds for `t` (a DTensor's local shard, not the global size)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Exact params / grads / optimizer-state bytes held by this rank, from its own local tensors."""
    params = list({id(p): p for p in model.parameters()}.values())
    param_bytes = sum(local_nbytes(p) for p in params)
    grad_bytes = sum(local_nbytes(p.grad) for p in params if p.grad is not None)
    opt_bytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    opt_bytes += local_nbytes(value)
    return {"params": param_bytes, "grads": grad_bytes, "optimizer": opt_bytes}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ---- what the strategy asked for: op kind and bytes (nccl-tests' buffer convention) ----

# op name (namespace stripped of overload) -> (kind, schema argument whose tensors are the buffer)
_C10D_OPS: dict[str, tuple[str, str]] = {
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
    # functional all-gathers name only the input: bytes = input × group_size (see _request_bytes)
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

# Labels a request's backend event may carry. gloo runs reduce-scatter as an all-reduce;
# NCCL runs all-to-all and P2P as grouped send/recv kernels ("p2p").
_BACKEND_LABELS: dict[str, tuple[str, ...]] = {
    "reduce_scatter": ("reduce_scatter", "all_reduce"),
    "all_to_all": ("all_to_all", "p2p"),
    "send": ("send", "p2p"),
    "recv": ("recv", "p2p"),
}
_P2P = ("send", "recv")
_NCCL_KERNELS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("broadcast", "broadcast"), ("sendrecv", "p2p"), ("send", "p2p"), ("recv", "p2p"), ("reduce", "reduce"),
)
_PIPELINE_MODULES = ("torch.distributed.pipelining", "workers.strategies.pp", "workers.strategies.pipeline")


@dataclass
class CommRequest:
    """One collective or P2P op as the strategy asked for it."""

    kind: str
    nbytes: int
    step: int
    pipeline: bool = False
    time_us: float = 0.0
    start_us: float | None = None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _request_bytes(name: str, func: Any, args: tuple, kwargs: dict) -> list[tuple[str, int]]:
    """(kind, bytes) of the requests in one op call; [] for ops that are not communication."""
    named = dict(zip((a.name for a in func._schema.arguments), args))
    named.update(kwargs)
    if name == "_c10d_functional::batch_p2p_ops":
        kinds = ["send" if op.startswith("isend") else "recv" for op in named["op_list"]]
        return [(k, local_nbytes(t)) for k, t in zip(kinds, named["tensors"])]
    kind, arg = _C10D_OPS[name]
    nbytes = sum(local_nbytes(t) for t in _tensors(named.get(arg)))
    if name.startswith("_c10d_functional") and kind == "all_gather":
        nbytes *= int(named["group_size"])
    return [(kind, nbytes)]


def _called_from_pipeline() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_PIPELINE_MODULES):
            return True
        frame = frame.f_back
    return False


class _CommRecorder(TorchDispatchMode):
    """Sees every top-level c10d op while active and records what it asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[CommRequest] = []
        self.step = 0
        self._is_comm: dict[Any, bool] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Every aten op of the profiled steps comes through here: keep the common path short.
        comm = self._is_comm.get(func)
        if comm is None:
            name = func._schema.name
            comm = self._is_comm[func] = name in _C10D_OPS or name == "_c10d_functional::batch_p2p_ops"
        if comm:
            pipeline = False
            for kind, nbytes in _request_bytes(func._schema.name, func, args, kwargs or {}):
                if kind in _P2P and not pipeline:
                    pipeline = _called_from_pipeline()
                self.requests.append(CommRequest(kind, nbytes, self.step, pipeline))
        return func(*args, **(kwargs or {}))


# ---- the backend's side: when each op really ran ----


@dataclass
class _BackendEvent:
    label: str
    ts: float
    dur: float
    used: bool = field(default=False)


def _backend_label(name: str, cat: str) -> str | None:
    if name.startswith("gloo:"):
        return name[5:]
    lowered = name.lower()
    if cat == "kernel" and lowered.startswith("nccl"):
        kernel = lowered.split("_", 1)[1] if "_" in lowered else lowered
        for needle, label in _NCCL_KERNELS:
            if kernel.startswith(needle):
                return label
    return None


def attribute(requests: list[CommRequest], trace_events: list[dict[str, Any]]) -> list[CommRequest]:
    """Give each request the duration of its backend event (issue order, earliest unused match)."""
    events = sorted(
        (
            _BackendEvent(label, float(e["ts"]), float(e.get("dur", 0.0)))
            for e in trace_events
            if e.get("ph") == "X" and (label := _backend_label(e.get("name", ""), e.get("cat", ""))) is not None
        ),
        key=lambda e: e.ts,
    )
    for req in requests:
        labels = _BACKEND_LABELS.get(req.kind, (req.kind,))
        for ev in events:
            if not ev.used and ev.label in labels:
                ev.used = True
                req.time_us, req.start_us = ev.dur, ev.ts
                break
    return requests


def summarize_comm(requests: list[CommRequest], steps: int, world_size: int) -> list[dict[str, Any]]:
    """Per-step CommOp dicts (op, count, bytes, time_s, algbw_gbps, busbw_gbps), by kind."""
    by_kind: dict[str, list[CommRequest]] = {}
    for req in requests:
        by_kind.setdefault(req.kind, []).append(req)
    out = []
    for kind in sorted(by_kind):
        reqs = by_kind[kind]
        nbytes = sum(r.nbytes for r in reqs) / steps
        seconds = sum(r.time_us for r in reqs) / 1e6 / steps
        algbw, busbw = bandwidths_gbps(kind, nbytes, seconds, world_size)
        out.append({
            "op": kind, "count": round(len(reqs) / steps), "bytes": int(round(nbytes)), "time_s": seconds,
            "algbw_gbps": algbw, "busbw_gbps": busbw,
        })
    return out


def peak_total_allocated(trace_events: list[dict[str, Any]]) -> int | None:
    """Max "Total Allocated" over the profile's `[memory]` events (CPU ones when on CPU)."""
    totals = [
        int(e["args"]["Total Allocated"])
        for e in trace_events
        if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}) and e["args"].get("Device Type", 0) == 0
    ]
    return max(totals) if totals else None


class StepProfiler:
    """Profiles a bounded window of measured steps on one rank.

    Use as a context manager around the measured steps and call :meth:`step` after each one.
    The first `skip` measured steps run under the profiler as its warm-up (recorded, discarded);
    the next `window` steps are profiled, with the comm recorder active. :meth:`results` returns
    ``comm`` (per-step CommOp dicts), ``comm_time_fraction``, ``bubble_fraction`` (pipelines),
    ``peak_allocated_bytes`` (+ ``peak_reserved_bytes`` on CUDA), ``profiled_steps``, and when
    tracing ``timeline`` (the last profiled step's events) and ``trace_file``.

    ``comm_time_fraction`` is the window's backend comm time over its wall time, both taken under
    the profiler (whose per-op cost slows microsecond-scale compute, so on tiny CPU models the
    fraction reads low; see BENCHMARKS.md). The CUDA path (NCCL kernel names, allocator peaks)
    follows the same attribution but has not been run on a GPU yet.

    On CPU, ``peak_allocated_bytes`` is the profiler's "Total Allocated", which counts only what
    was allocated while the profiler ran (the warm-up step and the window): activations, grads
    and transient buffers — not tensors that existed before, such as the parameters.
    """

    def __init__(
        self, *, enabled: bool, trace: bool, rank: int, world_size: int, out_dir: Path, device: torch.device,
        window: int = 3, skip: int = 1, trace_cap_bytes: int = 32 * 1024 * 1024, max_timeline_events: int = 5000,
    ):
        self.enabled = enabled
        self.trace = trace
        self.rank = rank
        self.world_size = world_size
        self.out_dir = Path(out_dir)
        self.device = torch.device(device)
        self.window = window
        self.skip = skip
        self.trace_cap_bytes = trace_cap_bytes
        self.max_timeline_events = max_timeline_events
        self.steps_seen = 0
        self._prof: torch.profiler.profile | None = None
        self._recorder = _CommRecorder()
        self._recording = False
        self._window_start = 0.0
        self._window_seconds = 0.0
        self._profiled = 0
        self._raw_trace: Path | None = None
        self._results: dict[str, Any] | None = None

    # -- lifecycle --

    def __enter__(self) -> "StepProfiler":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.enabled and self.window > 0:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(wait=0, warmup=self.skip, active=self.window, repeat=1),
                on_trace_ready=self._save_raw,
                profile_memory=True,
            )
            self._prof.start()
            if self.skip == 0:
                self._start_recording()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_recording()
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
        return None

    def step(self) -> None:
        self.steps_seen += 1
        if self._recording:
            self._profiled += 1
            self._recorder.step += 1
            if self._profiled >= self.window:
                self._stop_recording()
        if self._prof is not None:
            self._prof.step()
        if self.steps_seen == self.skip and self._prof is not None:
            self._start_recording()

    def _start_recording(self) -> None:
        self._recorder.__enter__()
        self._recording = True
        self._window_start = time.perf_counter()

    def _stop_recording(self) -> None:
        if self._recording:
            self._window_seconds = time.perf_counter() - self._window_start
            self._recorder.__exit__(None, None, None)
            self._recording = False

    def _save_raw(self, prof: torch.profiler.profile) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._raw_trace = self.out_dir / f".trace_rank{self.rank}.raw.json"
        prof.export_chrome_trace(str(self._raw_trace))

    # -- results --

    def results(self) -> dict[str, Any]:
        if self._results is None:
            self._results = self._compute()
        return self._results

    def _compute(self) -> dict[str, Any]:
        out: dict[str, Any] = {"comm": [], "comm_time_fraction": None, "bubble_fraction": None, "timeline": [],
                               "peak_allocated_bytes": None, "peak_reserved_bytes": None, "profiled_steps": self._profiled}
        events: list[dict[str, Any]] = []
        doc: dict[str, Any] = {}
        if self._raw_trace is not None and self._raw_trace.exists():
            doc = json.loads(self._raw_trace.read_text())
            events = doc.get("traceEvents", [])
        steps = self._profiled
        if steps and events:
            requests = attribute(self._recorder.requests, events)
            out["comm"] = summarize_comm(requests, steps, self.world_size)
            step_s = self._window_seconds / steps
            comm_s = sum(op["time_s"] for op in out["comm"])
            out["comm_time_fraction"] = min(comm_s / step_s, 1.0) if step_s > 0 else None
            if any(r.pipeline for r in requests):
                # idle per stage ≈ time spent waiting for P2P receives (a gloo recv's span ends when
                # the message has arrived, so it holds the wait for the upstream / downstream stage)
                recv_s = sum(r.time_us for r in requests if r.kind == "recv") / 1e6 / steps
                out["bubble_fraction"] = min(recv_s / step_s, 1.0) if step_s > 0 else None
            if self.trace:
                out["timeline"] = self._timeline(events, requests)
        if self.device.type == "cuda":
            out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
        else:
            out["peak_allocated_bytes"] = peak_total_allocated(events)
        if self.trace and doc:
            out.update(self._keep_trace(doc))
        if self._raw_trace is not None:
            self._raw_trace.unlink(missing_ok=True)
        return out

    def _last_step_span(self, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The `ProfilerStep#k` span of the last profiled measured step (the warm-up step is #0 …
        #skip-1; a span opened by the final `step()` and closed at exit holds no step)."""
        spans = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                       key=lambda e: e["ts"])
        wanted = f"ProfilerStep#{self.skip + self._profiled - 1}"
        return next((e for e in spans if e["name"] == wanted), spans[-1] if spans else None)

    def _timeline(self, events: list[dict[str, Any]], requests: list[CommRequest]) -> list[dict[str, Any]]:
        """Events of the last profiled step: comm ops (by requested kind) and top-level main-thread
        ops as "compute", at most `max_timeline_events` (communication first)."""
        last = self._last_step_span(events)
        if last is None:
            return []
        t0, t1, main_tid = float(last["ts"]), float(last["ts"]) + float(last["dur"]), last.get("tid")
        comm: list[dict[str, Any]] = []
        for req in requests:
            if req.start_us is not None and t0 <= req.start_us <= t1:
                comm.append({"rank": self.rank, "op": req.kind, "start_us": req.start_us - t0,
                             "dur_us": req.time_us, "bytes": req.nbytes})
        compute: list[dict[str, Any]] = []
        # top-level main-thread ops (children of the ProfilerStep span) as compute
        end_of_last = t0
        for e in sorted((e for e in events if e.get("ph") == "X" and e.get("tid") == main_tid
                         and e.get("cat") in ("cpu_op", "user_annotation") and e is not last), key=lambda e: e["ts"]):
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            if ts < end_of_last or ts > t1 or str(e.get("name", "")).startswith(("c10d::", "_c10d_functional", "gloo:")):
                continue
            end_of_last = ts + dur
            compute.append({"rank": self.rank, "op": "compute", "start_us": ts - t0, "dur_us": dur, "bytes": None})
        # over the cap, communication is kept first, then the earliest compute
        cap = self.max_timeline_events
        timeline = comm[:cap] + compute[: max(cap - len(comm), 0)]
        return sorted(timeline, key=lambda e: e["start_us"])

    def _keep_trace(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Write the Chrome trace gzipped; if over the cap keep only the last step, else skip it."""
        path = self.out_dir / f"trace_rank{self.rank}.json.gz"
        data = gzip.compress(json.dumps(doc).encode(), compresslevel=6)
        note = None
        if len(data) > self.trace_cap_bytes:
            last = self._last_step_span(doc["traceEvents"])
            if last is not None:
                t0 = float(last["ts"])
                small = dict(doc, traceEvents=[e for e in doc["traceEvents"]
                                               if e.get("ph") == "M" or float(e.get("ts", 0.0)) >= t0])
                data = gzip.compress(json.dumps(small).encode(), compresslevel=6)
                note = f"trace over {self.trace_cap_bytes} bytes; kept the last profiled step only"
            if len(data) > self.trace_cap_bytes:
                return {"trace_file": None, "trace_note": f"trace over the {self.trace_cap_bytes}-byte cap even for one step; not kept"}
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return {"trace_file": path.name, "trace_note": note}
