"""Where a hung or broken run stopped: every rank's flight-recorder dump read side by side.

Each rank keeps torch's flight recorder (the last `TORCH_FR_BUFFER_SIZE` collectives it called,
on gloo and NCCL alike) and, when it fails, is stopped or times out, writes it into the run
directory wrapped in a small envelope (`Dump`): which run and rank wrote it, why, and the ranks of
each of its process groups (torch's gloo dump leaves `pg_config` empty, which is where its own
analyser, `fr_trace`, looks them up and fails). This module reads those dumps — pure, standard
library and pydantic — and says, in one sentence, the first collective sequence number of a
process group where the ranks disagree: what each rank called there, and which ranks never
arrived (a rank whose last collective in that group came before it).

Within one process group torch numbers the collectives 1, 2, 3, ... on every member alike, so
matching is by (group, sequence). Point-to-point operations carry a sequence of their own per
pair and are not matched. The recorder is a ring: only sequences every member still holds are
compared. Where several groups disagree, the first is the one whose earliest call at its
sequence came first (the recorder's wall-clock creation time).

Bad input is named, never a crash: a dump that is missing (its rank died before it could write
one), truncated or not JSON, not a flight-recorder dump, or written by another run is listed in
`HangReport.problems` and left out of the matching.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

FORMAT = "parallab-flight/1"
"""The envelope's `format`: a dump without it is not one of ours."""

WORLD_DESC = "default_pg"
"""torch's description of the world group."""

DumpStatus = Literal["ok", "missing", "truncated", "invalid", "foreign"]


class Entry(BaseModel):
    """One recorded call (the fields of torch's flight-recorder entry this analysis reads)."""

    model_config = ConfigDict(extra="ignore")
    collective_seq_id: int = Field(ge=0)
    p2p_seq_id: int = 0
    is_p2p: bool = False
    profiling_name: str
    process_group: tuple[str, str] = Field(description="(the group's name, its description)")
    input_sizes: list[list[int]] = Field(default_factory=list)
    input_dtypes: list[str] = Field(default_factory=list)
    time_created_ns: int = 0
    state: str = "scheduled"


class TorchDump(BaseModel):
    """torch's `_dump_fr_trace_json` / `_dump_nccl_trace_json` document (what this analysis reads)."""

    model_config = ConfigDict(extra="ignore")
    version: str = ""
    entries: list[Entry] = Field(default_factory=list)


class GroupInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    desc: str = ""
    ranks: list[int] = Field(description="Global ranks of the group's members.")


class Dump(BaseModel):
    """One rank's dump as the harness writes it (`RunDir.flight(rank)`)."""

    model_config = ConfigDict(extra="ignore")
    format: Literal["parallab-flight/1"]
    run: str = Field(description="The run directory's name (the run id) the rank ran in.")
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    reason: str = Field("", description="Why the rank wrote it: the exception it raised, or the signal that stopped it.")
    groups: dict[str, GroupInfo] = Field(default_factory=dict, description="This rank's process groups, by torch's group name.")
    torch: TorchDump


class Call(BaseModel):
    """What one rank called at one sequence of one group."""

    model_config = ConfigDict(frozen=True)
    op: str
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        shapes = ", ".join(f"{d}[{'x'.join(map(str, s))}]" for d, s in zip(self.dtypes, self.sizes, strict=False))
        return f"{self.op}({shapes})" if shapes else self.op


class HangReport(BaseModel):
    """What the dumps say: the first disagreement, or why none could be found."""

    sentence: str | None = Field(description="The one-line finding a failed run's error starts with; None when the dumps show none.")
    group: str | None = None
    group_desc: str | None = None
    group_ranks: list[int] = Field(default_factory=list)
    sequence: int | None = None
    calls: dict[int, str] = Field(default_factory=dict, description="What each rank that arrived called there.")
    never_arrived: list[int] = Field(default_factory=list)
    last_sequence: dict[int, int] = Field(default_factory=dict, description="A rank that never arrived: its last sequence in that group.")
    dumps: dict[int, DumpStatus] = Field(default_factory=dict)
    reasons: dict[int, str] = Field(default_factory=dict, description="Why each rank wrote its dump.")
    problems: list[str] = Field(default_factory=list, description="Dumps left out of the matching, each with why.")


def op_name(profiling_name: str) -> str:
    """'gloo:all_reduce' → 'all_reduce' (the backend's prefix dropped)."""
    return profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name


def read_dump(data: bytes | str | None, *, rank: int, run: str | None) -> tuple[Dump | None, DumpStatus, str | None]:
    """(the dump, its status, the problem in words) of rank `rank`'s file content (None: no file)."""
    if data is None:
        return None, "missing", f"rank {rank} left no dump (it died before it could write one, or its node's dumps never reached the lab)"
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "truncated", f"rank {rank}'s dump is truncated or not JSON"
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        return None, "invalid", f"rank {rank}'s dump is not a parallab flight-recorder dump (no format {FORMAT!r})"
    try:
        dump = Dump.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        return None, "invalid", f"rank {rank}'s dump is malformed: {field}: {first['msg']}"
    if run is not None and dump.run != run:
        return None, "foreign", f"rank {rank}'s dump is from another run ({dump.run}), not this one ({run})"
    if dump.rank != rank:
        return None, "foreign", f"the dump filed as rank {rank}'s was written by rank {dump.rank}"
    return dump, "ok", None


def _ranks(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(map(str, ordered))


def _group_words(name: str, info: GroupInfo | None) -> str:
    desc = info.desc if info is not None else ""
    members = f" ({_ranks(info.ranks)})" if info is not None and info.ranks else ""
    if desc == WORLD_DESC:
        return f"the world group{members}"
    if desc.startswith("mesh_"):
        return f"the {desc[len('mesh_') :]} group {name}{members}"
    return f"group {name}{members}"


def _calls_by_group(dump: Dump) -> dict[str, dict[int, Call]]:
    out: dict[str, dict[int, Call]] = {}
    for e in dump.torch.entries:
        if e.is_p2p or e.collective_seq_id <= 0:
            continue
        call = Call(op=op_name(e.profiling_name), sizes=tuple(tuple(s) for s in e.input_sizes), dtypes=tuple(e.input_dtypes))
        out.setdefault(e.process_group[0], {})[e.collective_seq_id] = call
    return out


def _created(dump: Dump, group: str, seq: int) -> int:
    for e in dump.torch.entries:
        if not e.is_p2p and e.process_group[0] == group and e.collective_seq_id == seq:
            return e.time_created_ns
    return 0


class _Finding(BaseModel):
    group: str
    sequence: int
    calls: dict[int, Call]
    absent: dict[int, int]
    first_ns: int


def _first_disagreement(
    group: str, members: list[int], calls: Mapping[int, Mapping[int, Call]], dumps: Mapping[int, Dump]
) -> _Finding | None:
    known = [r for r in members if r in dumps]
    if len(known) < 2:
        return None
    held = {r: calls.get(r, {}) for r in known}
    lows = [min(s) for s in held.values() if s]
    if not lows:
        return None
    start, end = max(lows), max(max(s) for s in held.values() if s)
    for seq in range(start, end + 1):
        arrived = {r: held[r][seq] for r in known if seq in held[r]}
        absent = {r: max(held[r], default=0) for r in known if seq not in held[r]}
        if len(set(arrived.values())) > 1 or absent:
            first = min((_created(dumps[r], group, seq) for r in arrived), default=0)
            return _Finding(group=group, sequence=seq, calls=arrived, absent=absent, first_ns=first)
    return None


def _sentence(f: _Finding, info: GroupInfo | None) -> str:
    where = f"collective {f.sequence} of {_group_words(f.group, info)}"
    by_call: dict[Call, list[int]] = {}
    for rank, call in sorted(f.calls.items()):
        by_call.setdefault(call, []).append(rank)
    said = "; ".join(f"{_ranks(ranks)} called {call.text}" for call, ranks in by_call.items())
    missing = ", ".join(f"rank {r} (its last there: {last or 'none'})" for r, last in sorted(f.absent.items()))
    if len(by_call) > 1:
        tail = f"; never arrived: {missing}" if missing else ""
        return f"hang: ranks disagree at {where}: {said}{tail}"
    return f"hang: {_ranks(f.absent)} never arrived at {where}, where {said}; last there: " + ", ".join(
        f"rank {r} at {last or 'none'}" for r, last in sorted(f.absent.items())
    )


def _where_they_were(dumps: Mapping[int, Dump], groups: Mapping[str, GroupInfo]) -> str:
    """The readable dumps agree: where they stood (the newest call recorded, and who made it)."""
    newest = max(
        ((e.time_created_ns, e.process_group[0], e.collective_seq_id) for d in dumps.values() for e in d.torch.entries if not e.is_p2p),
        default=None,
    )
    if newest is None:
        return "; the readable dumps hold no collective"
    _, group, seq = newest
    at = {r: c[group][seq] for r, c in ((r, _calls_by_group(d)) for r, d in dumps.items()) if seq in c.get(group, {})}
    said = "; ".join(f"{_ranks([r for r in at if at[r] == call])} called {call.text}" for call in dict.fromkeys(at.values()))
    return f"; the readable dumps agree, last at collective {seq} of {_group_words(group, groups.get(group))}: {said}"


def analyse(files: Mapping[int, bytes | str | None], *, world_size: int, run: str | None = None) -> HangReport:
    """The first disagreement among the dumps of ranks 0..world_size-1 (`files[r]`: rank r's file
    content, None or absent when it wrote none); `run`: the run they must come from."""
    dumps: dict[int, Dump] = {}
    status: dict[int, DumpStatus] = {}
    problems: list[str] = []
    for rank in range(world_size):
        dump, state, problem = read_dump(files.get(rank), rank=rank, run=run)
        status[rank] = state
        if problem is not None:
            problems.append(problem)
        if dump is not None:
            if dump.world_size != world_size:
                status[rank] = "foreign"
                problems.append(f"rank {rank}'s dump is from a run of {dump.world_size} ranks, not {world_size}")
                continue
            dumps[rank] = dump
    reasons = {r: d.reason for r, d in dumps.items() if d.reason}
    if not dumps:
        return HangReport(sentence=None, dumps=status, problems=problems)
    groups: dict[str, GroupInfo] = {}
    for d in dumps.values():
        for name, group in d.groups.items():
            groups.setdefault(name, group)
    calls = {r: _calls_by_group(d) for r, d in dumps.items()}
    names = sorted({g for c in calls.values() for g in c} | set(groups), key=lambda n: (len(n), n))
    findings = []
    for name in names:
        members = groups[name].ranks if name in groups else sorted(r for r in calls if name in calls[r])
        found = _first_disagreement(name, members, {r: calls[r].get(name, {}) for r in dumps}, dumps)
        if found is not None:
            findings.append(found)
    base = HangReport(sentence=None, dumps=status, reasons=reasons, problems=problems)
    if not findings:
        if problems:
            base.sentence = "hang not located: " + "; ".join(problems) + _where_they_were(dumps, groups)
        return base
    f = min(findings, key=lambda x: (x.first_ns or 0, x.sequence))
    info = groups.get(f.group)
    sentence = _sentence(f, info)
    failed = {r: reasons[r] for r in sorted(f.absent) if r in reasons and not reasons[r].startswith("stopped by")}
    if failed:  # a rank that never arrived because it failed elsewhere: say how
        sentence += "; " + "; ".join(f"rank {r} had failed: {why.splitlines()[0][:200]}" for r, why in failed.items())
    unknown = [r for r in (info.ranks if info else []) if r not in dumps]
    if unknown:
        sentence += f" ({_ranks(unknown)}: no readable dump)"
    return base.model_copy(
        update={
            "sentence": sentence,
            "group": f.group,
            "group_desc": info.desc if info else None,
            "group_ranks": info.ranks if info else sorted(f.calls),
            "sequence": f.sequence,
            "calls": {r: c.text for r, c in f.calls.items()},
            "never_arrived": sorted(f.absent),
            "last_sequence": dict(sorted(f.absent.items())),
        }
    )


DUMP_CAP_BYTES = 16 * 1024 * 1024
"""The largest rank's dump kept with a run (torch's 2000 entries take about 1 MB)."""


def kept(files: Mapping[int, bytes | str | None], *, world_size: int, run: str | None = None) -> dict[str, Any] | None:
    """What a failed run keeps of its ranks' flight recorders, every node's alike: the analysis
    of all `world_size` ranks (a rank absent from `files` is named missing) and every rank's dump
    (as JSON; a dump that is not JSON as its text, one over the cap or absent as null); None when
    no rank left one."""
    if all(files.get(r) is None for r in range(world_size)):
        return None
    dumps: dict[str, Any] = {}
    for rank in range(world_size):
        data = files.get(rank)
        if data is None or len(data) > DUMP_CAP_BYTES:
            dumps[str(rank)] = None
            continue
        try:
            dumps[str(rank)] = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            dumps[str(rank)] = data.decode(errors="replace") if isinstance(data, bytes) else data
    try:
        report: dict[str, Any] | None = analyse(files, world_size=world_size, run=run).model_dump(mode="json")
    except Exception:  # noqa: BLE001 — the dumps are evidence: kept without their analysis
        report = None
    return {"report": report, "dumps": dumps}


def kept_files(value: Mapping[str, Any]) -> dict[int, str | None]:
    """The rank files back out of a value `kept` made (to merge a late node's dumps into it)."""
    out: dict[int, str | None] = {}
    for rank, dump in (value.get("dumps") or {}).items():
        out[int(rank)] = None if dump is None else dump if isinstance(dump, str) else json.dumps(dump, separators=(",", ":"))
    return out
