"""Exact gates: each CI result's deterministic counters against the baseline series' latest result of
the same config, and the changes a series' owner accepts as intended.

Timings need many results to show a change; the bytes a collective moves, the model state per
rank, the parameter count, the traced activations and a pipeline stage's actions do not vary
from run to run, so any difference is a change of code or configuration, reported with its size
(`parallab.core.counters`). Only results of the same config (`config_key`: workload, hardware,
strategy, world size, options) are compared, whatever series they share. An accepted change (a
counter and the value it was meant to reach) is accepted for the whole family of the series, so
a pull request's intended change is not reported again when it lands on the baseline branch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run, SeriesAccept, SeriesCounters, utcnow
from backend.services import series as series_service
from backend.services.auth import Principal
from backend.services.series import SeriesConfigError
from backend.store import series as store
from parallab.core import counters as exact
from parallab.core.result import ResultDocument


def config_key(run: Run, document: ResultDocument) -> str:
    """Hash of what must match for two results' counters to be compared."""
    picked = {
        "workload_key": run.workload_key,
        "hardware_key": run.hardware_key,
        "strategy": document.strategy.name,
        "world_size": document.strategy.world_size,
        "options": document.strategy.options,
    }
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:32]


def gate_rows(*, session: Session, uploads: Sequence[tuple[Run, ResultDocument]]) -> list[SeriesCounters]:
    """The counters rows of newly uploaded runs (each already joined to its series), each compared
    with the baseline series' latest stored result of its config; reads only."""
    batch_ids = [run.id for run, _ in uploads]
    rows = []
    for run, document in uploads:
        if run.series_id is None:
            continue
        series = series_service.get_series(session=session, series_id=run.series_id)
        base = series_service.baseline_series(session, series)
        key = config_key(run, document)
        new = exact.counters(document.model_dump())
        previous = store.latest_counters(session, series_id=base.id, config_key=key, exclude_runs=batch_ids) if base is not None else None
        changes = exact.diff(previous.counters, new) if previous is not None else []
        rows.append(
            SeriesCounters(
                run_id=run.id,
                series_id=series.id,
                config_key=key,
                counters=new,
                baseline_run_id=previous.run_id if previous is not None else None,
                changes=[c.as_dict() for c in changes],
                created_at=utcnow(),
            )
        )
    return rows


def add_rows(*, session: Session, rows: Sequence[SeriesCounters]) -> None:
    store.add_counters(session, rows)


def marked(changes: Sequence[dict[str, Any]], accepted: set[tuple[str, float]]) -> list[dict[str, Any]]:
    """The changes, each with `accepted`: whether its counter's new value was accepted as intended."""
    return [{**c, "accepted": (c["counter"], float(c["new"])) in accepted} for c in changes]


def changes_for_runs(*, session: Session, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each run's counter changes, marked accepted or not (runs without counters left out)."""
    rows = store.counters_for_runs(session, run_ids)
    families: dict[str, set[tuple[str, float]]] = {}
    out = {}
    for row in rows:
        family = series_service.get_series(session=session, series_id=row.series_id).family
        if family not in families:
            families[family] = store.accepts_of_family(session, family)
        out[row.run_id] = marked(row.changes, families[family])
    return out


def accept(*, session: Session, series_id: str, metric: str | None, principal: Principal) -> list[dict[str, Any]]:
    """Accept the changes the series' latest compared result reports for `metric` (a counter name,
    or a category: every changed counter in it) as intended (owner or admin; caller commits).

    A metric with no reported change there is refused, naming what did change."""
    series = series_service.get_series(session=session, series_id=series_id)
    series_service.check_owner(principal=principal, series=series)
    if not metric:
        raise SeriesConfigError("metric", "is required: a counter name (e.g. comm.all_reduce.g2.bytes) or a category")
    latest = next((row for row in reversed(store.counters_history(session, series_id)) if row.baseline_run_id is not None), None)
    reported = latest.changes if latest is not None else []
    picked = [c for c in reported if metric in (c["counter"], c["category"])]
    if not picked:
        named = ", ".join(c["counter"] for c in reported) or "none"
        raise SeriesConfigError("metric", f"no change of {metric!r} on the series' latest compared result (its changes: {named})")
    already = store.accepts_of_family(session, series.family)
    store.add_accepts(
        session,
        [
            SeriesAccept(family=series.family, series_id=series.id, counter=c["counter"], value=float(c["new"]), user_id=principal.user_id)
            for c in picked
            if (c["counter"], float(c["new"])) not in already
        ],
    )
    return marked(picked, already | {(c["counter"], float(c["new"])) for c in picked})
