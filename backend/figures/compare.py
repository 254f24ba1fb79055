"""Figures that put several runs side by side. Input: (label, result document) pairs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from backend.figures.common import MEMORY_COLOURS, MIB, PALETTE, TIME_COLOURS, empty, figure, memory_parts, step_parts, subplots

Labelled = Sequence[tuple[str, dict[str, Any]]]


def throughput(runs: Labelled) -> go.Figure:
    """Tokens/s as bars, MFU (where the device's peak is known) as markers on a second axis."""
    if not runs:
        return empty("Throughput", "no finished runs")
    labels = [label for label, _ in runs]
    summaries = [doc.get("summary") or {} for _, doc in runs]
    fig = subplots("Throughput and MFU", height=360, specs=[[{"secondary_y": True}]])
    fig.add_bar(
        name="tokens/s",
        x=labels,
        y=[s.get("tokens_per_s") for s in summaries],
        marker_color=PALETTE[0],
        hovertemplate="%{x}: %{y:,.0f} tokens/s<extra></extra>",
        secondary_y=False,
    )
    mfu = [s["mfu"] * 100 if s.get("mfu") is not None else None for s in summaries]
    if any(v is not None for v in mfu):
        fig.add_scatter(
            name="MFU",
            x=labels,
            y=mfu,
            mode="markers",
            marker={"size": 14, "symbol": "diamond", "color": PALETTE[1]},
            hovertemplate="%{x}: MFU %{y:.1f}%<extra></extra>",
            secondary_y=True,
        )
    fig.update_yaxes(title_text="throughput [tokens/s]", secondary_y=False)
    fig.update_yaxes(title_text="MFU [%]", secondary_y=True, rangemode="tozero", showgrid=False)
    fig.update_xaxes(title_text="run")
    return fig


def memory(runs: Labelled) -> go.Figure:
    """Every run's per-rank peak memory, stacked (params, grads, optimizer, other)."""
    if not runs:
        return empty("Memory per rank", "no finished runs")
    fig = figure("Memory per rank (peak)", x="run / rank", y="memory [MiB]")
    xs: list[list[str]] = [[], []]
    parts: list[dict[str, float]] = []
    for label, doc in runs:
        for r in doc.get("ranks") or []:
            xs[0].append(label)
            xs[1].append(f"r{r['rank']}")
            parts.append(memory_parts(r))
    for key, colour in MEMORY_COLOURS.items():
        fig.add_bar(name=key, x=xs, y=[p[key] for p in parts], marker_color=colour, hovertemplate="%{y:.2f} MiB " + key + "<extra></extra>")
    fig.update_layout(barmode="stack")
    return fig


def comm(runs: Labelled) -> go.Figure:
    """Communication volume and time per step by op (largest rank), one bar per run."""
    ops = sorted({c["op"] for _, d in runs for r in d.get("ranks") or [] for c in r.get("comm") or []})
    if not ops:
        return empty("Communication by op", "none of these runs communicated")
    fig = subplots("Communication by op", rows=1, cols=2, subplot_titles=("volume per step", "time per step"), horizontal_spacing=0.1)
    for i, (label, doc) in enumerate(runs):
        by_op: dict[str, tuple[float, float]] = {}
        for r in doc.get("ranks") or []:
            for c in r.get("comm") or []:
                b, t = by_op.get(c["op"], (0.0, 0.0))
                by_op[c["op"]] = (max(b, c.get("bytes") or 0), max(t, c.get("time_s") or 0.0))
        colour = PALETTE[i % len(PALETTE)]
        fig.add_bar(
            name=label,
            legendgroup=label,
            x=ops,
            y=[by_op.get(o, (0, 0))[0] / MIB for o in ops],
            marker_color=colour,
            row=1,
            col=1,
            hovertemplate="%{x}: %{y:.3f} MiB<extra>" + "%{fullData.name}</extra>",
        )
        fig.add_bar(
            name=label,
            legendgroup=label,
            x=ops,
            y=[by_op.get(o, (0, 0))[1] * 1e3 for o in ops],
            marker_color=colour,
            row=1,
            col=2,
            showlegend=False,
            hovertemplate="%{x}: %{y:.3f} ms<extra>%{fullData.name}</extra>",
        )
    fig.update_yaxes(title_text="MiB per step (max rank)", row=1, col=1)
    fig.update_yaxes(title_text="ms per step (max rank)", row=1, col=2)
    fig.update_xaxes(title_text="op")
    fig.update_layout(barmode="group", height=380)
    return fig


def step_breakdown(runs: Labelled) -> go.Figure:
    """Median step of each run split into compute, communication and bubble (slowest rank)."""
    if not runs:
        return empty("Step time breakdown", "no finished runs")
    fig = figure("Step time breakdown (slowest rank, median step)", x="time per step [ms]", y="run")
    rows = []
    for label, doc in runs:
        parts = [step_parts(r) for r in doc.get("ranks") or []]
        rows.append((label, max(parts, key=lambda p: sum(p.values())) if parts else {k: 0.0 for k in TIME_COLOURS}))
    for key, colour in TIME_COLOURS.items():
        fig.add_bar(
            name=key,
            orientation="h",
            y=[label for label, _ in rows],
            x=[p[key] * 1e3 for _, p in rows],
            marker_color=colour,
            hovertemplate="%{y}: %{x:.2f} ms " + key + "<extra></extra>",
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    return fig


def loss(runs: Labelled) -> go.Figure:
    """Loss curves overlaid (and the reference, once)."""
    if not any((d.get("loss") or {}).get("values") for _, d in runs):
        return empty("Loss", "no loss recorded")
    fig = figure("Loss overlay", x="measured step", y="loss")
    reference = None
    for label, doc in runs:
        values = (doc.get("loss") or {}).get("values") or []
        fig.add_scatter(name=label, x=list(range(1, len(values) + 1)), y=values, mode="lines")
        reference = reference or (doc.get("loss") or {}).get("reference")
    if reference:
        fig.add_scatter(
            name="reference (single)",
            x=list(range(1, len(reference) + 1)),
            y=reference,
            mode="lines",
            line={"dash": "dash", "color": "#111827"},
        )
    return fig


def compare_figures(runs: Labelled) -> dict[str, go.Figure]:
    return {
        "throughput": throughput(runs),
        "memory": memory(runs),
        "comm": comm(runs),
        "steps": step_breakdown(runs),
        "loss": loss(runs),
    }
