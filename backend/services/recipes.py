"""The recipe dimensions of a run as its row stores them, and "vary one thing".

Filled at submission from the resolved job and again at ingest from the result's workload (so
CI uploads have them too); the leaderboard and the compare page filter and group by them.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from parallab.core.bounds import INT32_MAX
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.recipes import DIMENSIONS, micro_batch_size, recipe_of
from parallab.core.spec import JobSpec
from parallab.core.strategies import TRAINING_STRATEGIES

VARY_FIELDS: dict[str, str] = {
    "precision": "workload",
    "activation_checkpointing": "workload",
    "grad_accumulation_steps": "workload",
    "microbatches": "options",
    "strategy": "strategy",
    "world_size": "strategy",
}
"""What "vary one thing" may change, and where it lives in the spec: every recipe dimension (the
micro-batch as pp's micro-batch count), the strategy and the world size."""


def recipe_columns(workload: dict[str, Any], strategy: dict[str, Any]) -> dict[str, Any]:
    """The run row's recipe columns for a result's workload and strategy blocks (micro-batch size
    when the pair still resolves; a CI upload from another version may not)."""
    columns: dict[str, Any] = {
        "precision": str(workload.get("precision") or "fp32")[:8],
        "activation_checkpointing": str(workload.get("activation_checkpointing") or "none")[:16],
        "grad_accumulation_steps": _column_int(workload.get("grad_accumulation_steps", 1)),
        "micro_batch_size": None,
    }
    try:
        job = resolve_job(JobSpec.model_validate({"workload": workload, "strategy": strategy}))
    except (SpecError, ValidationError, TypeError, ValueError):
        return columns
    if job.trains:
        columns["micro_batch_size"] = micro_batch_size(job)
    return columns


def _column_int(value: Any) -> int | None:
    """An uploaded workload's integer as its INTEGER column holds it; anything else (a string, a
    float, beyond 32 bits) is left out of the column, the document keeps what was stated."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX:
        return value
    return None


def job_columns(job: ResolvedJob) -> dict[str, Any]:
    """The recipe columns of a resolved job (at submission)."""
    return recipe_of(job)


def vary(spec: dict[str, Any], field: str, value: str) -> dict[str, Any]:
    """`spec` with one dimension changed (a raw spec: resolution checks it like any other)."""
    if field not in VARY_FIELDS:
        raise SpecError([SpecProblem(("vary", "field"), f"cannot vary {field!r}; choose one of {', '.join(VARY_FIELDS)}")])
    raw = value.strip()
    if not raw:
        raise SpecError([SpecProblem(("vary", "value"), f"give a value for {field}")])
    out = copy.deepcopy(spec)
    out.pop("name", None)
    where = VARY_FIELDS[field]
    typed: Any = int(raw) if raw.isdigit() else raw
    if where == "workload":
        out.setdefault("workload", {})[field] = typed
    elif where == "options":
        out.setdefault("strategy", {}).setdefault("options", {})[field] = typed
    elif field == "strategy":
        # another strategy takes its own options: keep none of the old one's
        out["strategy"] = {**out.get("strategy", {}), "name": raw, "options": {}}
    else:
        out.setdefault("strategy", {})[field] = typed
    return out


def dimension_choices() -> dict[str, list[str]]:
    """What the "vary one thing" form offers for each field."""
    choices = {d.name: list(d.choices) for d in DIMENSIONS if d.workload_field}
    choices["microbatches"] = ["2", "4", "8", "16"]
    choices["strategy"] = list(TRAINING_STRATEGIES)
    choices["world_size"] = ["1", "2", "4", "8"]
    return choices
