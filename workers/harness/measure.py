"""Per-rank measurement that every strategy shares: model-state bytes, peak RSS, step profiling.

Runs inside the ranks (imports torch); writes files in the run directory only — the rank's record
is a JSON file the worker merges. This module drives `torch.profiler` and a `TorchDispatchMode`;
what their output means (op kinds, bytes, which backend event timed which request, the timeline)
is decided in `workers.harness.attribution`, which needs no torch and is tested on its own.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from parallab.core.result import CommOp, ModelStateBytes, TimelineEvent
from parallab.core.rundir import RunDir
from workers.harness import attribution
from workers.harness.attribution import CommRequest


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


class _CommRecorder(TorchDispatchMode):
    """Sees every top-level c10d op while active and records what it asked for.

    Ops a collective issues internally (a functional all_reduce calls `c10d::allreduce_`) run
    while the mode is popped, so each request is counted once. DDP's reducer (autograd thread),
    FSDP2, DTensor redistributions, `batch_isend_irecv` and `all_to_all_single` all come through.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[CommRequest] = []
        self.step = 0
        self._is_comm: dict[torch._ops.OpOverload, bool] = {}

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Sequence[type], args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None
    ) -> object:
        kwargs = kwargs or {}
        # Every aten op of the profiled steps comes through here: keep the common path short.
        comm = self._is_comm.get(func)
        if comm is None:
            comm = self._is_comm[func] = attribution.is_comm_op(func._schema.name)
        if comm:
            named: dict[str, object] = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
            named.update(kwargs)
            self.requests += attribution.record(func._schema.name, named, local_nbytes, step=self.step)
        return func(*args, **kwargs)


@dataclass
class ProfileResult:
    """What the profiled window measured, under the names the rank record (`RankRecord`) gives them."""

    comm: list[CommOp] = field(default_factory=list)
    comm_time_fraction: float | None = None
    bubble_fraction: float | None = None
    timeline: list[TimelineEvent] = field(default_factory=list)
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    profiled_steps: int = 0
    trace_file: str | None = None
    trace_note: str | None = None

    def record_fields(self) -> dict[str, Any]:
        """The fields as keyword arguments of `RankRecord`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class StepProfiler:
    """Profiles a bounded window of measured steps on one rank.

    Use as a context manager around the measured steps and call :meth:`step` after each one.
    The first `skip` measured steps run under the profiler as its warm-up (recorded, discarded);
    the next `window` steps are profiled, with the comm recorder active. :meth:`results` returns
    the `ProfileResult`: per-step comm ops, ``comm_time_fraction``, ``bubble_fraction``
    (pipelines), ``peak_allocated_bytes`` (+ ``peak_reserved_bytes`` on CUDA), ``profiled_steps``,
    and when tracing ``timeline`` (the last profiled step's events) and ``trace_file``.

    ``comm_time_fraction`` is the window's backend comm time over its wall time, both taken under
    the profiler (whose per-op cost slows microsecond-scale compute, so on tiny CPU models the
    fraction reads low; see BENCHMARKS.md). The CUDA path (NCCL kernel names, allocator peaks)
    follows the same attribution but has not been run on a GPU yet.

    On CPU, ``peak_allocated_bytes`` is the profiler's "Total Allocated", which counts only what
    was allocated while the profiler ran (the warm-up step and the window): activations, grads
    and transient buffers — not tensors that existed before, such as the parameters.

    `trace_cap_bytes` bounds the stored (gzipped) Chrome trace — the worker's
    `Settings.max_trace_bytes`, passed by the launcher; None: no cap.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        trace: bool,
        rank: int,
        world_size: int,
        out_dir: Path,
        device: torch.device,
        window: int = 3,
        skip: int = 1,
        trace_cap_bytes: int | None = None,
        max_timeline_events: int = 5000,
    ):
        self.enabled = enabled
        self.trace = trace
        self.rank = rank
        self.world_size = world_size
        self.run_dir = RunDir(Path(out_dir))
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
        self._results: ProfileResult | None = None

    # -- lifecycle --

    def __enter__(self) -> StepProfiler:
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
        self.run_dir.create()
        self._raw_trace = self.run_dir.raw_trace(self.rank)
        prof.export_chrome_trace(str(self._raw_trace))

    # -- results --

    def results(self) -> ProfileResult:
        if self._results is None:
            self._results = self._compute()
        return self._results

    def _compute(self) -> ProfileResult:
        out = ProfileResult(profiled_steps=self._profiled)
        doc: dict[str, Any] = {}
        if self._raw_trace is not None and self._raw_trace.exists():
            doc = json.loads(self._raw_trace.read_text())
        events: list[dict[str, Any]] = doc.get("traceEvents", [])
        steps = self._profiled
        if steps and events:
            requests = attribution.attribute(self._recorder.requests, events)
            out.comm = attribution.summarize_comm(requests, steps, self.world_size)
            out.comm_time_fraction, out.bubble_fraction = attribution.window_fractions(
                out.comm, requests, steps=steps, window_s=self._window_seconds
            )
            span = self._last_step_span(events)
            if self.trace and span is not None:
                out.timeline = attribution.timeline(events, requests, span=span, rank=self.rank, max_events=self.max_timeline_events)
        if self.device.type == "cuda":
            out.peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
            out.peak_reserved_bytes = torch.cuda.max_memory_reserved(self.device)
        else:
            out.peak_allocated_bytes = attribution.peak_total_allocated(events)
        if self.trace and doc:
            out.trace_file, out.trace_note = self._keep_trace(doc)
        if self._raw_trace is not None:
            self._raw_trace.unlink(missing_ok=True)
        return out

    def _last_step_span(self, events: Sequence[attribution.TraceEvent]) -> attribution.TraceEvent | None:
        """The span of the last profiled measured step (the warm-up steps are #0 … #skip-1; a span
        opened by the final `step()` and closed at exit holds no step)."""
        return attribution.step_span(events, self.skip + self._profiled - 1)

    def _keep_trace(self, doc: dict[str, Any]) -> tuple[str | None, str | None]:
        """(file name, note): the Chrome trace gzipped; over the cap only the last step, else nothing."""
        path = self.run_dir.trace(self.rank)
        cap = self.trace_cap_bytes
        data = gzip.compress(json.dumps(doc).encode(), compresslevel=6)
        note = None
        if cap is not None and len(data) > cap:
            last = self._last_step_span(doc["traceEvents"])
            if last is not None:
                data = gzip.compress(json.dumps(attribution.from_span(doc, last)).encode(), compresslevel=6)
                note = f"trace over {cap} bytes; kept the last profiled step only"
            if len(data) > cap:
                return None, f"trace over the {cap}-byte cap even for one step; not kept"
        self.run_dir.write_atomic(path, data)
        return path.name, note
