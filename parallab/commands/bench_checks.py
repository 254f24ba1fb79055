"""What `parallab bench` says of a result's checks and flags, and how it exits.

A terminal that prints a throughput and "loss diff vs single 8.58e-08" after a failed gradient
check shows a pass. So every failed correctness check (the gradient check, the replica check, the
loss against the fp32 reference — by the rule the leaderboard greys a run with,
`parallab.core.flags.failed_checks`) is printed in a block of its own with its worst error and its
tolerance, every prediction flag (a measured figure more than 10% from its prediction) below it,
and the command exits `EXIT_FAILED_CHECK` when a check failed, unless `--allow-failed-checks`. A
flag alone is printed and does not change the exit status: it says the prediction is off, not that
the run computed the wrong thing.
"""

from __future__ import annotations

from typing import Any

from parallab.core.flags import CORRECTNESS_CHECKS, failed_checks
from parallab.core.recipes import loss_tolerance
from parallab.core.result import ResultDocument

EXIT_FAILED_CHECK = 3
"""`parallab bench`'s exit status when a correctness check failed (1: the run failed; 2: bad input)."""

EXIT_CODES_HELP = (
    "Exit status: 0 the run succeeded and its checks passed (prediction flags are printed, not failed on); "
    f"1 the run failed; 2 bad input; {EXIT_FAILED_CHECK} a correctness check failed (gradient, replica, "
    "loss vs the fp32 reference; --allow-failed-checks exits 0)."
)


def _gradient(summary: Any) -> str:
    check = summary.gradient_check
    where = f" ({check.worst_param})" if check.worst_param else ""
    return f"gradient check: worst relative error {check.max_rel_err:.3g}{where} > tolerance {check.tolerance:.3g}"


def _replica(summary: Any) -> str:
    check = summary.replica_check
    ranks = ", ".join(map(str, check.worst_ranks))
    where = f" ({check.worst_param} on ranks {ranks})" if check.worst_param else ""
    return f"replica check: copies that should be identical differ by {check.max_rel_diff:.3g}{where} > tolerance {check.tolerance:.3g}"


def _loss(summary: Any, precision: str) -> str:
    diff = summary.loss_max_rel_diff_vs_reference
    return f"loss vs the fp32 reference: worst relative difference {diff:.3g} > the {precision} tolerance {loss_tolerance(precision):.3g}"


def check_failures(document: ResultDocument, precision: str) -> list[str]:
    """One line per failed correctness check, in the leaderboard's order (loss, gradient, replica)."""
    summary = document.summary
    failed = failed_checks(summary.model_dump(mode="json"), precision)
    lines = {"loss": lambda: _loss(summary, precision), "gradient": lambda: _gradient(summary), "replica": lambda: _replica(summary)}
    return [lines[name]() for name in failed]


def prediction_flags(document: ResultDocument) -> list[str]:
    """One line per stored flag that is a prediction gap (the checks' own rows are above)."""
    return [
        f"{flag.metric}: measured {flag.measured:,.4g}, predicted {flag.predicted:,.4g} ({flag.rel_gap:.0%} apart)"
        for flag in document.flags
        if flag.metric not in CORRECTNESS_CHECKS
    ]


def report(document: ResultDocument, precision: str) -> tuple[list[str], bool]:
    """(lines to print, whether a check failed): the failed checks' block, then the flags' block."""
    failures, flags = check_failures(document, precision), prediction_flags(document)
    lines: list[str] = []
    if failures:
        lines.append(f"FAILED: {len(failures)} correctness check(s) — this run's numbers are not to be trusted:")
        lines += [f"  ✗ {line}" for line in failures]
    if flags:
        lines.append(f"Flagged: {len(flags)} measured figure(s) more than 10% from the prediction:")
        lines += [f"  ⚑ {line}" for line in flags]
    return lines, bool(failures)
