"""Runs side by side: every metric in one table, each value relative to a chosen baseline run."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run
from backend.services.architecture import document_architecture
from backend.services.decide import Decision, decide
from backend.store import runs as store
from parallab.core.noise import noisy_reasons
from parallab.core.stragglers import sentence as stragglers_sentence
from parallab.core.whydiff import NotExplained, Why, explain

MAX_COMPARE = 50


@dataclass
class ComparedRun:
    run: Run
    document: dict[str, Any] | None

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def label(self) -> str:
        """A short label for legends and column heads (user text: always escaped where shown)."""
        base = self.run.name or f"{self.run.strategy}×{self.run.world_size}"
        return f"{base} ({self.run.id[:6]})"

    @property
    def watch(self) -> dict[str, str]:
        """What the page's waiting list shows of the run (templates/_waiting.html)."""
        return {"id": self.run.id, "label": self.label, "status": self.run.status}


@dataclass
class MetricRow:
    key: str
    label: str
    unit: str
    """bytes, s, fraction, tokens/s, TFLOP/s, text, ... — how pages format the value."""
    better: str | None
    """'higher', 'lower' or None (no direction)."""
    values: list[Any]
    relative: list[float | None]
    """(value − baseline) / baseline; None where not numeric or no baseline value."""
    differs: bool


RECIPE_DIMENSIONS = ("precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
"""The runs' recipe columns."""
FILTER_DIMENSIONS = (*RECIPE_DIMENSIONS, "straggler")
"""What the compare page filters and groups runs by: the recipe columns, and whether a rank was
named a straggler (True, False, or — not analysed)."""


@dataclass
class WhyRow:
    baseline: str
    other: str
    why: Why | None
    problem: str | None = None


def explain_configurations(compared: Sequence[ComparedRun], decision: Decision | None) -> list[WhyRow]:
    """Each configuration against the baseline's (its repeat group's runs on each side)."""
    if decision is None or len(decision.configurations) < 2:
        return []
    docs = {r.id: r.document for r in compared if r.document}
    base, *others = decision.configurations
    out = []
    for other in others:
        a = [docs[i] for i in base.run_ids if i in docs]
        b = [docs[i] for i in other.run_ids if i in docs]
        try:
            out.append(WhyRow(base.label, other.label, explain(a, b, names=(base.label, other.label))))
        except NotExplained as exc:
            out.append(WhyRow(base.label, other.label, None, str(exc)))
    return out


@dataclass
class Comparison:
    runs: list[ComparedRun]
    baseline: int
    """Index into `runs` of the baseline run."""
    rows: list[MetricRow]
    missing: list[str]
    group_by: str | None = None
    filtered_out: list[str] = field(default_factory=list)
    """Runs asked for that the recipe filters left out."""
    dimension_values: dict[str, list[str]] = field(default_factory=dict)
    """Each recipe dimension's values among the runs asked for (the filters' choices)."""
    decision: Decision | None = None
    """The runs grouped into configurations, each against the baseline's, with intervals (`decide`)."""
    whys: list[WhyRow] = field(default_factory=list)
    """Each other configuration's step-time change against the baseline's, split into parts (`whydiff`)."""

    def group_of(self, index: int) -> str | None:
        """The group value of run `index` when grouping."""
        return _dim(self.runs[index].run, self.group_by) if self.group_by else None

    @property
    def documents(self) -> list[dict[str, Any] | None]:
        return [r.document for r in self.runs]


def _summary(key: str) -> Callable[[ComparedRun], Any]:
    return lambda r: ((r.document or {}).get("summary") or {}).get(key)


def _column(key: str) -> Callable[[ComparedRun], Any]:
    return lambda r: getattr(r.run, key)


def _state_max(r: ComparedRun) -> int | None:
    ranks = (r.document or {}).get("ranks") or []
    totals = [sum((rk.get("model_state_bytes") or {}).values()) for rk in ranks]
    return max(totals) if totals else None


def _predicted_state(r: ComparedRun) -> int | None:
    state = ((r.document or {}).get("prediction") or {}).get("model_state_bytes_per_rank")
    return sum(state.values()) if state else None


def _comm_total(r: ComparedRun) -> int | None:
    per_op = ((r.document or {}).get("summary") or {}).get("comm_bytes_per_step")
    return sum(per_op.values()) if per_op else None


def _wire_total(r: ComparedRun) -> int | None:
    per_op = ((r.document or {}).get("summary") or {}).get("wire_bytes_per_step")
    return sum(per_op.values()) if per_op else None


def _activations_max(r: ComparedRun) -> int | None:
    ranks = (r.document or {}).get("ranks") or []
    values = [(rk.get("memory_breakdown") or {}).get("activations") for rk in ranks]
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _prediction(key: str) -> Callable[[ComparedRun], Any]:
    return lambda r: ((r.document or {}).get("prediction") or {}).get(key)


NOT_CHECKED = "not checked"
"""A check the run does not carry: never shown as passed."""


def _check(summary_key: str, key: str) -> Callable[[ComparedRun], Any]:
    """A field of a check in the summary (`gradient_check`, `replica_check`, `routing_check`,
    `frozen_check`); its "verdict" is
    passed / failed ⚑, marked when the uploader stated it and the lab could not recompute it."""

    def get(r: ComparedRun) -> Any:
        summary = (r.document or {}).get("summary") or {}
        check = summary.get(summary_key)
        if not check:
            return NOT_CHECKED if summary_key in (summary.get("checks_not_checked") or []) else None
        if key == "verdict":
            verdict = "passed" if check.get("passed") else "failed ⚑"
            return f"{verdict} (stated by the uploader)" if summary_key in (summary.get("checks_stated") or []) else verdict
        return check.get(key)

    return get


def _gradient(key: str) -> Callable[[ComparedRun], Any]:
    return _check("gradient_check", key)


def _loss_check(r: ComparedRun) -> str | None:
    """The loss against the fp32 reference, as the stored flags decided it: "not checked" without a
    reference, and whose reference it is when the lab's own did not decide it alone."""
    doc = r.document or {}
    summary = doc.get("summary") or {}
    if "loss_reference" in (summary.get("checks_not_checked") or []):
        return NOT_CHECKED
    if summary.get("loss_max_rel_diff_vs_reference") is None:
        return None
    flagged = any(f.get("metric") == "loss_max_rel_diff_vs_reference" for f in doc.get("flags") or [])
    verdict = "beyond the recipe's tolerance ⚑" if flagged else "within the recipe's tolerance"
    if "loss_reference" in (summary.get("checks_stated") or []):
        return f"{verdict} (reference stated by the uploader)"
    if (doc.get("loss") or {}).get("stated_reference"):
        return f"{verdict} (the lab's reference; the uploader's kept beside it)"
    return verdict


def _options(r: ComparedRun) -> str:
    options = ((r.run.spec or {}).get("strategy") or {}).get("options") or {}
    return json.dumps(options, sort_keys=True) if options else "—"


def _workload(field: str) -> Callable[[ComparedRun], Any]:
    return lambda r: (((r.document or {}).get("workload")) or ((r.run.spec or {}).get("workload")) or {}).get(field)


def _architecture(r: ComparedRun) -> str | None:
    """The model's shape in one line: runs on differently shaped models differ in this row."""
    return document_architecture(r.document, r.run.spec if isinstance(r.run.spec, dict) else None)


def _noise(r: ComparedRun) -> str | None:
    """Says "noisy host: why", "quiet host", or None when the run recorded nothing about its host."""
    noise = (r.document or {}).get("noise")
    if not noise:
        return None
    reasons = noisy_reasons(noise)
    return f"noisy host: {'; '.join(reasons)}" if reasons else "quiet host"


# (key, label, unit, better, getter)
METRICS: list[tuple[str, str, str, str | None, Callable[[ComparedRun], Any]]] = [
    ("status", "Status", "text", None, _column("status")),
    ("strategy", "Strategy", "text", None, _column("strategy")),
    ("world_size", "World size", "ranks", None, _column("world_size")),
    ("options", "Options", "text", None, _options),
    ("model", "Model", "text", None, _column("model")),
    ("architecture", "Architecture", "text", None, _architecture),
    ("seq_len", "Sequence length", "tokens", None, _workload("seq_len")),
    ("global_batch_size", "Global batch", "sequences", None, _workload("global_batch_size")),
    ("precision", "Precision", "text", None, _workload("precision")),
    ("activation_checkpointing", "Recomputation", "text", None, _workload("activation_checkpointing")),
    ("grad_accumulation_steps", "Accumulation steps", "count", None, _workload("grad_accumulation_steps")),
    ("micro_batch_size", "Micro-batch (sequences per forward)", "sequences", None, _column("micro_batch_size")),
    ("hardware_key", "Hardware", "text", None, _column("hardware_key")),
    ("source", "Source", "text", None, _column("source")),
    ("branch", "Branch", "text", None, _column("branch")),
    ("tokens_per_s", "Throughput", "tokens/s", "higher", _summary("tokens_per_s")),
    ("samples_per_s", "Samples", "samples/s", "higher", _summary("samples_per_s")),
    ("step_time_median", "Step time (median)", "s", "lower", lambda r: (_summary("step_time_s")(r) or {}).get("median")),
    ("step_time_p90", "Step time (p90)", "s", "lower", lambda r: (_summary("step_time_s")(r) or {}).get("p90")),
    ("tflops_per_s", "Achieved", "TFLOP/s", "higher", _summary("tflops_per_s")),
    ("mfu", "MFU", "fraction", "higher", _summary("mfu")),
    ("peak_allocated_bytes_max", "Peak allocated (max rank)", "bytes", "lower", _summary("peak_allocated_bytes_max")),
    ("peak_rss_bytes_max", "Peak RSS (max rank)", "bytes", "lower", _summary("peak_rss_bytes_max")),
    ("model_state_bytes", "Model state per rank (max)", "bytes", "lower", _state_max),
    ("predicted_model_state_bytes", "Model state per rank (predicted)", "bytes", "lower", _predicted_state),
    ("activation_bytes", "Activations per rank at the peak (max)", "bytes", "lower", _activations_max),
    ("predicted_activation_bytes", "Activations per rank (predicted)", "bytes", "lower", _prediction("activation_bytes_per_rank")),
    ("comm_time_fraction", "Communication time", "fraction", "lower", _summary("comm_time_fraction")),
    ("exposed_comm_fraction", "Exposed communication (no compute overlaps it)", "fraction", "lower", _summary("exposed_comm_fraction")),
    ("comm_bytes_per_step", "Communication per step", "bytes", "lower", _comm_total),
    ("wire_bytes_per_step", "Bytes on the wire per step", "bytes", "lower", _wire_total),
    ("bubble_fraction", "Pipeline bubble", "fraction", "lower", _summary("bubble_fraction")),
    ("final_loss", "Final loss", "loss", None, _summary("final_loss")),
    ("loss_max_rel_diff", "Loss vs reference (max rel. diff)", "fraction", "lower", _summary("loss_max_rel_diff_vs_reference")),
    ("loss_check", "Loss check against the fp32 reference", "text", None, _loss_check),
    ("gradient_check", "Gradient check against single", "text", None, _gradient("verdict")),
    ("gradient_max_rel_err", "Gradient error (worst parameter)", "rel. error", "lower", _gradient("max_rel_err")),
    ("gradient_worst_param", "Gradient: worst parameter", "text", None, _gradient("worst_param")),
    ("gradient_tolerance", "Gradient tolerance (16-bit: 2 × its noise)", "rel. error", None, _gradient("tolerance")),
    ("replica_check", "Replica check (copies across ranks)", "text", None, _check("replica_check", "verdict")),
    ("routing_check", "Routing check (own top-k vs replayed)", "text", None, _check("routing_check", "verdict")),
    ("frozen_check", "End-of-run check (parameters still training)", "text", None, _check("frozen_check", "verdict")),
    ("noise", "Host during the run", "text", None, _noise),
    ("stragglers", "Straggler (rank persistently last into collectives)", "text", None, lambda r: stragglers_sentence(r.document or {})),
    ("flags", "Prediction gaps > 10%", "count", "lower", lambda r: len((r.document or {}).get("flags") or []) if r.document else None),
]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def relative(value: Any, base: Any) -> float | None:
    """(value − base) / |base| for two numbers; None otherwise."""
    if not (_is_number(value) and _is_number(base)) or base == 0:
        return None
    return (value - base) / abs(base)


def _row(key: str, label: str, unit: str, better: str | None, values: list[Any], baseline: int) -> MetricRow:
    base = values[baseline] if values else None
    rel = [relative(v, base) for v in values]
    present = [v for v in values]
    differs = len({json.dumps(v, sort_keys=True, default=str) for v in present}) > 1
    return MetricRow(key, label, unit, better, values, rel, differs)


def parse_ids(values: Sequence[str]) -> list[str]:
    """Run ids given as repeated parameters and/or comma-separated, each once, in the order given."""
    return list(dict.fromkeys(part.strip() for value in values for part in value.split(",") if part.strip()))


def _dim(run: Run, name: str | None) -> str:
    value = getattr(run, name) if name else None
    return "—" if value is None else str(value)


def _documents(session: Session, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The runs' light documents (summary, ranks' scalars, loss, prediction: what the table and the
    charts draw), never their timelines; each rank's step times only for the runs whose step-time
    chart falls back on them (a rank without `step_time_breakdown`)."""
    docs = store.get_documents(session, run_ids, parts=())
    fallback = {i: d for i, d in docs.items() if any(not (r or {}).get("step_time_breakdown") for r in d.get("ranks") or [])}
    return {**docs, **store.with_parts(session, fallback, ["step_times_s"])}


def compare(
    *,
    session: Session,
    run_ids: Sequence[str],
    baseline_id: str | None = None,
    group_by: str | None = None,
    where: dict[str, str] | None = None,
) -> Comparison:
    """The runs asked for (in that order, at most MAX_COMPARE), their documents and the metric table.

    `where` keeps only the runs whose recipe dimensions have those values; `group_by` orders the
    runs by one recipe dimension (stable: within a group, in the order asked for).
    """
    ids = list(dict.fromkeys(i for i in run_ids if i))[:MAX_COMPARE]
    runs = store.get_runs(session, ids)
    dimension_values = {d: sorted({_dim(r, d) for r in runs}) for d in FILTER_DIMENSIONS}
    where = {k: v for k, v in (where or {}).items() if k in FILTER_DIMENSIONS and v}
    kept = [r for r in runs if all(_dim(r, k) == v for k, v in where.items())]
    filtered_out = [r.id for r in runs if r not in kept]
    group_by = group_by if group_by in FILTER_DIMENSIONS else None
    if group_by:
        kept.sort(key=lambda r: _dim(r, group_by))
    runs = kept
    docs = _documents(session, [r.id for r in runs if r.status == "succeeded"])
    compared = [ComparedRun(run=r, document=docs.get(r.id)) for r in runs]
    found = {r.id for r in runs}
    baseline = next((i for i, r in enumerate(compared) if r.id == baseline_id), 0)
    rows = [_row(k, label, unit, better, [get(r) for r in compared], baseline) for k, label, unit, better, get in METRICS]
    # Communication by op: one row per op any run used.
    ops = sorted({op for r in compared for op in (((r.document or {}).get("summary") or {}).get("comm_bytes_per_step") or {})})
    for op in ops:
        values = [(((r.document or {}).get("summary") or {}).get("comm_bytes_per_step") or {}).get(op) for r in compared]
        rows.append(_row(f"comm_bytes.{op}", f"  {op} per step", "bytes", "lower", values, baseline))
    missing = [i for i in ids if i not in found and i not in filtered_out]
    decision = decide(runs=[(r.run, r.document) for r in compared], baseline_id=compared[baseline].id if compared else None)
    return Comparison(
        runs=compared,
        baseline=baseline,
        rows=rows,
        missing=missing,
        group_by=group_by,
        filtered_out=filtered_out,
        dimension_values=dimension_values,
        decision=decision,
        whys=explain_configurations(compared, decision),
    )


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """The export of a comparison: runs, baseline and every metric with values relative to it."""
    return {
        "baseline": comparison.runs[comparison.baseline].id if comparison.runs else None,
        "runs": [{"id": r.id, "name": r.run.name, "label": r.label, "status": r.run.status} for r in comparison.runs],
        "metrics": [
            {
                "key": m.key,
                "label": m.label.strip(),
                "unit": m.unit,
                "better": m.better,
                "values": m.values,
                "relative_to_baseline": m.relative,
                "differs": m.differs,
            }
            for m in comparison.rows
        ],
        "missing": comparison.missing,
        "decision": comparison.decision.as_json() if comparison.decision is not None else None,
        "why": [
            {"baseline": w.baseline, "other": w.other, "why": w.why.model_dump() if w.why else None, "problem": w.problem}
            for w in comparison.whys
        ],
    }


def comparison_table(comparison: Comparison) -> list[list[Any]]:
    """The comparison as rows for CSV: metric, unit, each run's value, then each relative value."""
    head = ["metric", "unit"] + [r.id for r in comparison.runs] + [f"{r.id} vs baseline" for r in comparison.runs]
    body = [[m.key, m.unit, *m.values, *m.relative] for m in comparison.rows]
    return [head, *body]
