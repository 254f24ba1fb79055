"""Collectives matched across ranks, and the ranks that hold the others back.

Each rank's profiled window yields, per collective it entered, a `CollectiveArrival`: its process
group (the global ranks in it), its sequence number in that group on this rank, and when it
entered and left, in wall-clock µs. The rank record holds them by group in columns
(`GroupTimes`: a few floats a collective, not an object each), read back row by row (`rows`).
A collective is the same one on every rank of its group with the same sequence number (c10d
requires every member to issue a group's collectives in one order). For each matched
collective: the last arrival, each rank's wait (last arrival − own arrival) and the transfer
once all have arrived (median over the ranks of own end − last arrival).

Clock. The ranks time their events on the profiler's per-process clock; the harness puts each on
the wall clock (`time.time_ns` beside a profiler range). Ranks on one host share that clock, so
arrivals compare directly. Hosts' wall clocks differ by their NTP offset (often 0.1–10 ms, as
large as the waits looked for), so ranks on other hosts than the first rank's are shifted by
the median, over the collectives they share with it, of the difference of their ends: a
collective's end is the same instant on every member up to the last message's latency.

Straggler rule (`name_stragglers`): a rank is named when, over the collectives it took part in,
(1) it arrived last in at least half, (2) that count is beyond chance — the probability of as
many last places if every member were equally likely last (binomial tail, p = mean of
1/group size) is below 1e-4 divided by the ranks analysed (so a run of many ranks is not more
likely to name one by chance) — and (3) its lateness (the others' mean wait for it) averages,
over the collectives it was last in, at least 1 ms (timer resolution) and 3 times the median of
the other ranks' own mean lateness when they were last (the run's jitter: on a loaded host every
rank is late by a few ms now and then, and one rank can be last a little more often by chance or
by its share of the cores). A clean run's last places scatter across ranks, so (2) keeps it off;
a rank last more often but by no more than the others' jitter is kept off by (3).

Pure on purpose (no torch): the worker runs it while merging the records.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

_closed = ConfigDict(extra="forbid", allow_inf_nan=False)

MAX_EXAMPLES = 64
"""Matched collectives kept one by one in the document (the first ones); the rest are in the aggregates."""
MIN_COLLECTIVES = 8
"""Fewer matched collectives than this on a rank: too few to name it."""
LAST_SHARE = 0.5
CHANCE_P = 1e-4
MIN_WAIT_S = 1e-3
JITTER_TIMES = 3.0


class CollectiveArrival(NamedTuple):
    """One collective as one rank saw it."""

    group: str
    """The group's global ranks, comma-separated, ascending."""
    seq: int
    """Its place among this rank's collectives on that group (issue order)."""
    op: str
    arrive_us: float
    """Wall-clock µs this rank's backend began it (entered the collective)."""
    end_us: float
    """Wall-clock µs it finished on this rank."""


class GroupTimes(BaseModel):
    """One rank's collectives on one group, in columns (the rank record's; not in the document)."""

    model_config = _closed
    group: str = Field(max_length=100_000)
    seq: list[int] = Field(max_length=10_000_000)
    op: list[str] = Field(max_length=10_000_000)
    arrive_us: list[float] = Field(max_length=10_000_000)
    end_us: list[float] = Field(max_length=10_000_000)

    @model_validator(mode="after")
    def _same_lengths(self) -> GroupTimes:
        if not len(self.seq) == len(self.op) == len(self.arrive_us) == len(self.end_us):
            raise ValueError("seq, op, arrive_us and end_us must be of one length")
        return self


def columns(arrivals: Iterable[CollectiveArrival]) -> list[GroupTimes]:
    """Arrivals gathered by group into columns (the record's form)."""
    by_group: dict[str, list[CollectiveArrival]] = defaultdict(list)
    for a in arrivals:
        by_group[a.group].append(a)
    return [
        GroupTimes(
            group=g,
            seq=[a.seq for a in rows_],
            op=[a.op for a in rows_],
            arrive_us=[a.arrive_us for a in rows_],
            end_us=[a.end_us for a in rows_],
        )
        for g, rows_ in by_group.items()
    ]


def rows(groups: Iterable[GroupTimes]) -> Iterator[CollectiveArrival]:
    """The record's columns back as arrivals, one at a time."""
    for g in groups:
        for seq, op, arrive, end in zip(g.seq, g.op, g.arrive_us, g.end_us, strict=True):
            yield CollectiveArrival(g.group, seq, op, arrive, end)


class MatchedCollective(BaseModel):
    model_config = _closed
    group: str = Field(max_length=100_000)
    dim: str | None = Field(None, max_length=200)
    seq: int = Field(ge=0)
    op: str = Field(max_length=64)
    last_rank: int = Field(ge=0)
    arrivals_us: dict[str, float] = Field(description="Rank -> arrival, µs after the first arrival.")
    wait_us: dict[str, float] = Field(description="Rank -> last arrival − own arrival.")
    transfer_us: float = Field(ge=0, description="Median over the ranks of own end − last arrival.")


class GroupMatch(BaseModel):
    """One process group's collectives, aggregated."""

    model_config = _closed
    group: str = Field(max_length=100_000)
    dim: str | None = Field(None, max_length=200, description="The mesh dimension(s) the group spans.")
    matched: int = Field(ge=0)
    unmatched: int = Field(0, ge=0, description="Sequence numbers some member never reported (reported in `skipped`).")
    last_counts: dict[str, int] = Field(default_factory=dict, description="Rank -> collectives it arrived last in.")
    wait_s: dict[str, float] = Field(default_factory=dict, description="Rank -> its total wait for the last arrival.")
    transfer_s: float = Field(0.0, ge=0, description="Total transfer time once all had arrived.")


class RankStanding(BaseModel):
    model_config = _closed
    rank: int = Field(ge=0)
    collectives: int = Field(ge=0)
    last: int = Field(ge=0)
    last_fraction: float = Field(ge=0, le=1)
    wait_caused_s: float = Field(ge=0, description="The others' wait for it, summed over the collectives it arrived last in.")
    waited_s: float = Field(ge=0, description="Its own wait for others.")
    lateness_s: float = Field(0.0, ge=0, description="The others' mean wait for it, summed over the collectives it arrived last in.")


class Skipped(BaseModel):
    model_config = _closed
    rank: int | None = None
    reason: str = Field(max_length=1000)


class CollectivesMatched(BaseModel):
    """The matching over a run's profiled window (`collectives_matched` in the result document)."""

    model_config = _closed
    clock: str = Field(max_length=300)
    steps: int = Field(0, ge=0, description="Profiled steps the window held.")
    groups: list[GroupMatch] = Field(default_factory=list, max_length=10_000)
    ranks: list[RankStanding] = Field(default_factory=list, max_length=1 << 16)
    examples: list[MatchedCollective] = Field(default_factory=list, max_length=MAX_EXAMPLES)
    skipped: list[Skipped] = Field(default_factory=list, max_length=1000)


class Straggler(BaseModel):
    """A rank that persistently arrived last (`summary.stragglers`)."""

    model_config = _closed
    rank: int = Field(ge=0)
    last_fraction: float = Field(ge=0, le=1, description="Share of the matched collectives it took part in where it arrived last.")
    collectives: int = Field(ge=0)
    wait_caused_s: float = Field(ge=0, description="The others' total wait for it over the profiled window.")
    wait_caused_s_per_step: float = Field(ge=0)


def dim_of(group: Sequence[int], mesh: Sequence[tuple[str, int]]) -> str | None:
    """The mesh dimension(s) whose coordinate varies across `group` (row-major mesh, as DeviceMesh
    lays ranks out); joined by '+' when several; None without a mesh or for a single rank."""
    if not mesh or len(group) < 2:
        return None
    coords = []
    for rank in group:
        c = []
        for _, size in reversed(mesh):
            c.append(rank % size)
            rank //= size
        coords.append(c[::-1])
    varying = [name for i, (name, _) in enumerate(mesh) if len({c[i] for c in coords}) > 1]
    return "+".join(varying) or None


@dataclass
class _Acc:
    """A group's running totals (one pass, nothing per collective kept past `MAX_EXAMPLES`)."""

    matched: int = 0
    unmatched: int = 0
    last: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    wait: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    transfer: float = 0.0


def _host_shifts(per_rank: Mapping[int, Sequence[CollectiveArrival]], host_of: Mapping[int, str]) -> dict[int, float]:
    """µs to add to each rank's times: 0 on the first rank's host; elsewhere the median end offset."""
    if len(set(host_of.values())) < 2 or not per_rank:
        return {}
    ref = min(per_rank)
    ref_end = {(a.group, a.seq): a.end_us for a in per_rank[ref]}
    shifts: dict[str, float] = {host_of.get(ref, ""): 0.0}
    for rank, arrivals in per_rank.items():
        host = host_of.get(rank, "")
        if host in shifts:
            continue
        diffs = [ref_end[(a.group, a.seq)] - a.end_us for a in arrivals if (a.group, a.seq) in ref_end]
        shifts[host] = statistics.median(diffs) if diffs else 0.0
    return {rank: shifts.get(host_of.get(rank, ""), 0.0) for rank in per_rank}


@dataclass
class _Tally:
    """The matching's running totals over the collectives, taken in (group, seq) order."""

    mesh: Sequence[tuple[str, int]]
    present: Mapping[int, object]
    shift: Mapping[int, float]
    accs: dict[str, _Acc] = field(default_factory=lambda: defaultdict(_Acc))
    standing: dict[int, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0]))
    """rank -> [collectives, last, caused, waited, lateness]"""
    examples: list[MatchedCollective] = field(default_factory=list)
    short: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    """(group, rank) -> sequence numbers it lacks"""
    members_of: dict[str, list[int]] = field(default_factory=dict)

    def add(self, group: str, seq: int, seen: Mapping[int, CollectiveArrival]) -> None:
        members = self.members_of.get(group)
        if members is None:
            members = self.members_of[group] = [int(x) for x in group.split(",")]
        acc = self.accs[group]
        if len(seen) < len(members):
            acc.unmatched += 1
            for r in members:
                if r not in seen and r in self.present:
                    self.short[(group, r)] += 1
            return
        arrive = {r: a.arrive_us + self.shift.get(r, 0.0) for r, a in seen.items()}
        last_rank = max(arrive, key=lambda r: arrive[r])
        last = arrive[last_rank]
        waits = {r: last - t for r, t in arrive.items()}
        transfer = max(0.0, statistics.median(a.end_us + self.shift.get(r, 0.0) - last for r, a in seen.items()))
        acc.matched += 1
        acc.last[last_rank] += 1
        acc.transfer += transfer * 1e-6
        caused = sum(waits.values()) * 1e-6
        for r, w in waits.items():
            acc.wait[r] += w * 1e-6
            self.standing[r][0] += 1
            self.standing[r][3] += w * 1e-6
        mine = self.standing[last_rank]
        mine[1] += 1
        mine[2] += caused
        mine[4] += caused / max(1, len(waits) - 1)
        if len(self.examples) < MAX_EXAMPLES:
            first = min(arrive.values())
            self.examples.append(
                MatchedCollective(
                    group=group,
                    dim=dim_of(members, self.mesh),
                    seq=seq,
                    op=seen[last_rank].op,
                    last_rank=last_rank,
                    arrivals_us={str(r): t - first for r, t in sorted(arrive.items())},
                    wait_us={str(r): w for r, w in sorted(waits.items())},
                    transfer_us=transfer,
                )
            )

    def groups(self) -> list[GroupMatch]:
        return [
            GroupMatch(
                group=g,
                dim=dim_of(self.members_of[g], self.mesh),
                matched=acc.matched,
                unmatched=acc.unmatched,
                last_counts={str(r): n for r, n in sorted(acc.last.items())},
                wait_s={str(r): w for r, w in sorted(acc.wait.items())},
                transfer_s=acc.transfer,
            )
            for g, acc in sorted(self.accs.items())
        ]

    def ranks(self) -> list[RankStanding]:
        return [
            RankStanding(
                rank=r,
                collectives=int(s[0]),
                last=int(s[1]),
                last_fraction=s[1] / s[0] if s[0] else 0.0,
                wait_caused_s=s[2],
                waited_s=s[3],
                lateness_s=s[4],
            )
            for r, s in sorted(self.standing.items())
        ]


def _overlaps(span: tuple[float, float], others: Iterable[tuple[float, float]]) -> bool:
    return any(span[0] < b and a < span[1] for a, b in others)


def apart(spans: Mapping[int, tuple[float, float]]) -> set[int]:
    """The ranks whose span (a step, or the window's collectives) overlaps no other rank's on the
    wall clock while the others overlap each other: their records come from another run. Two
    ranks apart from each other: both (which one is foreign cannot be told)."""
    alone = {r for r, v in spans.items() if len(spans) > 1 and not _overlaps(v, (w for q, w in spans.items() if q != r))}
    if len(alone) == len(spans) and len(spans) > 2:
        return set()  # nobody overlaps anybody: no common run to measure against, analysed as is
    return alone


def unread_reason(rank: int, unread: Mapping[int, str] | None) -> str:
    """Why `rank` gave no times: its trace's note when it left one (the profiler's file cut short or
    not JSON), else the two causes a record cannot tell apart."""
    note = (unread or {}).get(rank)
    return note[:400] if note else "untraced, or its trace was not read"


def match(
    per_rank: Mapping[int, Iterable[CollectiveArrival] | None],
    *,
    world_size: int,
    mesh: Sequence[tuple[str, int]] = (),
    steps: int = 0,
    host_of: Mapping[int, str] | None = None,
    unread: Mapping[int, str] | None = None,
) -> CollectivesMatched:
    """Match every rank's collectives by (group, sequence number). A rank absent from `per_rank`
    or with None (no profiled window, trace missing) is skipped with the reason — `unread`'s words
    for it when given (why its trace could not be read: cut short, say) —, and so is a rank whose
    collectives lie apart from the others' on the wall clock (its record is from another run); a
    sequence number that some member of its group lacks (a truncated trace) is left out and
    counted, and the rest is matched as usual."""
    skipped = [Skipped(rank=r, reason="no record from this rank") for r in range(world_size) if r not in per_rank]
    skipped += [Skipped(rank=r, reason=f"no collective times: {unread_reason(r, unread)}") for r, a in per_rank.items() if a is None]
    present = {r: list(a) for r, a in per_rank.items() if a is not None}
    shift = _host_shifts(present, host_of or {})
    # a rank whose window lies apart from the others' is another run's (told on one host's clock:
    # across hosts the shift onto the first rank's host would align it)
    spans = {
        r: (min(x.arrive_us for x in a) + shift.get(r, 0.0), max(x.end_us for x in a) + shift.get(r, 0.0)) for r, a in present.items() if a
    }
    for r in sorted(apart(spans)):
        del present[r]
        skipped.append(
            Skipped(
                rank=r, reason="its collectives do not overlap the other ranks' on the wall clock (a record from another run?): not matched"
            )
        )
    # (group, seq) -> rank -> arrival; built one rank at a time
    table: dict[tuple[str, int], dict[int, CollectiveArrival]] = defaultdict(dict)
    for rank, arrivals in present.items():
        for a in arrivals:
            table[(a.group, a.seq)][rank] = a
    tally = _Tally(mesh=mesh, present=present, shift=shift)
    for (group, seq), seen in sorted(table.items()):
        tally.add(group, seq, seen)
    for (group, rank), n in sorted(tally.short.items()):
        skipped.append(Skipped(rank=rank, reason=f"{n} collective(s) on group {group} missing from its trace (truncated?); not matched"))
    clock = "wall clock of one host" if len(set((host_of or {}).values())) < 2 else "wall clock, other hosts aligned on collective ends"
    return CollectivesMatched(
        clock=clock, steps=steps, groups=tally.groups(), ranks=tally.ranks(), examples=tally.examples, skipped=skipped[:1000]
    )


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), summed in log space (n may run to thousands)."""
    if p <= 0 or p >= 1:
        return 1.0 if p >= 1 or k == 0 else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    return min(1.0, sum(math.exp(base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq) for i in range(k, n + 1)))


def name_stragglers(matched: CollectivesMatched) -> list[Straggler]:
    """The ranks that stand out by the module's rule, most wait caused first; [] when none does."""
    chance: dict[int, list[float]] = defaultdict(list)
    for g in matched.groups:
        size = len(g.group.split(","))
        for r in (int(x) for x in g.group.split(",")):
            chance[r] += [1.0 / size] * g.matched
    out = []
    alpha = CHANCE_P / max(1, len(matched.ranks))
    late_by = {s.rank: s.lateness_s / s.last for s in matched.ranks if s.last}
    for s in matched.ranks:
        if s.collectives < MIN_COLLECTIVES or s.last_fraction < LAST_SHARE or s.last == 0:
            continue
        p = statistics.fmean(chance[s.rank]) if chance[s.rank] else 0.5
        if _binomial_tail(s.last, s.collectives, p) >= alpha:
            continue
        jitter = [v for r, v in late_by.items() if r != s.rank]
        if late_by[s.rank] < max(MIN_WAIT_S, JITTER_TIMES * (statistics.median(jitter) if jitter else 0.0)):
            continue
        per_step = s.wait_caused_s / matched.steps if matched.steps else s.wait_caused_s
        out.append(
            Straggler(
                rank=s.rank,
                last_fraction=s.last_fraction,
                collectives=s.collectives,
                wait_caused_s=s.wait_caused_s,
                wait_caused_s_per_step=per_step,
            )
        )
    return sorted(out, key=lambda x: -x.wait_caused_s)


def sentence(doc: Mapping[str, object]) -> str | None:
    """What a result document says of its stragglers, in words (run page, compare); None when it
    was not analysed (an untraced run, or a document from before the analysis)."""
    summary = doc.get("summary")
    named = summary.get("stragglers") if isinstance(summary, Mapping) else None
    if named is None:
        return None
    if not named:
        return "no rank stands out"
    parts = [
        f"rank {s['rank']} arrived last in {s['last_fraction'] * 100:.0f} % of its {s['collectives']} collectives, "
        f"costing the others {s['wait_caused_s_per_step'] * 1e3:.1f} ms of wait per step"
        for s in named
        if isinstance(s, Mapping)
    ]
    return "straggler: " + "; ".join(parts)
