"""Throughput and scaling efficiency against world size, per strategy, with the ideal line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.figures import palette
from backend.figures.common import Figure, empty, figure


def _by_strategy(points: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(points, key=lambda p: (p["strategy"], p["world_size"])):
        out.setdefault(p["strategy"], []).append(p)
    return out


def throughput(points: Sequence[dict[str, Any]]) -> Figure:
    """Best tokens/s per strategy at each world size; dotted: that strategy's ideal linear scaling."""
    if not points:
        return empty("Throughput against world size", "no finished runs for this workload")
    fig = figure("Throughput against world size", x="world size [ranks]", y="throughput [tokens/s]", height=400)
    for strategy, pts in _by_strategy(points).items():
        colour = palette.strategy_colour(strategy)
        xs = [p["world_size"] for p in pts]
        fig.add_scatter(
            name=strategy,
            x=xs,
            y=[p["tokens_per_s"] for p in pts],
            mode="lines+markers",
            line={"color": colour},
            customdata=[["baseline" if p.get("efficiency") is None else f"{p['efficiency'] * 100:.0f}% of ideal"] for p in pts],
            hovertemplate=strategy + " × %{x}: %{y:,.0f} tokens/s (%{customdata[0]})<extra></extra>",
        )
        fig.add_scatter(
            name=f"{strategy} ideal",
            x=xs,
            y=[p["ideal_tokens_per_s"] for p in pts],
            mode="lines",
            line={"color": colour, "dash": "dot", "width": 1},
            showlegend=False,
            hoverinfo="skip",
        )
    fig.add_scatter(name="ideal (linear)", x=[None], y=[None], mode="lines", line={"dash": "dot", "color": palette.MUTED})
    world_axis(fig, points)
    return fig


def world_axis(fig: Figure, points: Sequence[dict[str, Any]]) -> None:
    """A log axis ticked at exactly the world sizes measured (plotly's own log ticks at dtick
    log10(2) add fractions below 1 that format as '0')."""
    sizes = sorted({p["world_size"] for p in points})
    fig.update_xaxes(type="log", tickmode="array", tickvals=sizes, ticktext=[str(n) for n in sizes])


def efficiency(points: Sequence[dict[str, Any]]) -> Figure:
    """Scaling efficiency = measured / ideal throughput, in percent."""
    if not points:
        return empty("Scaling efficiency", "no finished runs for this workload")
    scaled = [p for p in points if p.get("efficiency") is not None]
    if not scaled:
        return empty("Scaling efficiency", "one world size per strategy: nothing to scale against yet")
    fig = figure("Scaling efficiency", x="world size [ranks]", y="efficiency [% of ideal]", height=360)
    for strategy, pts in _by_strategy(points).items():
        pts = [p for p in pts if p.get("efficiency") is not None]
        if not pts:
            continue
        fig.add_scatter(
            name=strategy,
            x=[p["world_size"] for p in pts],
            y=[p["efficiency"] * 100 for p in pts],
            mode="lines+markers",
            line={"color": palette.strategy_colour(strategy)},
            hovertemplate=strategy + " × %{x}: %{y:.0f}%<extra></extra>",
        )
    fig.add_hline(y=100, line_dash="dot", line_color=palette.MUTED)
    world_axis(fig, points)
    fig.update_yaxes(rangemode="tozero")
    return fig
