"""Memory over the profiled step, per rank, by category (the ranks' `memory_timeline`). Pure: data in, figure out.

The x-axis is the phase, not the time: each phase (forward of a block, its backward, the
optimizer) gets one unit, and its points spread over it in time order, so two runs of one model
line up block by block whatever their speed — DDP's and FSDP's forward of block 0 sit one above
the other, and FSDP's gather-and-free shows inside each block's unit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.figures import palette
from backend.figures.common import MIB, Figure, empty, figure
from parallab.core.result import MEMORY_TIMELINE_CATEGORIES

COLOURS = {key: palette.MEMORY.get(key, palette.COMM_BUFFERS) for key in MEMORY_TIMELINE_CATEGORIES}
"""Each category's colour: the memory palette's, and teal for communication buffers."""
NOT_TRACED = "no memory timeline: the run was not traced"
TITLE = "Memory over the step, by category"

Points = Sequence[dict[str, Any]]


def phase_order(timelines: Sequence[Points]) -> list[str]:
    """Every phase in order of first appearance, the first timeline's order first (the others' new phases after where they follow)."""
    order: list[str] = []
    for points in timelines:
        at = 0
        for p in points:
            phase = str(p["phase"])
            if phase in order:
                at = order.index(phase) + 1
            else:
                order.insert(at, phase)
                at += 1
    return order


def positions(points: Points, order: Sequence[str]) -> list[float]:
    """Each point's x: its phase's index plus its place among that phase's points (in (0, 1))."""
    counts: dict[str, int] = {}
    for p in points:
        counts[p["phase"]] = counts.get(p["phase"], 0) + 1
    seen: dict[str, int] = {}
    out = []
    for p in points:
        k = seen.get(p["phase"], 0)
        seen[p["phase"]] = k + 1
        out.append(order.index(p["phase"]) + (k + 0.5) / counts[p["phase"]])
    return out


def _label(p: dict[str, Any]) -> str:
    """A point's phase, and the collective running then."""
    return str(p["phase"]) + (f" ({p['op']})" if p.get("op") else "")


def _axis(fig: Figure, order: Sequence[str]) -> None:
    fig.update_xaxes(tickvals=[i + 0.5 for i in range(len(order))], ticktext=list(order), tickangle=-45, range=[0, max(len(order), 1)])


def _busiest(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rank whose timeline peaks highest."""
    return max(ranks, key=lambda r: max(p["allocated"] for p in r["memory_timeline"]))


def rank_timeline(doc: dict[str, Any], rank: int | None = None) -> Figure:
    """One rank's memory (the busiest's by default) as stacked areas per category, hover naming the phase and categories."""
    ranks = [r for r in doc.get("ranks") or [] if r.get("memory_timeline")]
    if not ranks:
        return empty(TITLE, NOT_TRACED)
    chosen = next((r for r in ranks if r["rank"] == rank), None) or _busiest(ranks)
    points = chosen["memory_timeline"]
    order = phase_order([points])
    x = positions(points, order)
    fig = figure(f"{TITLE} (rank {chosen['rank']})", x="phase", y="allocated [MiB]", height=420)
    phases = [_label(p) for p in points]
    for i, (key, colour) in enumerate(COLOURS.items()):
        # "x unified" hover: the first line names the phase once, each category adds its own line.
        head = "<b>%{text}</b><br>" if i == 0 else ""
        fig.add_scatter(
            name=key,
            x=x,
            y=[p["categories"].get(key, 0) / MIB for p in points],
            mode="lines",
            stackgroup="memory",
            line={"width": 0.5, "color": colour},
            fillcolor=colour,
            **({"text": phases} if i == 0 else {}),
            hovertemplate=head + key + ": %{y:.2f} MiB<extra></extra>",
        )
    fig.update_layout(hovermode="x unified")
    top = max(points, key=lambda p: p["allocated"])
    fig.add_scatter(
        name="peak",
        x=[x[points.index(top)]],
        y=[top["allocated"] / MIB],
        mode="markers",
        marker={"color": palette.INK, "size": 9, "symbol": "x"},
        hovertemplate=f"peak: %{{y:.2f}} MiB in {top['phase']}<extra></extra>",
    )
    _axis(fig, order)
    return fig


def peak_difference(a: Points, b: Points) -> dict[str, int]:
    """Bytes by category at `b`'s peak minus at `a`'s: they sum to the difference of the peaks exactly."""
    pa, pb = max(a, key=lambda p: p["allocated"]), max(b, key=lambda p: p["allocated"])
    return {k: pb["categories"].get(k, 0) - pa["categories"].get(k, 0) for k in MEMORY_TIMELINE_CATEGORIES}


def compare_timelines(runs: Sequence[tuple[str, dict[str, Any]]]) -> Figure:
    """Each run's busiest rank as a line of allocated bytes over the phases they share; the title
    explains the peaks' difference (second run minus first) by category."""
    drawn = []
    for label, doc in runs:
        ranks = [r for r in doc.get("ranks") or [] if r.get("memory_timeline")]
        if ranks:
            drawn.append((label, _busiest(ranks)["memory_timeline"]))
    if not drawn:
        return empty(TITLE, NOT_TRACED)
    order = phase_order([points for _, points in drawn])
    title = "Memory over the step, aligned by phase (busiest rank)"
    if len(drawn) >= 2:
        diff = peak_difference(drawn[0][1], drawn[1][1])
        parts = ", ".join(f"{k} {v / MIB:+.2f}" for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1])) if v)
        title += f"<br><sup>peak {drawn[1][0]} − {drawn[0][0]}: {sum(diff.values()) / MIB:+.2f} MiB = {parts}</sup>"
    fig = figure(title, x="phase", y="allocated [MiB]", height=460)
    for i, (label, points) in enumerate(drawn):
        fig.add_scatter(
            name=label,
            x=positions(points, order),
            y=[p["allocated"] / MIB for p in points],
            mode="lines",
            line={"color": palette.run_colour(i), "width": 1.5},
            text=[_label(p) for p in points],
            hovertemplate=f"{label}: %{{y:.2f}} MiB<br>%{{text}}<extra></extra>",
        )
    _axis(fig, order)
    return fig
