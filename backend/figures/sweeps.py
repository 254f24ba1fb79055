"""Figures of a sweep: predicted against measured, with the ideal line. Pure: points in, figure out.

A point is a dict: `label`, `role` ("top" or "control"), `predicted`, `measured` (None until the
run has finished) and `status`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.figures import palette
from backend.figures.common import MIB, Figure, empty, figure

ROLE_COLOURS = palette.ROLES


def _scatter(title: str, points: Sequence[dict[str, Any]], *, unit: str, scale: float, note: str) -> Figure:
    done = [p for p in points if p.get("measured") is not None and p.get("predicted") is not None]
    if not done:
        return empty(title, "no finished run yet")
    fig = figure(title, x=f"predicted [{unit}]", y=f"measured [{unit}]", height=420)
    for role, colour in ROLE_COLOURS.items():
        mine = [p for p in done if p.get("role") == role]
        if not mine:
            continue
        fig.add_scatter(
            name="top predicted" if role == "top" else "controls (predicted poor)",
            x=[p["predicted"] / scale for p in mine],
            y=[p["measured"] / scale for p in mine],
            mode="markers",
            marker={"color": colour, "size": 10, "line": {"width": 1, "color": palette.INK}},
            text=[p["label"] for p in mine],
            hovertemplate="%{text}<br>predicted %{x:,.4g}<br>measured %{y:,.4g}<extra></extra>",
        )
    values = [p["predicted"] / scale for p in done] + [p["measured"] / scale for p in done]
    lo, hi = min(values) * 0.9, max(values) * 1.1
    fig.add_scatter(name="ideal (measured = predicted)", x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": palette.MUTED})
    if note:
        fig.add_annotation(
            text=note, showarrow=False, x=0, y=1.0, xref="paper", yref="paper", xanchor="left", yanchor="bottom", font={"size": 12}
        )
    return fig


def throughput(points: Sequence[dict[str, Any]], *, spearman: float | None) -> Figure:
    """Measured against predicted tokens/s of every finished run, the ideal line, and Spearman's ρ."""
    note = f"Spearman ρ = {spearman:.2f}" if spearman is not None else "Spearman ρ: needs 3 finished runs"
    return _scatter("Throughput: measured against predicted", points, unit="tokens/s", scale=1.0, note=note)


def memory(points: Sequence[dict[str, Any]]) -> Figure:
    """Measured peak memory per rank against the predicted (model state + activations)."""
    return _scatter("Memory per rank: measured peak against predicted", points, unit="MiB", scale=MIB, note="")


def sweep_figures(points: Sequence[dict[str, Any]], *, spearman: float | None) -> dict[str, Figure]:
    tps = [{**p, "predicted": p["predicted_tokens_per_s"], "measured": p["measured_tokens_per_s"]} for p in points]
    mem = [{**p, "predicted": p["predicted_memory_bytes"], "measured": p["measured_memory_bytes"]} for p in points]
    return {"throughput": throughput(tps, spearman=spearman), "memory": memory(mem)}
