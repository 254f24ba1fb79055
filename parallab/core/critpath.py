"""Where a step's time went across ranks: each rank's step split into parts, and the critical path.

Each rank's profiled window yields, per step, its segments on the wall clock (`StepSegments`, in
columns): compute by op class (`op_class`: matmul, attention, norms and elementwise, optimizer),
every collective with its process group and sequence number, and every point-to-point message
keyed by its ordered pair of ranks and its place among that pair's messages (`p2p:src->dst`; the
k-th send from src to dst is the k-th receive at dst from src).

**A rank's step, split** (`partition`). Every instant of the rank's step gets one part: compute
first (the op class running then); else the communication it is blocked in, split at the moment
it could start (a message: once both its send and its receive were posted) — before the last
member arrived is `wait` (arrival skew), after it `transfer`, each under the collective's dimension
and op (`unmatched` when a member of its group is missing, so the two cannot be told apart; a
message: before the other end posted it is a pipeline's `bubble`, or `wait` outside a pipeline;
after, the message's transfer); else `idle` (the host between ops). The parts sum to the rank's step exactly.

**The critical path** (`critical_path`): walked backwards from the latest step end over the
ranks' split steps. Compute, idle, bubble and transfer on the current rank are on the path; at a
`wait` the path moves to the rank that arrived last (the rank that held the collective back) at
the same instant, since that rank's work then set when the collective could start. A pipeline's
receive is not followed to its sender: the time a stage sits waiting for its input is the
schedule's bubble and stays on the path as such. Where the last rank's segments are not there
(a missing or skipped rank), the wait stays on the path. The path's parts sum to its length, the
time from its first rank's step start to the latest step end.

Bad input is reported, never guessed around (`Skipped`): a rank without segments (untraced, no
record, missing), a rank with fewer steps than the others (truncated), and a rank whose steps do
not overlap the others' on the wall clock (its record is from another run) are left out, each
with its reason; the other ranks are analysed as usual.

Pure on purpose (no torch): the worker runs it while merging the ranks' records. It takes the
ranks' steps one step at a time (`analyse` iterates each rank's steps together), so the memory it
needs is one step of every rank, not the window.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parallab.core.stragglers import Skipped, apart, dim_of, unread_reason

_closed = ConfigDict(extra="forbid", allow_inf_nan=False)

OP_CLASSES = ("matmul", "attention", "norms and elementwise", "optimizer")
COMPUTE, COLL, SEND, RECV = "compute", "coll", "send", "recv"
KINDS = (COMPUTE, COLL, SEND, RECV)
_COMPUTE_PART = {c: "compute " + c for c in OP_CLASSES}
MAX_PATH = 2000
"""Path segments kept for drawing (the median step's by length; adjacent ones of one part merged first)."""

_MATMUL = ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "_scaled_mm", "einsum", "conv", "gemm", "cublas", "cutlass", "xmma")
_ATTENTION = ("attention", "flash", "fmha", "sdpa", "scaled_dot_product")
_OPTIMIZER = ("optimizer", "adam", "sgd", "_foreach", "multi_tensor", "lamb", "clip_grad")


@functools.lru_cache(maxsize=16384)
def op_class(name: str, *, in_optimizer: bool = False) -> str:
    """The op class of an operator or kernel `name` (aten op, autograd node, CUDA kernel);
    `in_optimizer`: it ran inside the optimizer's step."""
    if in_optimizer:
        return "optimizer"
    low = name.lower()
    base = low.split("::")[-1].split(":")[-1].strip()
    if any(n in low for n in _ATTENTION):
        return "attention"
    if any(n in low for n in _OPTIMIZER):
        return "optimizer"
    words = base.replace("backward0", "").replace("backward", "")
    if words in _MATMUL or any(n in low for n in _MATMUL[5:]) or words.startswith(("mm", "addmm", "bmm")):
        return "matmul"
    return "norms and elementwise"


class StepSegments(BaseModel):
    """One rank's segments of one profiled step, in columns (the rank record's; not in the document).

    `kind`: compute, coll, send or recv; `label`: the op class (compute) or op (comm, "pp " before a
    pipeline's send/recv); `key`: the group's global ranks (coll), `p2p:src->dst` (send/recv), ""
    (compute); `seq`: the collective's sequence number in its group, the message's among its pair's."""

    model_config = _closed
    start_us: float
    end_us: float
    kind: list[str] = Field(default_factory=list, max_length=10_000_000)
    label: list[str] = Field(default_factory=list, max_length=10_000_000)
    key: list[str] = Field(default_factory=list, max_length=10_000_000)
    seq: list[int] = Field(default_factory=list, max_length=10_000_000)
    start: list[float] = Field(default_factory=list, max_length=10_000_000)
    end: list[float] = Field(default_factory=list, max_length=10_000_000)

    @model_validator(mode="after")
    def _check(self) -> StepSegments:
        n = len(self.kind)
        if not len(self.label) == len(self.key) == len(self.seq) == len(self.start) == len(self.end) == n:
            raise ValueError("kind, label, key, seq, start and end must be of one length")
        bad = next((k for k in self.kind if k not in KINDS), None)
        if bad is not None:
            raise ValueError(f"kind: {bad!r} is none of {', '.join(KINDS)}")
        if self.end_us < self.start_us:
            raise ValueError("end_us: before start_us")
        return self

    def add(self, kind: str, label: str, key: str, seq: int, start: float, end: float) -> None:
        self.kind.append(kind)
        self.label.append(label)
        self.key.append(key)
        self.seq.append(seq)
        self.start.append(start)
        self.end.append(end)

    def shifted(self, by_us: float) -> StepSegments:
        return self.model_copy(
            update={
                "start_us": self.start_us + by_us,
                "end_us": self.end_us + by_us,
                "start": [t + by_us for t in self.start],
                "end": [t + by_us for t in self.end],
            }
        )


class Piece(NamedTuple):
    """One part of one rank's split step."""

    part: str
    start: float
    end: float
    key: str = ""
    seq: int = -1


@functools.lru_cache(maxsize=65536)
def _part_of_comm(kind: str, label: str, key: str, mesh: tuple[tuple[str, int], ...]) -> str:
    return part_of_comm(kind, label, key, mesh)


def part_of_comm(kind: str, label: str, key: str, mesh: Sequence[tuple[str, int]]) -> str:
    """The part name of a segment's transfer: 'transfer dp_shard all_gather', 'transfer pp recv'."""
    if kind == COLL:
        members = [int(x) for x in key.split(",")] if key else []
        return f"transfer {dim_of(members, mesh) or 'world'} {label}"
    src, _, dst = key[4:].partition("->")
    dim = dim_of([int(src), int(dst)], mesh) if src and dst else None
    op = label[3:] if label.startswith("pp ") else label
    return f"transfer {dim or 'p2p'} {op}"


@dataclass
class Arrivals:
    """Across the ranks, for one step: each collective's last arrival and each message's send."""

    last: dict[tuple[str, int], tuple[int, float]]
    """(group, seq) -> (the last rank to arrive, its arrival)"""
    sent: dict[tuple[str, int], float]
    """(p2p key, seq) -> when the sender began it"""
    posted: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)
    """(p2p key, seq) -> when the receiver posted its receive"""
    present: frozenset[int] = frozenset()

    seen: dict[str, bool] = dataclasses.field(default_factory=dict)

    def complete(self, group: str) -> bool:
        """Whether every member of `group` is here (else its collectives' wait cannot be told from transfer)."""
        known = self.seen.get(group)
        if known is None:
            known = self.seen[group] = all(int(x) in self.present for x in group.split(",") if x)
        return known


def arrivals(steps: Mapping[int, StepSegments]) -> Arrivals:
    last: dict[tuple[str, int], tuple[int, float]] = {}
    sent: dict[tuple[str, int], float] = {}
    posted: dict[tuple[str, int], float] = {}
    for rank, s in steps.items():
        for kind, key, seq, start in zip(s.kind, s.key, s.seq, s.start, strict=True):
            if kind == COLL:
                prev = last.get((key, seq))
                if prev is None or start > prev[1]:
                    last[(key, seq)] = (rank, start)
            elif kind == SEND:
                sent[(key, seq)] = start
            elif kind == RECV:
                posted[(key, seq)] = start
    return Arrivals(last=last, sent=sent, posted=posted, present=frozenset(steps))


def partition(s: StepSegments, across: Arrivals, mesh: Sequence[tuple[str, int]] = ()) -> list[Piece]:
    """The rank's step split into disjoint pieces that cover it exactly (module docstring)."""
    t0, t1 = s.start_us, s.end_us
    mesh_key = tuple(mesh)
    compute: list[tuple[float, float, str]] = []
    comm: list[tuple[float, float, str, str, int]] = []  # start, end, part, key, seq
    for kind, label, key, seq, a, b in zip(s.kind, s.label, s.key, s.seq, s.start, s.end, strict=True):
        a, b = max(a, t0), min(b, t1)
        if b <= a:
            continue
        if kind == COMPUTE:
            compute.append((a, b, _COMPUTE_PART.get(label) or "compute " + label))
            continue
        if kind == COLL and not across.complete(key):
            comm.append((a, b, "unmatched" + _part_of_comm(kind, label, key, mesh_key)[len("transfer") :], key, seq))
            continue
        if kind == COLL:
            ready = across.last.get((key, seq), (0, a))[1]
        else:  # a send waits for its receive to be posted, a receive for its send
            ready = (across.posted if kind == SEND else across.sent).get((key, seq), a)
        where = _part_of_comm(kind, label, key, mesh_key)[len("transfer") :]
        waiting = "bubble" if kind != COLL and label.startswith("pp ") else "wait" + where
        if ready > a:
            comm.append((a, min(ready, b), waiting, key, seq))
        if b > ready:
            comm.append((max(a, ready), b, _part_of_comm(kind, label, key, mesh_key), key, seq))
    return _sweep(t0, t1, compute, comm)


def _sweep(t0: float, t1: float, compute: list[tuple[float, float, str]], comm: list[tuple[float, float, str, str, int]]) -> list[Piece]:
    """Compute over communication over idle, instant by instant, merged into pieces."""
    bounds: list[tuple[float, int, int, int]] = []  # time, 0 end / 1 start, layer (0 compute, 1 comm), index
    for i, (a, b, _) in enumerate(compute):
        bounds.append((a, 1, 0, i))
        bounds.append((b, 0, 0, i))
    for i, (a, b, *_) in enumerate(comm):
        bounds.append((a, 1, 1, i))
        bounds.append((b, 0, 1, i))
    bounds.sort()
    bounds.append((t1, 0, -1, -1))
    on_compute: dict[int, None] = {}
    on_comm: dict[int, None] = {}
    out: list[Piece] = []
    t = t0
    for time, starts, layer, i in bounds:
        until = time if time < t1 else t1
        if until > t:
            if on_compute:
                part, key, seq = compute[next(iter(on_compute))][2], "", -1
            elif on_comm:
                j = next(iter(on_comm)) if len(on_comm) == 1 else min(on_comm, key=lambda k: comm[k][0])
                _, _, part, key, seq = comm[j]
            else:
                part, key, seq = "idle", "", -1
            last = out[-1] if out else None
            if last is not None and last.part == part and last.key == key and last.seq == seq and last.end == t:
                out[-1] = Piece(part, last.start, until, key, seq)
            else:
                out.append(Piece(part, t, until, key, seq))
            t = until
        if layer < 0:
            break
        active = on_compute if layer == 0 else on_comm
        if starts:
            active[i] = None
        else:
            active.pop(i, None)
    return out


class PathSegment(BaseModel):
    model_config = _closed
    rank: int = Field(ge=0)
    part: str = Field(max_length=300)
    start_us: float = Field(description="µs after the path's start.")
    dur_us: float = Field(ge=0)


class CriticalPath(BaseModel):
    """The critical path of the profiled window's steps (`critical_path` in the result document)."""

    model_config = _closed
    steps: int = Field(0, ge=0, description="Profiled steps analysed (every rank's).")
    ranks: list[int] = Field(default_factory=list, max_length=1 << 16, description="The ranks analysed.")
    length_s: float = Field(0.0, ge=0, description="The path's length, mean per step.")
    parts_s: dict[str, float] = Field(default_factory=dict, description="Part -> its time on the path, mean per step.")
    rank_parts_s: dict[str, float] = Field(
        default_factory=dict, description="Part -> its time in a rank's step, mean over the ranks and steps (the diff's parts)."
    )
    rank_step_s: float = Field(0.0, ge=0, description="A rank's profiled step, mean over the ranks and steps.")
    path: list[PathSegment] = Field(default_factory=list, max_length=MAX_PATH, description="The median step's path, earliest first.")
    path_ranks_visited: list[int] = Field(default_factory=list, max_length=1 << 16)
    skipped: list[Skipped] = Field(default_factory=list, max_length=1000)


class PathSummary(BaseModel):
    """What the result document's summary keeps of the critical path (`summary.critical_path`)."""

    model_config = _closed
    length_s: float = Field(ge=0, description="The path's length, mean per step.")
    parts_s: dict[str, float] = Field(default_factory=dict, description="Part -> its time on the path, mean per step.")
    ranks_visited: list[int] = Field(default_factory=list, max_length=1 << 16, description="The ranks the median step's path visits.")
    steps: int = Field(ge=0)

    @classmethod
    def of(cls, cp: CriticalPath) -> PathSummary:
        return cls(length_s=cp.length_s, parts_s=cp.parts_s, ranks_visited=cp.path_ranks_visited, steps=cp.steps)


def critical_path(
    pieces: Mapping[int, Sequence[Piece]], spans: Mapping[int, tuple[float, float]], last_of: Mapping[tuple[str, int], int]
) -> list[tuple[int, Piece]]:
    """One step's path, latest first: (rank, piece clipped to what is on the path); `last_of`:
    (group, seq) -> the rank that arrived last into that collective."""
    if not pieces:
        return []
    rank = max(spans, key=lambda r: (spans[r][1], -r))
    t = spans[rank][1]
    index = {r: len(p) - 1 for r, p in pieces.items()}
    out: list[tuple[int, Piece]] = []
    hops = 0
    while True:
        ps, i = pieces[rank], index[rank]
        while i >= 0 and ps[i].start >= t:
            i -= 1
        index[rank] = i
        if i < 0 or t <= spans[rank][0]:
            break
        piece = ps[i]
        if piece.part.startswith("wait") and hops < 4 * len(pieces):
            holder = last_of.get((piece.key, piece.seq))
            if holder is not None and holder in pieces and holder is not None and holder != rank:
                rank, hops = holder, hops + 1
                continue
        hops = 0
        start = max(piece.start, spans[rank][0])
        out.append((rank, piece._replace(start=start, end=min(piece.end, t))))
        t = start
    return out


def _merge_path(path: Iterable[tuple[int, Piece]], t0: float) -> list[PathSegment]:
    out: list[PathSegment] = []
    for rank, p in sorted(path, key=lambda x: x[1].start):
        if out and out[-1].rank == rank and out[-1].part == p.part and abs(out[-1].start_us + out[-1].dur_us - (p.start - t0)) < 1e-6:
            out[-1] = out[-1].model_copy(update={"dur_us": out[-1].dur_us + p.end - p.start})
        else:
            out.append(PathSegment(rank=rank, part=p.part, start_us=p.start - t0, dur_us=p.end - p.start))
    if len(out) > MAX_PATH:  # keep the longest, in time order
        keep = set(sorted(range(len(out)), key=lambda i: -out[i].dur_us)[:MAX_PATH])
        out = [s for i, s in enumerate(out) if i in keep]
    return out


def analyse(
    per_rank: Mapping[int, Iterable[StepSegments] | None],
    *,
    world_size: int,
    mesh: Sequence[tuple[str, int]] = (),
    shift_us: Mapping[int, float] | None = None,
    unread: Mapping[int, str] | None = None,
) -> CriticalPath | None:
    """The critical path and the ranks' split steps over the window, one step of every rank at a
    time; None when no rank has segments. `shift_us`: µs to add to a rank's times (other hosts'
    clocks, as the collective matching aligned them); `unread`: why a rank's trace could not be
    read, in words, told as the reason it is left out."""
    skipped = [
        Skipped(rank=r, reason="no record from this rank: left out of the critical path") for r in range(world_size) if r not in per_rank
    ]
    skipped += [
        Skipped(rank=r, reason=f"no step segments ({unread_reason(r, unread)}): left out of the critical path")
        for r, s in sorted(per_rank.items())
        if s is None
    ]
    iters: dict[int, Iterator[StepSegments]] = {r: iter(s) for r, s in sorted(per_rank.items()) if s is not None}
    if not iters:
        return None
    shift = shift_us or {}
    live = dict(iters)
    counts: dict[int, int] = defaultdict(int)
    out_of_run: set[int] = set()
    path_parts: dict[str, float] = defaultdict(float)
    rank_parts: dict[str, float] = defaultdict(float)
    lengths: list[float] = []
    rank_steps: list[float] = []
    drawn: list[tuple[float, list[PathSegment], list[int]]] = []  # (length, merged path, ranks visited) a step
    unreadable: list[str] = []
    steps = 0
    while True:
        step: dict[int, StepSegments] = {}
        for r in list(live):
            s = next(live[r], None)
            if s is None:
                del live[r]
                continue
            counts[r] += 1
            step[r] = s.shifted(shift[r]) if shift.get(r) else s
        if not step:
            break
        if len(step) < len(iters):
            continue  # a step some rank lacks (its trace ends early): counted, not analysed
        spans = {r: (s.start_us, s.end_us) for r, s in step.items()}
        out_of_run |= apart(spans)
        step = {r: s for r, s in step.items() if r not in out_of_run}
        spans = {r: v for r, v in spans.items() if r in step}
        if not step:
            continue
        try:
            across = arrivals(step)
            pieces = {r: partition(s, across, mesh) for r, s in step.items()}
        except ValueError as exc:  # a key no rank of this code writes (a record of another version)
            unreadable.append(f"step {len(lengths) + len(unreadable)}: {exc}")
            continue
        for r, ps in pieces.items():
            for p in ps:
                rank_parts[p.part] += (p.end - p.start) * 1e-6
            rank_steps.append((spans[r][1] - spans[r][0]) * 1e-6)
        path = critical_path(pieces, spans, {k: v[0] for k, v in across.last.items()})
        for _, p in path:
            path_parts[p.part] += (p.end - p.start) * 1e-6
        lengths.append(sum(p.end - p.start for _, p in path) * 1e-6)
        drawn.append((lengths[-1], _merge_path(path, min((p.start for _, p in path), default=0.0)), sorted({r for r, _ in path})))
        steps += 1
    skipped += [Skipped(rank=None, reason=f"not analysed, its segments unreadable ({why[:300]})") for why in unreadable[:10]]
    full = max(counts.values()) if counts else 0
    for r, n in sorted(counts.items()):
        if r in out_of_run:
            skipped.append(
                Skipped(rank=r, reason="its steps do not overlap the other ranks' on the wall clock (a record from another run?): left out")
            )
        elif n < full:
            skipped.append(
                Skipped(
                    rank=r,
                    reason=f"its trace holds {n} of the {full} profiled steps (truncated?): only steps every rank holds are analysed",
                )
            )
    n_ranks = max(1, len(rank_steps))
    # The step drawn is the median step by its path's length, not the last: one step's path follows
    # that step's noise (a rank descheduled once moves it), and the last step is no more typical
    # than any other; the median one is the step a reader of the mean parts expects to see.
    _, path_drawn, visited = sorted(drawn, key=lambda d: d[0])[(len(drawn) - 1) // 2] if drawn else (0.0, [], [])
    return CriticalPath(
        steps=steps,
        ranks=sorted(r for r in iters if r not in out_of_run),
        length_s=statistics.fmean(lengths) if lengths else 0.0,
        parts_s={k: v / max(1, steps) for k, v in sorted(path_parts.items(), key=lambda kv: -kv[1])},
        rank_parts_s={k: v / n_ranks for k, v in sorted(rank_parts.items(), key=lambda kv: -kv[1])},
        rank_step_s=statistics.fmean(rank_steps) if rank_steps else 0.0,
        path=path_drawn,
        path_ranks_visited=visited,
        skipped=skipped[:1000],
    )


def part_group(part: str) -> str:
    """The family a part belongs to: compute, transfer, wait, bubble, idle."""
    return part.split(" ", 1)[0]


def sentence(doc: Mapping[str, object]) -> str | None:
    """The critical path in words (run page): its length and its largest parts; None when not analysed."""
    cp = doc.get("critical_path")
    if not isinstance(cp, Mapping) or not cp.get("steps"):
        return None
    length = float(cp.get("length_s") or 0.0)
    parts = cp.get("parts_s") or {}
    if not isinstance(parts, Mapping) or length <= 0:
        return None
    top = sorted(parts.items(), key=lambda kv: -float(kv[1]))[:4]
    listed = ", ".join(f"{k} {float(v) * 1e3:.1f} ms ({float(v) / length * 100:.0f} %)" for k, v in top)
    ranks = cp.get("path_ranks_visited") or []
    through = f" through rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if isinstance(ranks, list) and ranks else ""
    return f"{length * 1e3:.1f} ms per step{through}: {listed}"


def t_quantile(df: int) -> float:
    """Student's t, two-sided 95 %, for `df` degrees of freedom (normal beyond 30)."""
    table = {
        1: 12.706,
        2: 4.303,
        3: 3.182,
        4: 2.776,
        5: 2.571,
        6: 2.447,
        7: 2.365,
        8: 2.306,
        9: 2.262,
        10: 2.228,
        15: 2.131,
        20: 2.086,
        30: 2.042,
    }
    if df <= 0:
        return math.inf
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.96
