"""A CI series' history: one metric over its results, the threshold band each was judged against, alerts marked.

Pure: a list of points in, a figure out. Each point is one result, oldest first:
`{"label", "value", "lower", "upper", "verdict", "dismissed", "run_id", "commit", "branch"}` —
`lower`/`upper` are the band of that result's verdict (None where it had no baseline).
Change points (`{"run_id", "commit", "size_pct"}`, the first result after each) are drawn as a
dashed line before that result, labelled with its commit and the size of the shift. The change
points of the metric normalised by the host's speed are drawn beside them as dotted lines in their
own colour, labelled at the foot of the plot, so a shift of the host (a raw line with no dotted
one) reads apart from a shift of the code (both); the label of whichever the verdict reads says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.figures import palette
from backend.figures.common import Figure, empty, figure

VERDICT_STYLE = {
    "regressed": {"color": palette.VERDICT["regressed"], "symbol": "x", "size": 13},
    "improved": {"color": palette.VERDICT["improved"], "symbol": "triangle-up", "size": 11},
}


def history(
    points: Sequence[dict[str, Any]],
    *,
    title: str,
    unit: str,
    higher_is_better: bool,
    changes: Sequence[dict[str, Any]] = (),
    normalised_changes: Sequence[dict[str, Any]] = (),
    judged_on: str | None = None,
) -> Figure:
    """The metric over the series' results, with the band, the alerts (✕ regressed; hollow when
    dismissed), the change points, and those of the metric normalised by the host's speed
    (`judged_on`: which of the two the series' verdict reads; None where nothing was normalised)."""
    if not points:
        return empty(title, "no results on this series yet")
    xs = list(range(1, len(points) + 1))
    fig = figure(f"{title} ({'higher' if higher_is_better else 'lower'} is better)", x="result (commit)", y=f"{title} [{unit}]", height=340)
    banded = [(x, p) for x, p in zip(xs, points, strict=True) if p.get("lower") is not None and p.get("upper") is not None]
    if banded:
        fig.add_scatter(
            name="threshold band",
            x=[x for x, _ in banded] + [x for x, _ in reversed(banded)],
            y=[p["upper"] for _, p in banded] + [p["lower"] for _, p in reversed(banded)],
            fill="toself",
            fillcolor=palette.BAND_FILL,
            line={"width": 0},
            hoverinfo="skip",
            mode="lines",
        )
    fig.add_scatter(
        name=title,
        x=xs,
        y=[p["value"] for p in points],
        mode="lines+markers",
        line={"color": palette.SERIES["metric"]},
        customdata=[[p.get("commit") or "—", p.get("branch") or "—", p.get("verdict") or "—"] for p in points],
        hovertemplate="%{customdata[0]} on %{customdata[1]}: %{y:,.4g} — %{customdata[2]}<extra></extra>",
    )
    for verdict, style in VERDICT_STYLE.items():
        marked = [(x, p) for x, p in zip(xs, points, strict=True) if p.get("verdict") == verdict]
        if not marked:
            continue
        dismissed = [bool(p.get("dismissed")) for _, p in marked]
        fig.add_scatter(
            name="alert" if verdict == "regressed" else verdict,
            x=[x for x, _ in marked],
            y=[p["value"] for _, p in marked],
            mode="markers",
            marker={
                "color": style["color"],
                "size": style["size"],
                "symbol": [f"{style['symbol']}-open" if d else style["symbol"] for d in dismissed],
                "line": {"width": 2, "color": style["color"]},
            },
            customdata=[["dismissed" if d else verdict] for d in dismissed],
            hovertemplate="%{customdata[0]}<extra></extra>",
        )
    position = {p.get("run_id"): x for x, p in zip(xs, points, strict=True)}
    mark = {"raw": "", "normalised": ""} | ({judged_on: " — the verdict's"} if judged_on else {})
    for change in changes:
        x = position.get(change["run_id"])
        if x is None:
            continue
        fig.add_vline(
            x=x - 0.5,
            line={"color": palette.VERDICT["regressed"], "dash": "dash", "width": 1.5},
            label=f"change at {(change.get('commit') or '?')[:8]} ({change['size_pct']:+.0f}%){mark['raw']}",
        )
    for change in normalised_changes:
        x = position.get(change["run_id"])
        if x is None:
            continue
        fig.add_vline(x=x - 0.5, line={"color": palette.SERIES["normalised"], "dash": "dot", "width": 1.5})
        fig.add_annotation(
            x=x - 0.5,
            y=0,
            xref="x",
            yref="y domain",
            text=f"÷ host speed: change at {(change.get('commit') or '?')[:8]} ({change['size_pct']:+.0f}%){mark['normalised']}",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"color": palette.SERIES["normalised"]},
        )
    fig.update_xaxes(tickvals=xs, ticktext=[str(p.get("label") or x) for x, p in zip(xs, points, strict=True)], tickangle=-30)
    return fig
