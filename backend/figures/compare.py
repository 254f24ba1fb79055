"""Figures that put several runs side by side. Input: (label, result document) pairs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.figures import memory as memory_timelines
from backend.figures import palette
from backend.figures.common import (
    MEMORY_COLOURS,
    MEMORY_SPLIT_COLOURS,
    MIB,
    SPLIT_COLOURS,
    TIME_COLOURS,
    Figure,
    empty,
    figure,
    memory_parts,
    memory_split,
    step_parts,
    step_split,
    subplots,
)

Labelled = Sequence[tuple[str, dict[str, Any]]]


def throughput(runs: Labelled) -> Figure:
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
        marker_color=[palette.run_colour(i) for i in range(len(labels))],
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
            marker={"size": 14, "symbol": "diamond", "color": palette.INK},
            hovertemplate="%{x}: MFU %{y:.1f}%<extra></extra>",
            secondary_y=True,
        )
    fig.update_yaxes(title_text="throughput [tokens/s]", secondary_y=False)
    fig.update_yaxes(title_text="MFU [%]", secondary_y=True, rangemode="tozero", showgrid=False)
    fig.update_xaxes(title_text="run")
    return fig


def memory(runs: Labelled) -> Figure:
    """Every run's per-rank peak memory, stacked: the MemTracker split (params, grads, optimizer,
    activations, temporaries, other) where the run has it, else model state and the rest."""
    if not runs:
        return empty("Memory per rank", "no finished runs")
    fig = figure("Memory per rank (peak)", x="run / rank", y="memory [MiB]")
    xs: list[list[str]] = [[], []]
    parts: list[dict[str, float]] = []
    for label, doc in runs:
        for r in doc.get("ranks") or []:
            xs[0].append(label)
            xs[1].append(f"r{r['rank']}")
            parts.append(memory_split(r) or memory_parts(r))
    colours = {**MEMORY_SPLIT_COLOURS, **MEMORY_COLOURS}
    for key, colour in colours.items():
        if not any(key in p for p in parts):
            continue
        fig.add_bar(
            name=key, x=xs, y=[p.get(key, 0.0) for p in parts], marker_color=colour, hovertemplate="%{y:.2f} MiB " + key + "<extra></extra>"
        )
    fig.update_layout(barmode="stack")
    return fig


def comm(runs: Labelled) -> Figure:
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
        colour = palette.run_colour(i)
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


def step_breakdown(runs: Labelled) -> Figure:
    """Each run's slowest rank: its step split into compute, overlapped and exposed communication
    and idle/bubble (`step_time_breakdown`), or — for runs that lack it — the median step split into
    compute, all communication and bubble."""
    if not runs:
        return empty("Step time breakdown", "no finished runs")
    fig = figure("Step time breakdown (slowest rank)", x="time per step [ms]", y="run")
    rows: list[tuple[str, dict[str, float]]] = []
    for label, doc in runs:
        parts = [step_split(r) or step_parts(r) for r in doc.get("ranks") or []]
        rows.append((label, max(parts, key=lambda p: sum(p.values())) if parts else {}))
    colours = {**SPLIT_COLOURS, **{k: v for k, v in TIME_COLOURS.items() if k != "compute"}}
    for key, colour in colours.items():
        values = [p.get(key) for _, p in rows]
        if all(v is None for v in values):
            continue
        marker: dict[str, Any] = {"color": colour}
        if key == "overlapped comm":
            marker["pattern"] = {"shape": "/", "fgcolor": SPLIT_COLOURS["compute"], "bgcolor": colour}
        name = {"communication": "communication (overlap not measured)", "bubble": "bubble"}.get(key, key)
        fig.add_bar(
            name=name,
            orientation="h",
            y=[label for label, _ in rows],
            x=[v * 1e3 if v is not None else None for v in values],
            marker=marker,
            hovertemplate="%{y}: %{x:.2f} ms " + name + "<extra></extra>",
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    return fig


def exposure(runs: Labelled) -> Figure:
    """Communication time against the part of it no compute overlaps, as fractions of the step."""
    summaries = [(label, doc.get("summary") or {}) for label, doc in runs]
    if not any(s.get("comm_time_fraction") is not None or s.get("exposed_comm_fraction") is not None for _, s in summaries):
        return empty("Exposed communication", "no communication measured")
    fig = figure("Communication: all of it and the exposed part", x="run", y="share of the step [%]")
    for key, name, colour in (
        ("comm_time_fraction", "communication (all)", TIME_COLOURS["communication"]),
        ("exposed_comm_fraction", "exposed (no compute overlaps it)", SPLIT_COLOURS["exposed comm"]),
    ):
        fig.add_bar(
            name=name,
            x=[label for label, _ in summaries],
            y=[s[key] * 100 if s.get(key) is not None else None for _, s in summaries],
            marker_color=colour,
            hovertemplate="%{x}: %{y:.1f}% " + name + "<extra></extra>",
        )
    fig.update_layout(barmode="group")
    return fig


def gradient_check(runs: Labelled) -> Figure | None:
    """Each run's worst per-parameter gradient error against `single`, log scale, its tolerance
    marked; None when no run has a gradient check."""
    checks = [(label, (doc.get("summary") or {}).get("gradient_check")) for label, doc in runs]
    present = [(label, c) for label, c in checks if c]
    if not present:
        return None
    fig = figure("Gradient check: worst relative error per parameter", x="run", y="relative error (log)")
    fig.add_bar(
        name="worst parameter",
        x=[label for label, _ in present],
        y=[max(c["max_rel_err"], 1e-12) for _, c in present],
        marker_color=[palette.VERDICT["passed"] if c["passed"] else palette.VERDICT["failed"] for _, c in present],
        customdata=[[c.get("worst_param") or "—", "passed" if c["passed"] else "failed"] for _, c in present],
        hovertemplate="%{x}: %{y:.2e} at %{customdata[0]} (%{customdata[1]})<extra></extra>",
    )
    fig.add_scatter(
        name="tolerance",
        x=[label for label, _ in present],
        y=[c["tolerance"] for _, c in present],
        mode="markers+lines",
        marker={"symbol": "line-ew-open", "size": 24, "color": palette.INK, "line": {"width": 2}},
        line={"dash": "dot", "color": palette.INK, "width": 1},
        hovertemplate="tolerance %{y:.0e}<extra></extra>",
    )
    fig.update_yaxes(type="log")
    return fig


def loss(runs: Labelled) -> Figure:
    """Loss curves overlaid (and the reference, once)."""
    if not any((d.get("loss") or {}).get("values") for _, d in runs):
        return empty("Loss", "no loss recorded")
    fig = figure("Loss overlay", x="measured step", y="loss")
    reference = None
    for i, (label, doc) in enumerate(runs):
        values = (doc.get("loss") or {}).get("values") or []
        fig.add_scatter(name=label, x=list(range(1, len(values) + 1)), y=values, mode="lines", line={"color": palette.run_colour(i)})
        reference = reference or (doc.get("loss") or {}).get("reference")
    if reference:
        fig.add_scatter(
            name="reference (single)",
            x=list(range(1, len(reference) + 1)),
            y=reference,
            mode="lines",
            line={"dash": "dash", "color": palette.INK},
        )
    return fig


def compare_figures(runs: Labelled) -> dict[str, Figure]:
    figures = {
        "throughput": throughput(runs),
        "memory": memory(runs),
        "comm": comm(runs),
        "steps": step_breakdown(runs),
        "exposure": exposure(runs),
        "loss": loss(runs),
        "memory_timeline": memory_timelines.compare_timelines(runs),
    }
    gradients = gradient_check(runs)
    if gradients is not None:
        figures["gradients"] = gradients
    return figures
