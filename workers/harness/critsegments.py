"""A rank's profiled steps as segments for the critical path (`parallab.core.critpath.StepSegments`).

Pure (no torch), from what the profiler exported and what the comm recorder saw:
- compute: on CPU the main thread's operators, each instant given to the innermost operator then
  running (its exclusive time), classed by its name (`op_class`; inside the optimizer's
  `Optimizer.step#…` range: optimizer); on CUDA each compute kernel, classed by its name. The
  main thread's communication operators are not compute (as in `attribution.cpu_busy`), and
  neither is a wrapper's own time (an operator that is not an `aten::` kernel: the autograd
  engine's nodes, a hook such as FSDP's post-backward, a dispatch mode) while one of the rank's
  collectives is in flight: on CPU that is the main thread blocked on the collective (FSDP's
  all-gather wait, its reduce-scatter's), not work.
- collectives: each timed request with its group and its sequence number in that group (issue
  order on this rank, as `attribution.arrivals` numbers them).
- point-to-point: each timed send or receive keyed by its ordered pair of global ranks and its
  place among that pair's messages (`p2p:src->dst`), when the recorder knew the peer.
Times are put on the wall clock with the rank's offset (wall minus trace µs).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from parallab.core.critpath import COLL, COMPUTE, RECV, SEND, StepSegments, op_class
from workers.harness.attribution import COMPUTE_KERNEL_CATS, P2P, CommRequest, TraceEvent, _is_comm_name, backend_label

OPTIMIZER_RANGE = "Optimizer.step#"
HARNESS_RANGE = "parallab.harness"
"""A profiler range around the harness's own work inside a profiled step (the memory timeline's
census of storages before and after the last one): cut from the step's segments, since no
training step spends it."""


def _iv(e: TraceEvent) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `intervals`, as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def without_waits(pieces: Sequence[tuple[str, float, float]], inflight: Sequence[tuple[float, float]]) -> list[tuple[str, float, float]]:
    """`pieces` (start order) with a wrapper's time (not an `aten::` kernel) cut where a collective
    is in flight (`inflight`: sorted, disjoint): the main thread waiting on it, not computing."""
    if not inflight:
        return list(pieces)
    starts = [a for a, _ in inflight]
    out: list[tuple[str, float, float]] = []
    for name, a, b in pieces:
        if name.startswith("aten::"):
            out.append((name, a, b))
            continue
        cursor = a
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(inflight) and inflight[i][0] < b:
            lo, hi = inflight[i]
            if hi > cursor:
                if lo > cursor:
                    out.append((name, cursor, lo))
                cursor = max(cursor, hi)
            i += 1
        if cursor < b:
            out.append((name, cursor, b))
    return out


def exclusive(ops: Sequence[TraceEvent]) -> list[tuple[str, float, float]]:
    """(name, start, end) of each instant's innermost operator, for properly nested `ops`."""
    evs = sorted(ops, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
    out: list[tuple[str, float, float]] = []
    stack: list[tuple[str, float]] = []  # name, end
    cursor = 0.0

    def advance(to: float) -> None:
        nonlocal cursor
        while stack and stack[-1][1] <= to:
            name, end = stack.pop()
            if end > cursor:
                out.append((name, cursor, end))
            cursor = max(cursor, end)
        if stack and to > cursor:
            out.append((stack[-1][0], cursor, to))
            cursor = to

    for e in evs:
        a, b = _iv(e)
        advance(a)
        cursor = max(cursor, a)
        stack.append((str(e.get("name", "")), b))
    advance(float("inf"))
    return out


def step_segments(
    events: Sequence[TraceEvent],
    requests: Sequence[CommRequest],
    peers: Sequence[int | None],
    spans: Sequence[TraceEvent],
    *,
    rank: int,
    offset_us: float,
    device: str = "cpu",
) -> list[StepSegments]:
    """One `StepSegments` a profiled step `spans`, on the wall clock; `peers[i]`: the global rank
    of request i's other end (P2P), None when not known."""
    if not spans:
        return []
    main = spans[0].get("tid")
    optimizer = sorted(_iv(e) for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith(OPTIMIZER_RANGE))
    if device == "cuda":
        pieces = [
            (str(e.get("name", "")), *_iv(e))
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") in COMPUTE_KERNEL_CATS
            and backend_label(str(e.get("name", "")), str(e.get("cat", ""))) is None
        ]
        pieces.sort(key=lambda p: p[1])
    else:
        ops = [e for e in events if e.get("ph") == "X" and e.get("tid") == main and e.get("cat") == "cpu_op"]
        inflight = merged((r.start_us, r.start_us + r.time_us) for r in requests if r.start_us is not None and r.kind not in P2P)
        pieces = without_waits(exclusive(ops), inflight)
    # comm: sequence numbers over the whole window, in issue order
    comm: list[tuple[str, str, str, int, float, float]] = []
    seq: dict[str, int] = {}
    for req, peer in zip(requests, peers, strict=True):
        if req.kind in P2P:
            if peer is None:
                continue
            key = f"p2p:{rank}->{peer}" if req.kind == "send" else f"p2p:{peer}->{rank}"
            kind = SEND if req.kind == "send" else RECV
            label = ("pp " if req.pipeline else "") + req.kind
        elif req.group is not None:
            key, kind, label = req.group, COLL, req.kind
        else:
            continue
        n = seq[key] = seq.get(key, -1) + 1
        if req.start_us is not None:
            comm.append((kind, label, key, n, req.start_us, req.start_us + req.time_us))
    # the pieces are in start order; the running maximum of their ends finds the first that reaches a step
    ends = list(itertools.accumulate((b for _, _, b in pieces), max))
    harness = [_iv(e) for e in events if e.get("ph") == "X" and e.get("name") == HARNESS_RANGE]
    out = []
    for span in spans:
        t0, t1 = _iv(span)
        for a, b in harness:  # the census before the step's work moves its start, the one after its end
            if t0 <= a < t1:
                if a - t0 < t1 - b:
                    t0 = max(t0, b)
                else:
                    t1 = min(t1, a)
        s = StepSegments(start_us=t0 + offset_us, end_us=t1 + offset_us)
        last: list[Any] | None = None
        for name, a, b in pieces[bisect.bisect_left(ends, t0) :]:
            if a >= t1:
                break
            a, b = max(a, t0), min(b, t1)
            if b <= a or _is_comm_name(name) or name.startswith("ProfilerStep#"):
                continue
            cls = op_class(name, in_optimizer=any(lo <= a < hi for lo, hi in optimizer))
            if last is not None and last[0] == cls and abs(last[2] - a) < 1e-3:
                last[2] = b
                continue
            if last is not None:
                s.add(COMPUTE, last[0], "", -1, last[1] + offset_us, last[2] + offset_us)
            last = [cls, a, b]
        if last is not None:
            s.add(COMPUTE, last[0], "", -1, last[1] + offset_us, last[2] + offset_us)
        for kind, label, key, n, a, b in comm:
            if t0 <= a <= t1:
                s.add(kind, label, key, n, a + offset_us, b + offset_us)
        out.append(s)
    return out
