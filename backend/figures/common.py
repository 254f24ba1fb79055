"""Shared look of every figure: one template, units on axes, a quiet palette."""

from __future__ import annotations

import statistics
from typing import Any

import plotly.graph_objects as go

from backend.figures import palette

MIB = 1024**2  # parallab.core.units.MIB: memory axes are in MiB
PALETTE = palette.RUNS
"""The categorical colourway: runs (see backend.figures.palette for every colour's meaning)."""
MEMORY_COLOURS = {k: palette.MEMORY[k] for k in ("params", "grads", "optimizer", "other")}
TIME_COLOURS = {"compute": palette.TIME["compute"], "communication": palette.TIME["communication"], "bubble": palette.TIME["idle / bubble"]}
MEMORY_SPLIT_COLOURS = dict(palette.MEMORY)
"""The MemTracker split of a rank's peak (`memory_breakdown`), in stacking order."""
SPLIT_COLOURS = {k: palette.TIME[k] for k in ("compute", "overlapped comm", "exposed comm", "idle / bubble")}
"""The step-time split (`step_time_breakdown`), in stacking order; overlapped comm is drawn hatched."""


# A small template of our own: plotly's built-in ones are large and slow to copy into every figure.
TEMPLATE = go.layout.Template(
    layout={
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "colorway": PALETTE,
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1f2937"},
        "xaxis": {"gridcolor": "#eef2f7", "linecolor": "#cbd5e1", "zerolinecolor": "#cbd5e1", "ticks": "outside", "tickcolor": "#cbd5e1"},
        "yaxis": {"gridcolor": "#eef2f7", "linecolor": "#cbd5e1", "zerolinecolor": "#cbd5e1"},
        "hoverlabel": {"bgcolor": "#ffffff", "font": {"size": 12}},
        "bargap": 0.25,
    }
)


def house_layout(title: str, *, height: int = 360, **extra: Any) -> dict[str, Any]:
    """The layout every figure shares (title left, legend on top)."""
    return {
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        "template": TEMPLATE,
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 40},
        # Below the plot, growing downwards: a wrapped legend never covers the title or subplot titles
        # (plotly.js widens the bottom margin for a legend outside the plot area).
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.3, "xanchor": "left", "x": 0},
        **extra,
    }


def figure(title: str, *, x: str, y: str, height: int = 360, **layout: Any) -> go.Figure:
    """An empty figure with the house layout and both axes titled (units in brackets)."""
    fig = go.Figure(layout=house_layout(title, height=height, **layout))
    fig.update_xaxes(title_text=x, automargin=True)
    fig.update_yaxes(title_text=y, automargin=True)
    return fig


def subplots(title: str, *, height: int = 380, **kwargs: Any) -> go.Figure:
    """make_subplots with the house layout."""
    from plotly.subplots import make_subplots

    fig = make_subplots(figure=go.Figure(layout=house_layout(title, height=height)), **kwargs)
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def empty(title: str, message: str) -> go.Figure:
    """A figure that says why there is nothing to draw."""
    fig = figure(title, x="", y="", height=220)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 13, "color": "#64748b"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def step_parts(rank: dict[str, Any]) -> dict[str, float]:
    """A rank's median step split into compute, communication and bubble (seconds)."""
    step = statistics.median(rank.get("step_times_s") or [0.0])
    comm = sum(c.get("time_s") or 0.0 for c in rank.get("comm") or [])
    bubble = min((rank.get("bubble_fraction") or 0.0) * step, step)
    # A pipeline's bubble is measured as the time its stage waits in receives, which the comm total
    # already holds: carve it out rather than count it twice.
    comm = min(max(comm - bubble, 0.0), step - bubble)
    return {"compute": max(step - comm - bubble, 0.0), "communication": comm, "bubble": bubble}


def memory_parts(rank: dict[str, Any]) -> dict[str, float]:
    """A rank's peak memory split into params, grads, optimizer state and the rest (MiB)."""
    state = rank.get("model_state_bytes") or {}
    parts = {k: (state.get(k) or 0) / MIB for k in ("params", "grads", "optimizer")}
    peak = rank.get("peak_allocated_bytes")
    parts["other"] = max((peak or 0) / MIB - sum(parts.values()), 0.0) if peak else 0.0
    return parts


def step_split(rank: dict[str, Any]) -> dict[str, float] | None:
    """A rank's `step_time_breakdown` as four parts that sum to its step time (seconds), or None.

    Overlapped communication runs under compute, so it is carved out of the compute bar (and drawn
    hatched) rather than added on top: compute + exposed comm + idle = step. A breakdown whose four
    fields already sum to the step (compute without the overlapped part) is taken as it is.
    """
    b = rank.get("step_time_breakdown")
    if not b:
        return None
    compute, exposed, overlapped = b.get("compute_s") or 0.0, b.get("exposed_comm_s") or 0.0, b.get("overlapped_comm_s") or 0.0
    idle, step = b.get("idle_s") or 0.0, b.get("step_s") or 0.0
    four_parts = abs(compute + exposed + overlapped + idle - step) <= 1e-6 * max(step, 1e-12)
    only_compute = compute if four_parts else max(compute - overlapped, 0.0)
    return {"compute": only_compute, "overlapped comm": overlapped, "exposed comm": exposed, "idle / bubble": idle}


def memory_split(rank: dict[str, Any]) -> dict[str, float] | None:
    """A rank's `memory_breakdown` at its peak in MiB, every part present (0 where missing), or None."""
    split = rank.get("memory_breakdown")
    if not split:
        return None
    return {key: (split.get(key) or 0) / MIB for key in MEMORY_SPLIT_COLOURS}


def predicted_memory(prediction: dict[str, Any]) -> dict[str, float] | None:
    """The predicted components of the busiest rank in MiB: model state parts and activations."""
    state = prediction.get("model_state_bytes_per_rank")
    if not state:
        return None
    parts = {key: (state.get(key) or 0) / MIB for key in ("params", "grads", "optimizer")}
    parts["activations"] = (prediction.get("activation_bytes_per_rank") or 0) / MIB
    return parts
