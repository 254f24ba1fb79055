"""The live run page's chart: loss, tokens/s and memory of each progress line while a run runs.

Pure: the progress view's `history` (see workers.launcher.ProgressTail) in, a figure out. The x
axis is seconds since the first line, so phases that restart their step count (the reference,
warm-up, the timed steps) follow one another instead of drawing over each other.
"""

from __future__ import annotations

from typing import Any

from backend.figures.common import Figure, subplots
from backend.figures.palette import LIVE_COLOURS
from parallab.core.units import MIB

PHASE_NAMES = {
    "warmup": "warm-up",
    "train": "timed steps",
    "profile": "profiled window",
    "reference": "reference",
    "gradcheck": "gradient check",
    "storing": "storing",
}
"""What each progress phase is called on the page, in the order a run passes them (the gradient
check's own step comes first, before warm-up; its comparison with the reference after it)."""


def live_figure(history: list[dict[str, Any]]) -> Figure:
    """Loss and tokens/s (top, two y axes) and this rank's memory (bottom) against elapsed time."""
    fig = subplots(
        "Live: loss, throughput and memory",
        height=420,
        rows=2,
        cols=1,
        shared_xaxes=True,
        specs=[[{"secondary_y": True}], [{}]],
        row_heights=[0.65, 0.35],
        vertical_spacing=0.08,
    )
    t0 = next((p["t"] for p in history if p.get("t") is not None), 0.0)
    xs = [round((p.get("t") or t0) - t0, 2) for p in history]
    labels = [f"{PHASE_NAMES.get(p.get('phase') or '', p.get('phase'))} step {p.get('step')}" for p in history]
    hover = "%{text}<br>%{x:.1f} s: %{y:,.4g} "
    fig.add_scatter(
        name="loss",
        x=xs,
        y=[p.get("loss") for p in history],
        text=labels,
        mode="lines+markers",
        line={"color": LIVE_COLOURS["loss"]},
        hovertemplate=hover + "loss<extra></extra>",
        row=1,
        col=1,
    )
    fig.add_scatter(
        name="tokens/s",
        x=xs,
        y=[p.get("tokens_per_s") for p in history],
        text=labels,
        mode="lines",
        line={"color": LIVE_COLOURS["tokens/s"], "dash": "dot"},
        hovertemplate=hover + "tokens/s<extra></extra>",
        row=1,
        col=1,
        secondary_y=True,
    )
    mem = [None if p.get("memory_bytes") is None else p["memory_bytes"] / MIB for p in history]
    fig.add_scatter(
        name="memory (MiB)",
        x=xs,
        y=mem,
        text=labels,
        mode="lines",
        fill="tozeroy",
        line={"color": LIVE_COLOURS["memory"]},
        hovertemplate=hover + "MiB<extra></extra>",
        row=2,
        col=1,
    )
    fig.update_yaxes(title_text="loss", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="tokens/s", row=1, col=1, secondary_y=True, showgrid=False)
    fig.update_yaxes(title_text="memory (MiB): GPU allocated, CPU process RSS", row=2, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="seconds since the first step", row=2, col=1)
    return fig
