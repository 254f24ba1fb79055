"""Throughput and scaling efficiency against world size, per strategy, with the ideal line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from backend.figures.common import PALETTE, empty, figure


def _by_strategy(points: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(points, key=lambda p: (p["strategy"], p["world_size"])):
        out.setdefault(p["strategy"], []).append(p)
    return out


def throughput(points: Sequence[dict[str, Any]]) -> go.Figure:
    """Best tokens/s per strategy at each world size; dotted: that strategy's ideal linear scaling."""
    if not points:
        return empty("Throughput against world size", "no finished runs for this workload")
    fig = figure("Throughput against world size", x="world size [ranks]", y="throughput [tokens/s]", height=400)
    for i, (strategy, pts) in enumerate(_by_strategy(points).items()):
        colour = PALETTE[i % len(PALETTE)]
        xs = [p["world_size"] for p in pts]
        fig.add_scatter(
            name=strategy,
            x=xs,
            y=[p["tokens_per_s"] for p in pts],
            mode="lines+markers",
            line={"color": colour},
            customdata=[[(p.get("efficiency") or 0) * 100] for p in pts],
            hovertemplate=strategy + " × %{x}: %{y:,.0f} tokens/s (%{customdata[0]:.0f}% of ideal)<extra></extra>",
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
    fig.add_scatter(name="ideal (linear)", x=[None], y=[None], mode="lines", line={"dash": "dot", "color": "#64748b"})
    fig.update_xaxes(type="log", dtick=0.30103, tickformat="d")
    return fig


def efficiency(points: Sequence[dict[str, Any]]) -> go.Figure:
    """Scaling efficiency = measured / ideal throughput, in percent."""
    if not points:
        return empty("Scaling efficiency", "no finished runs for this workload")
    fig = figure("Scaling efficiency", x="world size [ranks]", y="efficiency [% of ideal]", height=360)
    for i, (strategy, pts) in enumerate(_by_strategy(points).items()):
        fig.add_scatter(
            name=strategy,
            x=[p["world_size"] for p in pts],
            y=[(p.get("efficiency") or 0) * 100 for p in pts],
            mode="lines+markers",
            line={"color": PALETTE[i % len(PALETTE)]},
            hovertemplate=strategy + " × %{x}: %{y:.0f}%<extra></extra>",
        )
    fig.add_hline(y=100, line_dash="dot", line_color="#64748b")
    fig.update_xaxes(type="log", dtick=0.30103, tickformat="d")
    fig.update_yaxes(rangemode="tozero")
    return fig
