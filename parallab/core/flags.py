"""The one rule that holds a measurement against its prediction (gaps above 10%).

`agreement` lists every compared figure — predicted beside measured — and decides which are
flagged; the worker stores the flagged ones as the document's `flags`, and every page shows the
rows with the stored flags. Nothing else decides what a gap is.

Compared: model-state bytes per rank, per component (params, grads, optimizer; the max over
ranks) in every precision — the prediction is of what runs (4+4+8 bytes per parameter under
autocast as in fp32); communication bytes per step by op, in the buffer convention (the
summary's max over ranks; an op nobody predicted is flagged only above 1% of the predicted
total, so a stray scalar all-reduce is not); the bytes on the wire by op, where the measurement
has them (`summary.wire_bytes_per_step`; same rule); activations per rank at the peak, where the
ranks have a `memory_breakdown` (the max over ranks); and the pipeline bubble. A figure the run did
not measure (`summary.not_measured`: an untraced run has no comm bytes and no bubble) is not
compared at all — no flag without a measurement.

Checks with a verdict of their own are rows too, flagged when they fail: the loss against the
fp32 reference (`loss_max_rel_diff_vs_reference` against the recipe's `LOSS_TOLERANCE`, on every
run that has a reference), the gradient check (`summary.gradient_check`: the worst error against
its tolerance, derived from the format's noise for a 16-bit run), the replica check
(`summary.replica_check`: the worst difference between two copies that should be identical,
naming the parameter and the ranks), the routing cross-check (`summary.routing_check`: the share
of tokens the run sent elsewhere than the reference's own top-k beyond a near-tie) and the
end-of-run check (`summary.frozen_check`: the least motion of a parameter that had a gradient at
the check's step; below its tolerance, the parameter stopped training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parallab.core.recipes import loss_tolerance

FLAG_TOLERANCE = 0.10
"""A measured figure further than this (relative) from its prediction is flagged."""
UNPREDICTED_OP_SHARE = 0.01
"""An op with no prediction is flagged only when it moves more than this share of the predicted total."""
STATE_PARTS = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class Agreement:
    """One predicted figure beside its measurement."""

    metric: str
    """Stable key, e.g. `comm_bytes_per_step.all_reduce` (what a stored flag names)."""
    label: str
    unit: str
    predicted: float | None
    measured: float | None
    flagged: bool

    @property
    def rel_gap(self) -> float | None:
        """(measured − predicted) / |predicted|; None without both."""
        if not self.predicted or self.measured is None:
            return None
        return (self.measured - self.predicted) / abs(self.predicted)

    def as_flag(self) -> dict[str, Any]:
        """The stored `flags` entry (rel_gap is the absolute gap the rule compared)."""
        predicted, measured = float(self.predicted or 0.0), float(self.measured or 0.0)
        return {"metric": self.metric, "predicted": predicted, "measured": measured, "rel_gap": _gap(predicted, measured)}


def _gap(predicted: float, measured: float) -> float:
    return abs(measured - predicted) / abs(predicted) if predicted else (1.0 if measured else 0.0)


def _row(
    metric: str, label: str, unit: str, predicted: float | None, measured: float | None, *, tolerance: float, floor: float = 0.0
) -> Agreement:
    p, m = float(predicted or 0.0), float(measured or 0.0)
    flagged = (predicted is not None or measured is not None) and not (not p and m <= floor) and _gap(p, m) > tolerance
    return Agreement(metric, label, unit, predicted, measured, flagged)


def _per_op(key: str, what: str, prediction: Mapping[str, Any], summary: Mapping[str, Any], *, tolerance: float) -> list[Agreement]:
    """One row per op either side speaks of; an unpredicted op counts above 1% of the predicted total."""
    predicted = dict(prediction.get(key) or {})
    measured = dict(summary.get(key) or {})
    floor = UNPREDICTED_OP_SHARE * sum(predicted.values())
    return [
        _row(f"{key}.{op}", f"{op} {what}", "bytes", predicted.get(op), measured.get(op, 0), tolerance=tolerance, floor=floor)
        for op in sorted(set(predicted) | set(measured))
    ]


def agreement(
    *,
    prediction: Mapping[str, Any],
    summary: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    precision: str = "fp32",
    tolerance: float = FLAG_TOLERANCE,
) -> list[Agreement]:
    """Every figure the prediction and the measurement both speak of, with the gap rule applied.

    `precision` is accepted for older callers; model state is compared per component in every
    precision, since the prediction is of what runs."""
    rows: list[Agreement] = []
    state = prediction.get("model_state_bytes_per_rank")
    measured_states = [r["model_state_bytes"] for r in ranks if r.get("model_state_bytes")]
    if state and measured_states:
        for part in STATE_PARTS:
            rows.append(
                _row(
                    f"model_state_bytes_per_rank.{part}",
                    f"model state per rank: {part} (max)",
                    "bytes",
                    state[part],
                    max(s[part] for s in measured_states),
                    tolerance=tolerance,
                )
            )

    activations = [(r.get("memory_breakdown") or {}).get("activations") for r in ranks]
    measured_activations = [a for a in activations if a is not None]
    if prediction.get("activation_bytes_per_rank") is not None and measured_activations:
        rows.append(
            _row(
                "activation_bytes_per_rank",
                "activations per rank at the peak (max)",
                "bytes",
                prediction["activation_bytes_per_rank"],
                max(measured_activations),
                tolerance=tolerance,
            )
        )

    unmeasured = set(summary.get("not_measured") or ())
    if "comm_bytes_per_step" not in unmeasured:
        rows += _per_op("comm_bytes_per_step", "per step", prediction, summary, tolerance=tolerance)
    if summary.get("wire_bytes_per_step") and "wire_bytes_per_step" not in unmeasured:
        rows += _per_op("wire_bytes_per_step", "on the wire per step", prediction, summary, tolerance=tolerance)

    if prediction.get("bubble_fraction") is not None and summary.get("bubble_fraction") is not None and "bubble_fraction" not in unmeasured:
        rows.append(
            _row(
                "bubble_fraction",
                "pipeline bubble",
                "fraction",
                prediction["bubble_fraction"],
                summary["bubble_fraction"],
                tolerance=tolerance,
            )
        )
    rows += _verdicts(summary, precision)
    return rows


def _verdicts(summary: Mapping[str, Any], precision: str) -> list[Agreement]:
    """The checks with a verdict of their own (not prediction gaps): predicted = the tolerance,
    measured = the worst error, flagged ⇔ the check failed."""
    rows: list[Agreement] = []
    loss_diff = summary.get("loss_max_rel_diff_vs_reference")
    if loss_diff is not None:
        limit = loss_tolerance(precision)
        rows.append(
            Agreement(
                "loss_max_rel_diff_vs_reference",
                f"loss vs the fp32 reference: worst relative difference over steps, against the {precision} tolerance",
                "ratio",
                limit,
                float(loss_diff),
                flagged=float(loss_diff) > limit,
            )
        )
    check = summary.get("gradient_check")
    if check:
        # Not a prediction gap: the check's own verdict (passed ⇔ worst error ≤ its tolerance).
        label = f"gradient vs single: worst relative error ({check.get('worst_param') or 'no parameter'})"
        rows.append(_check_row("gradient_check", check, "max_rel_err", label))
    replicas = summary.get("replica_check")
    if replicas:
        ranks = ", ".join(str(r) for r in replicas.get("worst_ranks") or [])
        where = f"{replicas.get('worst_param')} on ranks {ranks}" if replicas.get("worst_param") else "no parameter"
        label = f"replicas: worst relative difference between copies that should be identical ({where})"
        rows.append(_check_row("replica_check", replicas, "max_rel_diff", label))
    routed = summary.get("routing_check")
    if routed:
        label = "routing: share of tokens sent to other experts than the reference's own top-k beyond a near-tie"
        rows.append(_check_row("routing_check", routed, "unexplained_rate", label))
    still = summary.get("frozen_check")
    if still:
        where = f" ({still.get('least_moved')})" if still.get("least_moved") else ""
        label = f"end of run: least motion of a parameter that had a gradient{where}"
        rows.append(_check_row("frozen_check", still, "min_motion", label, against="the least it must move"))
    return rows


CORRECTNESS_CHECKS = {
    "loss_max_rel_diff_vs_reference": "loss",
    "gradient_check.max_rel_err": "gradient",
    "replica_check.max_rel_diff": "replica",
    "routing_check.unexplained_rate": "routing",
    "frozen_check.min_motion": "frozen",
}
"""The checks with a verdict of their own (`_verdicts`' rows) by the short name pages show."""


def _check_row(key: str, check: Mapping[str, Any], field: str, label: str, *, against: str = "its tolerance") -> Agreement:
    """The check `summary[key]`'s own verdict as a row: its figure `field` against its tolerance,
    flagged ⇔ it failed; the metric is `<key>.<field>` (`CORRECTNESS_CHECKS`' keys)."""
    return Agreement(
        f"{key}.{field}",
        f"{label}, against {against}",
        "ratio",
        float(check.get("tolerance") or 0.0),
        float(check.get(field) or 0.0),
        flagged=not check.get("passed", True),
    )


def failed_checks(summary: Mapping[str, Any], precision: str = "fp32") -> list[str]:
    """The correctness checks the run failed (`CORRECTNESS_CHECKS`' names, in that order), by the
    same rule as its stored flags — what the leaderboard greys and `checks=passed` hides."""
    failed = {CORRECTNESS_CHECKS[row.metric] for row in _verdicts(summary, precision) if row.flagged}
    return [name for name in CORRECTNESS_CHECKS.values() if name in failed]


def prediction_flags(**kwargs: Any) -> list[dict[str, Any]]:
    """The document's `flags`: the flagged rows of `agreement` (same arguments)."""
    return [row.as_flag() for row in agreement(**kwargs) if row.flagged]
