"""Reproduce an upload: the lab re-runs an uploaded configuration on a pool and sets what its own
worker measured beside what the upload stated.

An upload is never verified: the lab did not run it. Its job spec (`workload`, `strategy`, kept
with the run) is queued again as a lab run, traced so its communication is measured, and linked
to the upload (`Run.reproduces_id`). Both pages then show the figures side by side, and the upload
is "reproduced within X %" when every figure both sides carry agrees within `TOLERANCE`, else
"not reproduced", naming each figure that did not and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import Run
from backend.services import runs as run_service
from backend.services.errors import DomainError
from backend.services.ingest import UPLOAD_SOURCE
from backend.store import runs as store
from parallab.core.flags import FLAG_TOLERANCE
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.spec import JobSpec

TOLERANCE = FLAG_TOLERANCE
"""How far (relative, either way) a reproduced figure may be from the stated one: the 10 % the lab
holds every measurement to against its prediction (`parallab.core.flags`), one rule for both."""


class NotAnUpload(DomainError, ValueError):
    """Only an upload is reproduced: the lab's own runs are verified already (409)."""

    status_code = 409


@dataclass(frozen=True)
class Figure:
    """One figure of the upload beside the reproduction's."""

    key: str
    label: str
    unit: str
    stated: float | None
    measured: float | None

    @property
    def rel_diff(self) -> float | None:
        """(measured − stated) / stated; None without both (or a stated zero)."""
        if self.stated is None or self.measured is None or not self.stated:
            return None
        return (self.measured - self.stated) / abs(self.stated)

    @property
    def within(self) -> bool | None:
        return None if self.rel_diff is None else abs(self.rel_diff) <= TOLERANCE


def _comm_bytes(summary: dict[str, Any]) -> float | None:
    if "comm_bytes_per_step" in (summary.get("not_measured") or []):
        return None
    by_op = summary.get("comm_bytes_per_step") or {}
    return float(sum(by_op.values())) if by_op else None


FIGURES: tuple[tuple[str, str, str, Callable[[dict[str, Any]], float | None]], ...] = (
    ("tokens_per_s", "Throughput", "tokens/s", lambda s: s.get("tokens_per_s")),
    ("step_time", "Step time (median)", "s", lambda s: (s.get("step_time_s") or {}).get("median")),
    ("peak_memory", "Peak memory (max rank)", "bytes", lambda s: s.get("peak_allocated_bytes_max")),
    ("comm_bytes", "Communication per step (all ops)", "bytes", _comm_bytes),
)
"""What a reproduction is held to: throughput, step time, peak memory, communication bytes."""


@dataclass(frozen=True)
class Reproduction:
    """An upload and its newest reproduction, with the figures side by side and the verdict."""

    upload: Run
    run: Run | None
    figures: list[Figure]
    verdict: str
    reproduced: bool | None
    """True: every figure both carry within TOLERANCE; False: one is not, or the run failed; None: not yet."""

    def as_json(self) -> dict[str, Any]:
        return {
            "upload_id": self.upload.id,
            "reproduction_id": self.run.id if self.run else None,
            "status": self.run.status if self.run else None,
            "reproduced": self.reproduced,
            "verdict": self.verdict,
            "tolerance": TOLERANCE,
            "figures": [
                {"key": f.key, "label": f.label, "unit": f.unit, "stated": f.stated, "measured": f.measured, "rel_diff": f.rel_diff}
                for f in self.figures
            ],
        }


def _spec(upload: Run) -> JobSpec:
    """The upload's own job spec, traced (so the reproduction measures its communication)."""
    stored = upload.spec or {}
    name = f"reproduce {upload.name or upload.id}"[:200]
    try:
        return JobSpec.model_validate({"workload": stored.get("workload"), "strategy": stored.get("strategy"), "trace": True, "name": name})
    except ValidationError as exc:
        problems = [SpecProblem(tuple(e["loc"]), e["msg"]) for e in exc.errors(include_url=False, include_input=False)]
        raise SpecError(problems) from None


def reproduce(*, session: Session, settings: Settings, upload_id: str, source: str, user_id: int | None, local: bool) -> Run:
    """Queue the upload's job spec as a lab run linked to it (committed, then enqueued, like any
    submission). RunNotFound, NotAnUpload, SpecError (422: the lab cannot run that spec here),
    QuotaExceeded and QueueUnavailable as for a submission."""
    upload = run_service.get_run(session=session, run_id=upload_id)
    if upload.source != UPLOAD_SOURCE:
        raise NotAnUpload(f"run {upload.id} is the lab's own run, not an upload: there is nothing to reproduce")
    run = run_service.create_run(session=session, spec=_spec(upload), settings=settings, source=source, user_id=user_id, local=local)
    run.reproduces_id = upload.id
    session.commit()
    run_service.enqueue_stored(session=session, settings=settings, runs=[run])
    return run


def reproduction_of(*, session: Session, run: Run) -> Reproduction | None:
    """The reproduction `run` takes part in — as the upload (its newest reproduction) or as the
    reproduction itself; None for a lab run that reproduces nothing (and an upload never reproduced
    gives a Reproduction with no run)."""
    lab_run: Run | None
    if run.reproduces_id is not None:
        linked = store.get_run(session, run.reproduces_id)
        if linked is None:
            return None
        upload, lab_run = linked, run
    elif run.source == UPLOAD_SOURCE:
        upload, lab_run = run, store.latest_reproduction(session, run.id)
    else:
        return None
    ids = [upload.id, *([lab_run.id] if lab_run is not None else [])]
    docs = store.get_documents(session, ids, parts=())
    return judged(upload, lab_run, docs.get(upload.id), docs.get(lab_run.id) if lab_run else None)


def judged(upload: Run, run: Run | None, stated_doc: dict[str, Any] | None, measured_doc: dict[str, Any] | None) -> Reproduction:
    """The figures side by side and the verdict (see the module's docstring)."""
    stated = (stated_doc or {}).get("summary") or {}
    measured = (measured_doc or {}).get("summary") or {}
    figures = [
        Figure(key, label, unit, _num(get(stated)), _num(get(measured)) if measured_doc else None) for key, label, unit, get in FIGURES
    ]
    if run is None:
        return Reproduction(upload, None, figures, "not reproduced yet: the lab has not run it", None)
    if run.status in ("queued", "running"):
        return Reproduction(upload, run, figures, f"reproduction {run.status}", None)
    if run.status != "succeeded" or measured_doc is None:
        return Reproduction(upload, run, figures, f"not reproduced: the lab's run {run.status}", False)
    compared = [f for f in figures if f.within is not None]
    if not compared:
        return Reproduction(upload, run, figures, "not reproduced: no figure both runs carry", False)
    missed = [f for f in compared if not f.within]
    if missed:
        said = "; ".join(_missed(f) for f in missed)
        return Reproduction(upload, run, figures, f"not reproduced: {said} (tolerance ±{TOLERANCE:.0%})", False)
    worst = max(abs(f.rel_diff or 0.0) for f in compared)
    return Reproduction(upload, run, figures, f"reproduced within {math.ceil(worst * 1000) / 10:.1f} %", True)


def _missed(figure: Figure) -> str:
    return f"{figure.label.lower()} measured {figure.measured:,.4g} against {figure.stated:,.4g} stated ({(figure.rel_diff or 0.0):+.1%})"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
