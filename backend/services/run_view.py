"""What the run page shows beyond the run row: its document, its traces, and theory against measurement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run
from backend.services.runs import get_run
from backend.store import runs as store

GAP_TOLERANCE = 0.10
"""A measured figure this far from its prediction is flagged (shared/DESIGN.md: above 10%)."""


@dataclass
class Agreement:
    metric: str
    unit: str
    predicted: float | None
    measured: float | None

    @property
    def rel_gap(self) -> float | None:
        if self.predicted in (None, 0) or self.measured is None:
            return None
        return (self.measured - self.predicted) / abs(self.predicted)

    @property
    def flagged(self) -> bool:
        gap = self.rel_gap
        return gap is not None and abs(gap) > GAP_TOLERANCE


@dataclass
class RunView:
    run: Run
    document: dict[str, Any] | None
    trace_ranks: list[int]
    agreement: list[Agreement] = field(default_factory=list)


def agreement(doc: dict[str, Any]) -> list[Agreement]:
    """Predicted against measured: model state per rank, communication per op, pipeline bubble."""
    prediction, summary = doc.get("prediction") or {}, doc.get("summary") or {}
    rows: list[Agreement] = []
    state = prediction.get("model_state_bytes_per_rank")
    totals = [sum((r.get("model_state_bytes") or {}).values()) for r in doc.get("ranks") or []]
    if state or totals:
        rows.append(Agreement("model state per rank (max)", "bytes", sum(state.values()) if state else None, max(totals) if totals else None))
    predicted_comm = prediction.get("comm_bytes_per_step") or {}
    measured_comm = summary.get("comm_bytes_per_step") or {}
    for op in sorted(set(predicted_comm) | set(measured_comm)):
        rows.append(Agreement(f"{op} per step", "bytes", predicted_comm.get(op), measured_comm.get(op)))
    if prediction.get("bubble_fraction") is not None or summary.get("bubble_fraction") is not None:
        rows.append(Agreement("pipeline bubble", "fraction", prediction.get("bubble_fraction"), summary.get("bubble_fraction")))
    return rows


def run_view(*, session: Session, run_id: str) -> RunView:
    """A run, its result document (once finished), which ranks have traces, and theory vs measurement."""
    run = get_run(session=session, run_id=run_id)
    doc = run.result.document if run.result is not None else None
    return RunView(run=run, document=doc, trace_ranks=store.trace_ranks(session, run.id) if doc else [],
                   agreement=agreement(doc) if doc else [])
