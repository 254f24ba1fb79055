"""What is wrong with a job spec, and where: the error every front end (API, form, CLI) shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class SpecProblem:
    """One rule a spec breaks: `loc` names the field (e.g. ("workload", "num_heads")), `msg` says why."""

    loc: Loc
    msg: str
    predictable: bool = False
    """A rule of parallab's ranks, not of the layout: the planner models what it refuses, so a
    predicted-only job (`resolve_job(..., predict_only=True)`) passes it."""

    def as_detail(self) -> dict[str, Any]:
        """FastAPI's 422 detail item (`loc` starts at the request body)."""
        return {"loc": ["body", *self.loc], "msg": self.msg, "type": "value_error"}

    def __str__(self) -> str:
        return f"{'.'.join(map(str, self.loc))}: {self.msg}"


class SpecError(ValueError):
    """A spec that cannot run; `problems` says where and why."""

    def __init__(self, problems: list[SpecProblem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


class RecipeError(ValueError):
    """A run recipe the planner does not count (`parallab.core.run_recipe`): `field` names the
    recipe's field (each front end says it its own way: a CLI flag, a query parameter), `problem` why."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def divides(loc: Loc, value: int, by: int, what: str) -> list[SpecProblem]:
    """[] when `by` divides `value`; else the problem, naming `loc`."""
    if by and value % by:
        return [SpecProblem(loc, f"{what} ({value}) is not divisible by {by}")]
    return []
