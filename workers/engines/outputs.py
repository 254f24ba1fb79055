"""What a job's ranks leave in their run directory, read back the same way by every engine:
their records, their traces, and why they failed (a rank's failure record, else the engine's
reason, led by where the ranks' flight recorders say they hung), each with the log tail."""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from parallab.core.hangs import HangReport, analyse
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


def flight_dumps(run_dir: RunDir, world_size: int) -> dict[int, bytes | None]:
    """Each rank's flight-recorder dump as its bytes (None: the rank wrote none)."""
    out: dict[int, bytes | None] = {}
    for rank in range(world_size):
        try:
            out[rank] = run_dir.flight(rank).read_bytes()
        except OSError:
            out[rank] = None
    return out


def hang_report(run_dir: RunDir) -> HangReport | None:
    """What the ranks' flight-recorder dumps say (`parallab.core.hangs`); None when no rank wrote
    one (the run failed before its process group existed, or on another engine's host)."""
    try:
        world_size = int(json.loads(run_dir.job.read_text())["spec"]["strategy"]["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    dumps = flight_dumps(run_dir, world_size)
    if all(d is None for d in dumps.values()):
        return None
    try:
        return analyse(dumps, world_size=world_size, run=run_dir.path.name)
    except Exception:  # the analysis is evidence: the run's failure is reported without it
        log.exception("could not analyse the flight-recorder dumps in %s", run_dir.path)
        return None


FLIGHT_CAP_BYTES = 16 * 1024 * 1024
"""The largest rank's dump kept with a run (torch's 2000 entries take about 1 MB)."""


def kept_flight(run_dir: RunDir, world_size: int) -> dict[str, Any] | None:
    """`flight_recorder`, best effort: a failed run's failure is stored without its dumps when
    they cannot be read (an engine's `flight`)."""
    try:
        return flight_recorder(run_dir, world_size)
    except Exception:
        log.exception("could not read the flight-recorder dumps in %s", run_dir.path)
        return None


def flight_recorder(run_dir: RunDir, world_size: int) -> dict[str, Any] | None:
    """What a failed run keeps of its ranks' flight recorders: the analysis and every rank's dump
    (as JSON; a dump that is not JSON as its text, one over the cap as null); None without any."""
    files = flight_dumps(run_dir, world_size)
    if all(d is None for d in files.values()):
        return None
    dumps: dict[str, Any] = {}
    for rank, data in files.items():
        if data is None or len(data) > FLIGHT_CAP_BYTES:
            dumps[str(rank)] = None
            continue
        try:
            dumps[str(rank)] = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            dumps[str(rank)] = data.decode(errors="replace")
    report = hang_report(run_dir)
    return {"report": report.model_dump(mode="json") if report is not None else None, "dumps": dumps}


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
