"""A loss that is NaN or infinite ends the job, reported as data.

The rank that sees a non-finite loss raises `Diverged`; `workers.harness.main` writes its
`FailureRecord` to the run directory (`RunDir.failure`) and exits non-zero, torchrun stops the
other ranks, and the worker reads the record to fail the run with "loss diverged at step k" —
never by scraping the log. Two checks: each step on the rank that writes progress (stops a long
run early), and the combined curve on every rank after the measured window (a rank whose local
loss alone went bad is caught there).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from parallab.core.result import FailureRecord
from parallab.core.rundir import RunDir


class Diverged(RuntimeError):
    """The loss went non-finite; carries the record the worker reads."""

    def __init__(self, record: FailureRecord):
        super().__init__(record.message)
        self.record = record


def _label(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def check_loss(value: float | None, *, phase: str, step: int, rank: int) -> None:
    """Raise `Diverged` if this step's loss (`step` counted from 1, warm-up included) is not finite."""
    if value is not None and not math.isfinite(value):
        raise Diverged(FailureRecord(kind="diverged", phase=phase, step=step, rank=rank, value=_label(value)))


def check_curve(losses: Sequence[float], *, first_step: int, rank: int, phase: str = "train") -> None:
    """Raise `Diverged` at the first non-finite value of a loss curve whose first value is step `first_step`."""
    for i, value in enumerate(losses):
        check_loss(value, phase=phase, step=first_step + i, rank=rank)


def write_failure(run_dir: RunDir, record: FailureRecord) -> None:
    """Write the record once: the first rank to report wins (several may see the same curve)."""
    if run_dir.failure.exists():
        return
    tmp = run_dir.failure.with_name(f".{run_dir.failure.name}.{os.getpid()}.tmp")
    tmp.write_text(record.model_dump_json())
    try:
        os.link(tmp, run_dir.failure)  # atomic, and fails if another rank got there first
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
