"""REST: CI benchmark series with their regression verdicts; configure a series, dismiss an alert,
accept an intended exact change, read the CI report."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import ConfigDict, Field

from backend.api.deps import RowId, SeriesEditorDep, SessionDep
from backend.api.queries import SeriesListParams
from backend.services import ci_report, exact_gates
from backend.services import series as series_service
from parallab.core.options import KnownKeys

router = APIRouter(prefix="/series", tags=["series"])
BASIS_HELP = (
    "What the timing verdict reads: raw, normalised by the host's speed, or auto (normalised where every job compared carries the probe)."
)


class SeriesConfigUpdate(KnownKeys):
    """How a series judges its next results; fields left out stay as they are."""

    model_config = ConfigDict(extra="forbid")
    unknown_key_kind = "series setting"

    test: Literal["t_test", "mad"] | None = None
    window: int | None = Field(None, ge=2, le=1000, description="K: the latest K baseline results form the baseline.")
    baseline_branch: str | None = Field(None, min_length=1, max_length=200)
    alpha: float | None = Field(None, gt=0, lt=0.5, description="t_test: one-sided significance level.")
    mad_k: float | None = Field(None, gt=0, le=100, description="mad: the band is median ± k·MAD.")
    min_change: float | None = Field(None, ge=0, lt=1, description="Relative changes below this are never flagged.")


class Dismissal(KnownKeys):
    model_config = ConfigDict(extra="forbid")

    note: str | None = Field(None, max_length=500, description="Why this alert is a false positive.")


class Acceptance(KnownKeys):
    model_config = ConfigDict(extra="forbid")

    metric: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Required: a counter (e.g. comm.all_reduce.g2.bytes) or a category (bytes, calls, memory, params, pipeline). "
        "Checked after the caller's right to change the series, so a stranger learns nothing from a 422.",
    )


@router.get("")
def list_series(session: SessionDep, _: Annotated[SeriesListParams, Query()]) -> dict[str, Any]:
    """Every series, latest result first, with how many results and open alerts each has (it takes no parameters)."""
    rows = series_service.list_series(session=session)
    return {"items": [{**series_service.series_dict(r["series"]), "results": r["results"], "open_alerts": r["open_alerts"]} for r in rows]}


@router.get("/{series_id}")
def read_series(series_id: str, session: SessionDep) -> dict[str, Any]:
    """A series, its baseline series, and every result on it with its verdicts (oldest first)."""
    return series_service.view_dict(series_service.series_view(session=session, series_id=series_id))


@router.patch("/{series_id}")
def configure_series(series_id: str, update: SeriesConfigUpdate, session: SessionDep, principal: SeriesEditorDep) -> dict[str, Any]:
    """Change the test, the window K, the baseline branch or the thresholds for the series' next
    results (its owner, whose upload started it, or an admin: 403 for anyone else)."""
    series = series_service.configure(
        session=session, series_id=series_id, changes=update.model_dump(exclude_none=True), principal=principal
    )
    session.commit()
    return series_service.series_dict(series)


@router.post("/{series_id}/alerts/{verdict_id}/dismiss")
def dismiss_alert(series_id: str, verdict_id: RowId, body: Dismissal, session: SessionDep, principal: SeriesEditorDep) -> dict[str, Any]:
    """Mark an alert a false positive; the dismissal is kept (and the alert no longer fails `--fail-on-regression` replays)."""
    verdict = series_service.dismiss_alert(session=session, series_id=series_id, verdict_id=verdict_id, principal=principal, note=body.note)
    session.commit()
    return series_service.verdict_dict(verdict)


@router.get("/{series_id}/report")
def read_report(
    series_id: str,
    session: SessionDep,
    basis: Annotated[
        ci_report.Basis,
        Query(description=BASIS_HELP),
    ] = "auto",
) -> dict[str, Any]:
    """The CI report: the latest result's exact changes, each timing metric's change points with
    intervals and bisect ranges, its between-job CV and minimum detectable change, which basis
    (raw or normalised) its verdict read, and `changed`."""
    return ci_report.series_report(session=session, series_id=series_id, basis=basis)


@router.post("/{series_id}/accept")
def accept_change(series_id: str, body: Acceptance, session: SessionDep, principal: SeriesEditorDep) -> dict[str, Any]:
    """Accept the change of a counter (or of every counter of a category) that the series' latest
    result reports as intended, for the series' family: results with that value are no longer
    reported as changed (its owner or an admin; 422 naming what changed when `metric` did not)."""
    accepted = exact_gates.accept(session=session, series_id=series_id, metric=body.metric, principal=principal)
    session.commit()
    return {"series_id": series_id, "accepted": accepted}
