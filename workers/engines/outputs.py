"""What a job's ranks leave in their run directory, read back the same way by every engine:
their records, their traces, and why they failed (a rank's failure record, else the engine's
reason, led by where the ranks' flight recorders say they hung), each with the log tail."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from parallab.core.hangs import HangReport, analyse, kept
from parallab.core.jobs import ResolvedJob
from parallab.core.result import FailureRecord, RankRecord
from parallab.core.rundir import RunDir
from workers.aggregate import read_node_records

log = logging.getLogger(__name__)


def read_traces(run_dir: RunDir, world_size: int, cap_bytes: int) -> dict[int, bytes]:
    """Each rank's gzipped Chrome trace found here, skipping any over the cap."""
    traces = {}
    for rank in range(world_size):
        path = run_dir.trace(rank)
        if path.exists() and path.stat().st_size <= cap_bytes:
            traces[rank] = path.read_bytes()
    return traces


def flight_dumps(run_dir: RunDir, ranks: Iterable[int]) -> dict[int, bytes | None]:
    """Each of `ranks`' flight-recorder dumps here as its bytes (None: the rank wrote none here)."""
    out: dict[int, bytes | None] = {}
    for rank in ranks:
        try:
            out[rank] = run_dir.flight(rank).read_bytes()
        except OSError:
            out[rank] = None
    return out


def node_flight(run_dir: RunDir, job: ResolvedJob) -> dict[int, str]:
    """The dumps this node's ranks wrote (as text, by global rank), for the run's node 0: every
    rank's found in this host's run directory. Which global ranks a node runs is the rendezvous's
    to say, not `node_rank`'s: torchrun's c10d rendezvous numbers the nodes in the order they join
    ("node_rank is only used for static rdzv_backend"), so node 1 can run rank 0 — reading only
    ranks node_rank × ranks_per_node onwards handed on nothing then. The run directory is this
    host's alone, so whatever ranks ran here wrote into it."""
    found = flight_dumps(run_dir, range(job.world_size))
    return {rank: data.decode(errors="replace") for rank, data in found.items() if data is not None}


def kept_node_flight(run_dir: RunDir, job: ResolvedJob, node_rank: int) -> dict[int, str] | None:
    """`node_flight`, best effort (None: none, or unreadable): a node's end is stored without its dumps rather than lost."""
    try:
        return node_flight(run_dir, job) or None
    except Exception:
        log.exception("could not read node %d's flight-recorder dumps in %s", node_rank, run_dir.path)
        return None


def _world_size(run_dir: RunDir) -> int | None:
    try:
        return int(json.loads(run_dir.job.read_text())["spec"]["strategy"]["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def hang_report(run_dir: RunDir, others: Mapping[int, bytes | str | None] | None = None) -> HangReport | None:
    """What the ranks' flight-recorder dumps say (`parallab.core.hangs`): those found here and
    `others` (the dumps the other nodes of a gang handed on); None when no rank wrote one (the run
    failed before its process group existed)."""
    world_size = _world_size(run_dir)
    if world_size is None:
        return None
    dumps: dict[int, bytes | str | None] = {**flight_dumps(run_dir, range(world_size))}
    for rank, data in (others or {}).items():
        if dumps.get(rank) is None:
            dumps[rank] = data
    if all(d is None for d in dumps.values()):
        return None
    try:
        return analyse(dumps, world_size=world_size, run=run_dir.path.name)
    except Exception:  # the analysis is evidence: the run's failure is reported without it
        log.exception("could not analyse the flight-recorder dumps in %s", run_dir.path)
        return None


def kept_flight(run_dir: RunDir, world_size: int, others: Mapping[int, bytes | str | None] | None = None) -> dict[str, Any] | None:
    """`flight_recorder`, best effort: a failed run's failure is stored without its dumps when
    they cannot be read (an engine's `flight`)."""
    try:
        return flight_recorder(run_dir, world_size, others)
    except Exception:
        log.exception("could not read the flight-recorder dumps in %s", run_dir.path)
        return None


def flight_recorder(run_dir: RunDir, world_size: int, others: Mapping[int, bytes | str | None] | None = None) -> dict[str, Any] | None:
    """What a failed run keeps of its ranks' flight recorders (`parallab.core.hangs.kept`): the
    dumps found here with those of its other nodes (`others`), all `world_size` ranks analysed
    together; None without any."""
    files: dict[int, bytes | str | None] = {**flight_dumps(run_dir, range(world_size))}
    for rank, data in (others or {}).items():
        if files.get(rank) is None:
            files[rank] = data
    return kept(files, world_size=world_size, run=run_dir.path.name)


def failure_message(run_dir: RunDir, reason: str, log_tail: str) -> str:
    """Why the ranks failed: a rank's failure record when one wrote it (the loss diverged), else
    the engine's `reason` — led by the hang the flight recorders show, when they show one; with
    the log tail either way."""
    tail = f"\n--- log tail ---\n{log_tail}"
    if run_dir.failure.exists():
        try:
            return FailureRecord.model_validate_json(run_dir.failure.read_text()).message + tail
        except (ValidationError, OSError):
            log.exception("unreadable failure record in %s", run_dir.path)
    report = hang_report(run_dir)
    lead = f"{report.sentence}\n" if report is not None and report.sentence else ""
    return f"{lead}training process failed: {reason}{tail}"


def node_records(run_dir: RunDir, job: ResolvedJob, *, expected: int, log_tail: str) -> list[RankRecord]:
    """The records of the ranks that wrote into `run_dir`: exactly `expected` of them, or a
    ValueError saying how many came, with the log tail."""
    try:
        records = read_node_records(run_dir)
    except Exception as exc:
        raise ValueError(f"could not read the rank records: {exc}\n--- log tail ---\n{log_tail}") from exc
    if len(records) != expected:
        raise ValueError(f"{len(records)} of the {expected} ranks expected here wrote a record\n--- log tail ---\n{log_tail}")
    return records
