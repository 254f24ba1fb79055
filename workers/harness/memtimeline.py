"""Memory over one profiled step, by category: the profiler's `[memory]` events turned into a timeline.

Pure on purpose — no torch — so every rule is unit-tested on synthetic events. The profiler driver
(`workers.harness.measure`) feeds it the exported trace, the phase marks it placed (a zero-length
profiler range per module forward and per module backward), and what the harness knows about
the tensors alive at the step's start (parameters, their gradients, the optimizer's state, the
rest) and at its end (the gradients and optimizer state the step left).

How an event is attributed (allocations by what they become, frees by what they freed):

- An allocation at an address the step ends with as a gradient is `grads`; as optimizer state, `optimizer`.
- Inside a collective (a `c10d::` or FSDP gather/reduce range on any thread) it is `comm_buffers`.
- Made in a forward phase and still alive when that phase ends, it is `activations` (what the
  backward needs); freed within its phase, `temporaries`. Anything else made in the step is `temporaries`.
- A free takes its bytes from the category of the allocation it frees; freeing a tensor the step
  started with takes them from that tensor's category (`other` when the harness did not know it).

The profiler's CPU "Total Allocated" counts from the profiler's start, so the timeline's
allocated bytes are the live bytes at the step's start plus the change the events report; the
categories at every point sum to it exactly, by construction, and a test holds the events'
own running total to the same figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parallab.core.result import MEMORY_TIMELINE_CATEGORIES, LiveAllocation, MemoryPeak, MemoryPoint

PHASE_MARK = "parallab.phase:"
"""The prefix of the zero-length profiler ranges the driver places: `parallab.phase:forward layers.0`."""
SAMPLE_MARK = "parallab.sample:"
"""The prefix of the zero-length ranges carrying what the framework cannot see, sampled beside each
phase mark: `parallab.sample:rss=123456` (CPU), `parallab.sample:reserved=…,device_used=…` (CUDA)."""
SAMPLE_FIELDS = ("rss", "reserved", "device_used")
TOP = 20
"""Live allocations listed at the peak (the rest summed)."""
BEFORE = "before the step"
COMM_PREFIXES = ("c10d::", "FSDP::all_gather", "FSDP::post_backward_reduce", "FSDP::pre_forward_all_gather")
"""Profiler ranges whose allocations are communication buffers."""
OPTIMIZER_PREFIXES = (("Optimizer.step", "optimizer"), ("Optimizer.zero_grad", "zero_grad"))
DEFAULT_POINTS = 256
"""Points kept per rank (the peak always among them)."""


@dataclass
class Known:
    """What the harness knows of this rank's tensors: storage address -> (category, bytes)."""

    start: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Storages alive at the step's start: params, grads, optimizer, other."""
    end: dict[int, str] = field(default_factory=dict)
    """Storages the step ends with as gradients or optimizer state: address -> category."""
    names: dict[int, str] = field(default_factory=dict)
    """What a known storage is: address -> 'layers.0.attention.wq.weight', '….grad', 'exp_avg of …'."""


def encode_sample(values: Mapping[str, int | None]) -> str:
    """The name of a sample mark: `parallab.sample:rss=123` (the fields that have a value)."""
    return SAMPLE_MARK + ",".join(f"{k}={int(v)}" for k, v in values.items() if v is not None and k in SAMPLE_FIELDS)


def decode_sample(name: str) -> dict[str, int]:
    """The values a sample mark carries (unknown or malformed fields dropped)."""
    out: dict[str, int] = {}
    for part in name[len(SAMPLE_MARK) :].split(","):
        key, _, value = part.partition("=")
        if key in SAMPLE_FIELDS and value.isdigit():
            out[key] = int(value)
    return out


def _ranges(
    events: Sequence[Mapping[str, Any]], lo: float, hi: float
) -> tuple[list[tuple[float, str]], list[tuple[float, float, str]], list[tuple[float, dict[str, int]]]]:
    """(phase marks, comm ranges, samples) inside [lo, hi]: marks as (ts, phase), ranges as
    (start, end, name), samples as (ts, values)."""
    marks: list[tuple[float, str]] = []
    comm: list[tuple[float, float, str]] = []
    samples: list[tuple[float, dict[str, int]]] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        name = str(e.get("name", ""))
        ts = float(e["ts"])
        if not lo <= ts <= hi:
            continue
        if name.startswith(PHASE_MARK):
            marks.append((ts, name[len(PHASE_MARK) :]))
        elif name.startswith(SAMPLE_MARK):
            samples.append((ts, decode_sample(name)))
        elif name.startswith(COMM_PREFIXES):
            comm.append((ts, ts + float(e.get("dur", 0.0)), name))
        else:
            for prefix, phase in OPTIMIZER_PREFIXES:
                if name.startswith(prefix):
                    marks.append((ts, phase))
                    marks.append((ts + float(e.get("dur", 0.0)), f"after {phase}"))
    marks.sort()
    samples.sort(key=lambda s: s[0])
    return marks, comm, samples


def _phase_at(marks: Sequence[tuple[float, str]], ts: float, cursor: int) -> tuple[str, int]:
    """The phase of the last mark at or before `ts` (events come in time order, so a cursor walks the marks)."""
    while cursor < len(marks) and marks[cursor][0] <= ts:
        cursor += 1
    return (marks[cursor - 1][1] if cursor else "step start"), cursor


def _comm_at(comm: Sequence[tuple[float, float, str]], ts: float) -> str | None:
    """The outermost collective range holding `ts`, or None."""
    best: tuple[float, float, str] | None = None
    for start, end, name in comm:
        if start <= ts <= end and (best is None or start < best[0]):
            best = (start, end, name)
    return best[2] if best else None


def timeline(events: Sequence[Mapping[str, Any]], span: Mapping[str, Any], known: Known, *, device_type: int = 0) -> list[MemoryPoint]:
    """Every `[memory]` event of the step `span` on `device_type` (the profiler's code: 0 CPU, 1
    CUDA) as a point: phase, µs from the step's start, allocated bytes, categories, and the latest
    sample of what the framework cannot see (RSS; reserved and NVML on CUDA). The CUDA path
    follows the same rules and has not been run on a GPU yet."""
    return _walk(events, span, known, device_type=device_type)[0]


def live_at_peak(
    events: Sequence[Mapping[str, Any]],
    span: Mapping[str, Any],
    known: Known,
    *,
    device_type: int = 0,
    top: int = TOP,
    stacks: Mapping[int, list[str]] | None = None,
) -> MemoryPeak | None:
    """What is live at the step's peak (the timeline's first highest point): the `top` largest
    groups of allocations by category, module and phase (tensors alive before the step by the
    marked module they belong to), and the rest summed — adding up to the peak exactly
    (a tensor alive before the step that the harness did not know and the step freed is counted
    in `unaccounted_bytes`, as anything else the pairing of frees with allocations leaves over).
    With `stacks` (the CUDA allocator's, `stacks_by_address`), each group the harness could not
    categorise (`other`) carries where its largest was made. None for a step without memory events."""
    points, at_peak = _walk(events, span, known, device_type=device_type, stop_at_peak=True)
    if at_peak is None or not points:
        return None
    highest = peak(points)
    assert highest is not None
    live, start, unknown_freed = at_peak
    stacks = stacks or {}
    modules = sorted({m for m in (_module(p.phase) for p in points) if m}, key=len, reverse=True)
    groups: dict[tuple[str, str | None, str, str | None], list[tuple[int, int]]] = {}  # key -> [(bytes, address)]
    for addr, (category, nbytes) in start.items():
        name = known.names.get(addr)
        groups.setdefault((category, _owner(name, modules), BEFORE, None), []).append((nbytes, addr))
    for addr, entries in live.items():
        for category, nbytes, phase, op in entries:
            groups.setdefault((category, _module(phase), phase, op), []).append((nbytes, addr))
    rows = []
    for (category, module, phase, op), members in groups.items():
        largest = max(members)[1]
        rows.append(
            LiveAllocation(
                bytes=sum(b for b, _ in members),
                count=len(members),
                category=category,
                module=module,
                phase=phase,
                op=op,
                stack=stacks.get(largest) if category == "other" else None,
            )
        )
    rows.sort(key=lambda a: (-a.bytes, a.category, a.phase))
    kept, rest = rows[:top], rows[top:]
    # What the pairing of allocations and frees leaves unexplained: the frees of tensors the harness
    # did not know (`unknown_freed`, ≤ 0), and nothing else where every free found its allocation.
    unaccounted = highest.allocated - sum(a.bytes for a in rows)
    return MemoryPeak(
        phase=highest.phase,
        allocated=highest.allocated,
        top=kept,
        rest_bytes=sum(a.bytes for a in rest),
        rest_count=sum(a.count for a in rest),
        unaccounted_bytes=unaccounted,
    )


def _owner(name: str | None, modules: Sequence[str]) -> str | None:
    """The marked module a start tensor belongs to ('exp_avg of layers.0.attention.wq.weight' ->
    'layers.0'), the innermost that prefixes its name; the name's module path when none does."""
    if name is None:
        return None
    path = name.split(" of ", 1)[-1].removesuffix(".grad")
    for m in modules:
        if path == m or path.startswith(m + "."):
            return m
    return path.rsplit(".", 1)[0] if "." in path else path


def stacks_by_address(snapshot: Mapping[str, Any], depth: int = 8) -> dict[int, list[str]]:
    """Block address -> its allocation's innermost `depth` frames ('file:line name') from the CUDA
    allocator's snapshot (`torch.cuda.memory._snapshot()` under `_record_memory_history`): the
    frames sit on each active block, or on its history's last entry in older formats."""
    out: dict[int, list[str]] = {}
    for segment in snapshot.get("segments") or []:
        for block in segment.get("blocks") or []:
            if not str(block.get("state", "")).startswith("active"):
                continue
            frames = block.get("frames") or ((block.get("history") or [{}])[-1].get("frames") or [])
            if frames:
                out[int(block["address"])] = [f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}" for f in frames[:depth]]
    return out


def _module(phase: str) -> str | None:
    """The module a phase names ('forward layers.0' -> 'layers.0'), None for the step's own phases."""
    kind, _, module = phase.partition(" ")
    return module if kind in ("forward", "backward", "recompute") and module else None


Entry = tuple[str, int, str, str | None]
Live = dict[int, list[Entry]]
"""address -> (category, bytes, phase, collective) of the allocations the step made and has not
freed: a list, since two events at one microsecond can come sorted as the new allocation at an
address before the free of the old one there."""


def _push(live: Live, addr: int, entry: Entry) -> None:
    live.setdefault(addr, []).append(entry)


def _pop(live: Live, addr: int, nbytes: int) -> Entry | None:
    """The live allocation a free of `nbytes` at `addr` ends: the latest of that size there, else the latest."""
    entries = live.get(addr)
    if not entries:
        return None
    at = next((k for k in range(len(entries) - 1, -1, -1) if entries[k][1] == nbytes), len(entries) - 1)
    entry = entries.pop(at)
    if not entries:
        del live[addr]
    return entry


def _walk(
    events: Sequence[Mapping[str, Any]], span: Mapping[str, Any], known: Known, *, device_type: int, stop_at_peak: bool = False
) -> tuple[list[MemoryPoint], tuple[Live, dict[int, tuple[str, int]], int] | None]:
    """The points, and (with `stop_at_peak`) the live allocations, the start tensors still alive and
    the unknown bytes freed at the first highest point."""
    lo = float(span["ts"])
    hi = lo + float(span.get("dur", 0.0))
    memory = sorted(
        (
            e
            for e in events
            if e.get("name") == "[memory]" and lo <= float(e["ts"]) <= hi and int(e["args"].get("Device Type", 0)) == device_type
        ),
        key=lambda e: float(e["ts"]),
    )
    marks, comm, samples = _ranges(events, lo, hi)
    cats = dict.fromkeys(MEMORY_TIMELINE_CATEGORIES, 0)
    start = dict(known.start)
    for category, nbytes in start.values():
        cats[category] += nbytes
    phases = [_phase_at(marks, float(e["ts"]), 0)[0] for e in memory]
    live: Live = {}
    last_alloc = {int(e["args"]["Addr"]): i for i, e in enumerate(memory) if int(e["args"]["Bytes"]) > 0}
    frees = _free_index(memory)
    points: list[MemoryPoint] = []
    allocated = sum(cats.values())
    unknown_freed = 0
    sample: dict[str, int] = {}
    cursor = 0
    for i, e in enumerate(memory):
        args = e["args"]
        nbytes, addr, ts = int(args["Bytes"]), int(args["Addr"]), float(e["ts"])
        while cursor < len(samples) and samples[cursor][0] <= ts:
            sample = samples[cursor][1]
            cursor += 1
        op = _comm_at(comm, ts)
        if nbytes > 0:
            category = _allocation_category(i, addr, phases, op, known, last_alloc, frees)
            _push(live, addr, (category, nbytes, phases[i], op))
        elif (entry := _pop(live, addr, -nbytes)) is not None:
            category = entry[0]
        elif addr in start:
            category = start.pop(addr)[0]
        else:
            category = "other"
            unknown_freed += nbytes
        cats[category] += nbytes
        allocated += nbytes
        points.append(MemoryPoint(phase=phases[i], op=op, t_us=round(ts - lo, 3), allocated=allocated, categories=dict(cats), **sample))
    if stop_at_peak and points:
        top = max(range(len(points)), key=lambda i: points[i].allocated)  # the first highest, as `peak` finds it
        return points, _live_upto(memory, top, phases, comm, known, last_alloc, frees)
    return points, None


def _live_upto(
    memory: Sequence[Mapping[str, Any]],
    top: int,
    phases: Sequence[str],
    comm: Sequence[tuple[float, float, str]],
    known: Known,
    last_alloc: Mapping[int, int],
    frees: Mapping[int, int],
) -> tuple[Live, dict[int, tuple[str, int]], int]:
    """The live allocations, surviving start tensors and unknown bytes freed after event `top`."""
    live: Live = {}
    start = dict(known.start)
    unknown_freed = 0
    for i, e in enumerate(memory[: top + 1]):
        nbytes, addr = int(e["args"]["Bytes"]), int(e["args"]["Addr"])
        if nbytes > 0:
            op = _comm_at(comm, float(e["ts"]))
            _push(live, addr, (_allocation_category(i, addr, phases, op, known, last_alloc, frees), nbytes, phases[i], op))
        elif _pop(live, addr, -nbytes) is not None:
            pass
        elif addr in start:
            del start[addr]
        else:
            unknown_freed += nbytes
    return live, start, unknown_freed


def _free_index(memory: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Allocation index -> index of the event that frees it (absent: alive at the step's end)."""
    open_at: dict[int, list[tuple[int, int]]] = {}  # address -> [(index, bytes)], as `Live` and for the same reason
    out: dict[int, int] = {}
    for i, e in enumerate(memory):
        addr, nbytes = int(e["args"]["Addr"]), int(e["args"]["Bytes"])
        if nbytes > 0:
            open_at.setdefault(addr, []).append((i, nbytes))
        elif open_at.get(addr):
            entries = open_at[addr]
            at = next((k for k in range(len(entries) - 1, -1, -1) if entries[k][1] == -nbytes), len(entries) - 1)
            out[entries.pop(at)[0]] = i
    return out


def _allocation_category(
    i: int, addr: int, phases: Sequence[str], op: str | None, known: Known, last_alloc: Mapping[int, int], frees: Mapping[int, int]
) -> str:
    """The category of allocation `i` by the rules in the module's docstring."""
    if last_alloc.get(addr) == i and addr in known.end:
        return known.end[addr]
    if op is not None:
        return "comm_buffers"
    if phases[i].startswith("forward"):
        freed = frees.get(i)
        return "temporaries" if freed is not None and phases[freed] == phases[i] else "activations"
    return "temporaries"


def downsample(points: Sequence[MemoryPoint], limit: int = DEFAULT_POINTS) -> list[MemoryPoint]:
    """At most `limit` points in time order: the peak, the last point of each phase (where the
    phases part, so runs align and compare there exactly), and the highest of equal runs with the rest."""
    if len(points) <= limit:
        return list(points)
    top = max(range(len(points)), key=lambda i: points[i].allocated)
    ends = [i for i in range(len(points)) if i + 1 == len(points) or points[i + 1].phase != points[i].phase]
    keep = {top, *ends[: max(limit // 2 - 1, 0)]}
    budget = limit - len(keep)
    for b in range(budget):
        lo, hi = b * len(points) // budget, (b + 1) * len(points) // budget
        if hi > lo:
            keep.add(max(range(lo, hi), key=lambda i: points[i].allocated))
    return [points[i] for i in sorted(keep)][:limit] if len(keep) <= limit else _trim(points, keep, top, limit)


def _trim(points: Sequence[MemoryPoint], keep: set[int], top: int, limit: int) -> list[MemoryPoint]:
    """`limit` of the kept indices, the peak among them (bucket maxima can overlap the phase ends)."""
    rest = sorted(keep - {top})
    step = len(rest) / (limit - 1)
    chosen = {rest[int(k * step)] for k in range(limit - 1)} | {top}
    return [points[i] for i in sorted(chosen)]


def peak(points: Sequence[MemoryPoint]) -> MemoryPoint | None:
    """The point of highest allocated bytes (the first of equals), or None for no points."""
    return max(points, key=lambda p: p.allocated, default=None)
