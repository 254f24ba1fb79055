"""What the run page shows beyond the run row: its document, its traces, and theory against measurement."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from backend.models import EngineJob, Run
from backend.services import pools
from backend.services.architecture import document_architecture
from backend.services.runs import get_run
from backend.store import runs as store
from parallab.core.flags import Agreement, agreement
from parallab.core.noise import noisy_reasons
from parallab.core.strategies import layout_of


@dataclass(frozen=True)
class VolumeRow:
    """One op's bytes per step: the buffer (nccl-tests' convention) and on the wire, measured
    (largest rank) and predicted; None where a side has no figure."""

    op: str
    buffer_measured: int | None
    buffer_predicted: int | None
    wire_measured: int | None
    wire_predicted: int | None
    group_size: int | None = None
    """Ranks in the process group the op ran on, when every rank's calls of it share one size."""


UNCALIBRATED_NOTE = (
    "predicted from the device's datasheet figures, not from what its hosts measure: "
    "calibrate the pool (`parallab bench --strategy calibrate --world-size N` on one of its hosts, "
    "or a `calibrate` run submitted to it) for an estimate on measured speeds"
)
"""Why an uncalibrated estimate may be far off (a CPU's datasheet figures can miss by 10×), and the fix."""

NO_PREDICTION_REASON = (
    "no prediction: the planner has no speeds for this run's device ({device}) — the hardware catalogue has "
    "no entry for it, or the result was made without a step-time estimate. Add the device to the lab's hardware "
    "catalogue and calibrate its pool (`parallab bench --strategy calibrate --world-size N`) to get one"
)
"""Why a trained run has no predicted step time: `predict` estimates only on hardware the catalogue knows."""


@dataclass(frozen=True)
class StepTimeCheck:
    """The run's measured median step time beside the planner's estimate for its hardware."""

    measured_s: float
    predicted_s: float | None
    calibrated: bool | None
    """Whether the estimate rests on the pool's calibration (None: the document does not say)."""
    reason: str | None = None
    """Why there is no estimate (None when there is one)."""

    @property
    def ratio(self) -> float | None:
        """Measured over predicted (1.0: the planner was exact; 2.0: the run took twice as long)."""
        return self.measured_s / self.predicted_s if self.predicted_s else None


def step_time_check(doc: dict[str, Any]) -> StepTimeCheck | None:
    """Measured against predicted step time; None when the run measured no step or trained nothing
    (an empty prediction: a collectives sweep or a calibration has no step to predict)."""
    summary, prediction = doc.get("summary") or {}, doc.get("prediction") or {}
    measured = (summary.get("step_time_s") or {}).get("median")
    if not isinstance(measured, int | float) or not prediction:
        return None
    predicted = prediction.get("step_time_s")
    if not isinstance(predicted, int | float) or predicted <= 0:
        device = (doc.get("hardware") or {}).get("device_name") or (doc.get("hardware") or {}).get("device") or "unknown"
        return StepTimeCheck(float(measured), None, None, NO_PREDICTION_REASON.format(device=device))
    calibrated = (prediction.get("step_time_estimate") or {}).get("calibrated")
    return StepTimeCheck(float(measured), float(predicted), calibrated if isinstance(calibrated, bool) else None)


@dataclass
class RunView:
    run: Run
    document: dict[str, Any] | None
    trace_ranks: list[int]
    timeline_events: int = 0
    """Events in the document's timeline (left out of `document`; the page loads it downsampled)."""
    agreement: list[Agreement] = field(default_factory=list)
    volume: list[VolumeRow] = field(default_factory=list)
    scheduler: EngineJob | None = None
    """The run's job in an outside scheduler (a Slurm pool's run): its id, state, reason and nodes."""
    step_time: StepTimeCheck | None = None
    """Measured step time beside the predicted one (None: nothing measured or nothing to predict)."""
    layout: str | None = None
    """The degrees the run's strategy resolves to (`pp=2,dp_shard=2,tp=2`; "single" for one rank)."""
    architecture: str | None = None
    """The model's shape in one line (`architecture.describe`); None when the run names no workload."""

    @property
    def noisy(self) -> list[str]:
        """Why the run's host was noisy (`parallab.core.noise`); empty when quiet or unrecorded."""
        return noisy_reasons((self.document or {}).get("noise"))

    @property
    def repeat(self) -> dict[str, Any] | None:
        """Which repeat of which group the run is (`spec.repeat`), when it is one."""
        repeat = self.run.spec.get("repeat") if isinstance(self.run.spec, dict) else None
        return repeat if isinstance(repeat, dict) else None


def volume_rows(doc: dict[str, Any]) -> list[VolumeRow]:
    """Buffer and wire bytes per op, measured beside predicted, for every op either side names."""
    summary, prediction = doc.get("summary") or {}, doc.get("prediction") or {}
    columns = [
        summary.get("comm_bytes_per_step") or {},
        prediction.get("comm_bytes_per_step") or {},
        summary.get("wire_bytes_per_step") or {},
        prediction.get("wire_bytes_per_step") or {},
    ]
    ops = sorted({op for column in columns for op in column})
    measured, predicted, wire_measured, wire_predicted = columns
    return [
        VolumeRow(op, measured.get(op), predicted.get(op), wire_measured.get(op), wire_predicted.get(op), op_group_size(doc, op))
        for op in ops
    ]


def op_group_size(doc: dict[str, Any], op: str) -> int | None:
    """The process-group size every rank recorded for `op`; None when unrecorded or when they differ."""
    sizes = {c.get("group_size") for r in doc.get("ranks") or [] for c in r.get("comm") or [] if c.get("op") == op}
    return sizes.pop() if len(sizes) == 1 else None


def agreement_rows(doc: dict[str, Any]) -> list[Agreement]:
    """Predicted beside measured, the core's rows (`parallab.core.flags.agreement`), each flagged
    exactly when the document's stored `flags` name its metric — the one gap rule, decided once
    when the result was made. A stored flag no row speaks of still gets a row of its own."""
    stored = {f["metric"]: f for f in doc.get("flags") or [] if f.get("metric")}
    rows = agreement(
        prediction=doc.get("prediction") or {},
        summary=doc.get("summary") or {},
        ranks=doc.get("ranks") or [],
        precision=str((doc.get("workload") or {}).get("precision") or "fp32"),
    )
    shown = [dataclasses.replace(row, flagged=row.metric in stored) for row in rows]
    covered = {row.metric for row in rows}
    shown += [
        Agreement(metric, metric, "", flag.get("predicted"), flag.get("measured"), flagged=True)
        for metric, flag in stored.items()
        if metric not in covered
    ]
    return shown


def run_view(*, session: Session, run_id: str) -> RunView:
    """A run, its result document (once finished) without its timeline — whose events are only
    counted, in the database — which ranks have traces, and theory vs measurement."""
    run = get_run(session=session, run_id=run_id)
    found = store.get_document(session, run.id, omit=["timeline"])
    doc, lengths = found if found is not None else (None, {})
    return RunView(
        run=run,
        document=doc,
        trace_ranks=store.trace_ranks(session, run.id) if doc else [],
        timeline_events=lengths.get("timeline", 0),
        agreement=agreement_rows(doc) if doc else [],
        volume=volume_rows(doc) if doc else [],
        step_time=step_time_check(doc) if doc else None,
        scheduler=pools.engine_job(session=session, run_id=run.id),
        layout=layout_label((doc or {}).get("strategy"), run.spec.get("strategy") if isinstance(run.spec, dict) else None),
        architecture=document_architecture(doc, run.spec if isinstance(run.spec, dict) else None),
    )


def layout_label(*blocks: Any) -> str | None:
    """The layout of the first strategy block (the result's, else the spec's) that resolves to one."""
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("name"), str):
            raw = block.get("options")
            options: dict[str, Any] = raw if isinstance(raw, dict) else {}
            layout = layout_of(block["name"], int(block.get("world_size") or 1), options)
            if layout is not None:
                return layout.label()
    return None
