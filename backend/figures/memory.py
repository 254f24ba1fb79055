"""Memory over the profiled step, per rank, by category (the ranks' `memory_timeline`). Pure: data in, figure out.

The x-axis is the phase, not the time: each phase (forward of a block, its backward, the
optimizer) gets one unit, and its points spread over it in time order, so two runs of one model
line up block by block whatever their speed — DDP's and FSDP's forward of block 0 sit one above
the other, and FSDP's gather-and-free shows inside each block's unit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.figures import palette
from backend.figures.common import MIB, Figure, empty, figure, subplots
from parallab.core import memory_curve
from parallab.core.result import MEMORY_TIMELINE_CATEGORIES

COLOURS = {key: palette.MEMORY.get(key, palette.COMM_BUFFERS) for key in MEMORY_TIMELINE_CATEGORIES}
"""Each category's colour: the memory palette's, and teal for communication buffers."""
NOT_TRACED = "no memory timeline: the run was not traced"
TITLE = "Memory over the step, by category"
PREDICTED = "predicted (planner's memory model)"
OUTSIDE = {
    "rss": "process RSS (includes the Python heap, libraries, gloo buffers)",
    "reserved": "reserved by PyTorch's CUDA allocator",
    "device_used": "device memory by NVML (adds the CUDA context, NCCL buffers)",
}
"""What the framework cannot see, each as labelled beside "allocated by PyTorch"."""
ALLOCATED = "allocated by PyTorch"
STEP_AT = (0.02, 0.5, 0.98)
"""Where in its phase's unit the predicted curve has a point."""

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


def chosen_rank(doc: dict[str, Any], rank: int | None = None) -> dict[str, Any] | None:
    """The rank the run page draws: `rank` if it has a timeline, else the busiest; None when untraced."""
    ranks = [r for r in doc.get("ranks") or [] if r.get("memory_timeline")]
    if not ranks:
        return None
    return next((r for r in ranks if r["rank"] == rank), None) or _busiest(ranks)


def predicted(doc: dict[str, Any], chosen: dict[str, Any]) -> list[memory_curve.PredictedPhase] | None:
    """The planner's curve over `chosen`'s phases (None when the document carries no memory model:
    an upload, or a run from before it was stored)."""
    curves = (doc.get("prediction") or {}).get("memory_curve") or []
    world = int((doc.get("strategy") or {}).get("world_size") or len(doc.get("ranks") or []) or 1)
    inputs = memory_curve.for_rank(curves, int(chosen["rank"]), world)
    if inputs is None:
        return None
    return memory_curve.curve(inputs, phase_order([chosen["memory_timeline"]]))


def prediction_gaps(doc: dict[str, Any], rank: int | None = None) -> dict[str, Any] | None:
    """The measured highest point of each phase against the predicted one on the drawn rank, the
    largest gap and its sentence ('largest gap: +1.33 MiB (+15.1 %) in forward output'); None
    without a timeline or a memory model."""
    chosen = chosen_rank(doc, rank)
    curve = predicted(doc, chosen) if chosen is not None else None
    if chosen is None or curve is None:
        return None
    rows = memory_curve.gaps(chosen["memory_timeline"], curve)
    worst = memory_curve.largest_gap(rows)
    return {"rank": chosen["rank"], "phases": rows, "largest": worst, "sentence": memory_curve.gap_sentence(worst)}


def _categories_text(categories: dict[str, int]) -> str:
    return "<br>".join(f"{k}: {v / MIB:.2f} MiB" for k, v in categories.items() if v)


def rank_timeline(doc: dict[str, Any], rank: int | None = None) -> Figure:
    """One rank's memory (the busiest's by default) as stacked areas per category, hover naming the
    phase and categories; over it the planner's predicted curve (a step per phase, the largest gap
    named in the title) and, on a second axis, what the framework cannot see (process RSS; on
    CUDA the allocator's reserved bytes and NVML's device memory)."""
    chosen = chosen_rank(doc, rank)
    if chosen is None:
        return empty(TITLE, NOT_TRACED)
    points = chosen["memory_timeline"]
    order = phase_order([points])
    x = positions(points, order)
    curve = predicted(doc, chosen)
    title = f"{TITLE} (rank {chosen['rank']})"
    gaps = prediction_gaps(doc, chosen["rank"]) if curve is not None else None
    title += (
        f"<br><sup>against the planner's model: {gaps['sentence']}</sup>" if gaps else "<br><sup>no memory model stored with this run</sup>"
    )
    fig = subplots(title, height=460, specs=[[{"secondary_y": True}]])
    fig.update_xaxes(title_text="phase")
    fig.update_yaxes(title_text=f"{ALLOCATED} [MiB]", secondary_y=False)
    phases = [_label(p) for p in points]
    for i, (key, colour) in enumerate(COLOURS.items()):
        # "x unified" hover: the first line names the phase once, each category adds its own line.
        head = "<b>%{text}</b><br>" if i == 0 else ""
        fig.add_scatter(
            secondary_y=False,
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
    if curve is not None:
        fig.add_scatter(
            secondary_y=False,
            name=PREDICTED,
            # a level across each phase's unit (its start, middle and end, so hover finds it anywhere)
            x=[i + f for i in range(len(curve)) for f in STEP_AT],
            y=[p.allocated / MIB for p in curve for _ in STEP_AT],
            mode="lines",
            line={"color": palette.INK, "width": 2, "dash": "dash"},
            text=[f"{p.phase}<br>{_categories_text(p.categories)}" for p in curve for _ in STEP_AT],
            hovertemplate="predicted: %{y:.2f} MiB<br>%{text}<extra></extra>",
        )
    outside = [k for k in OUTSIDE if any(p.get(k) is not None for p in points)]
    for key in outside:
        fig.add_scatter(
            secondary_y=True,
            name=OUTSIDE[key],
            x=[xi for xi, p in zip(x, points, strict=True) if p.get(key) is not None],
            y=[p[key] / MIB for p in points if p.get(key) is not None],
            mode="lines",
            line={
                "color": palette.MUTED if key == "rss" else palette.run_colour(2 if key == "reserved" else 3),
                "width": 1.5,
                "dash": "dot",
            },
            hovertemplate=OUTSIDE[key].split(" (")[0] + ": %{y:.1f} MiB<extra></extra>",
        )
    if outside:
        fig.update_yaxes(title_text="outside the allocator's count [MiB]", secondary_y=True, showgrid=False)
    top = max(points, key=lambda p: p["allocated"])
    fig.add_scatter(
        secondary_y=False,
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
    """Each run's busiest rank as a line of allocated bytes over the phases they share, and in the
    same colour, dashed, the planner's curve for it; the title explains the peaks' difference
    (second run minus first) by category."""
    drawn = []
    for label, doc in runs:
        chosen = chosen_rank(doc)
        if chosen is not None:
            drawn.append((label, chosen["memory_timeline"], predicted(doc, chosen)))
    if not drawn:
        return empty(TITLE, NOT_TRACED)
    order = phase_order([points for _, points, _ in drawn])
    title = "Memory over the step, aligned by phase (busiest rank; dashed: the planner's model)"
    if len(drawn) >= 2:
        diff = peak_difference(drawn[0][1], drawn[1][1])
        parts = ", ".join(f"{k} {v / MIB:+.2f}" for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1])) if v)
        title += f"<br><sup>peak {drawn[1][0]} − {drawn[0][0]}: {sum(diff.values()) / MIB:+.2f} MiB = {parts}</sup>"
    fig = figure(title, x="phase", y="allocated [MiB]", height=460)
    for i, (label, points, _) in enumerate(drawn):
        fig.add_scatter(
            name=label,
            x=positions(points, order),
            y=[p["allocated"] / MIB for p in points],
            mode="lines",
            line={"color": palette.run_colour(i), "width": 1.5},
            text=[_label(p) for p in points],
            hovertemplate=f"{label}: %{{y:.2f}} MiB<br>%{{text}}<extra></extra>",
        )
    for i, (label, _, curve) in enumerate(drawn):
        if curve:
            fig.add_scatter(
                name=f"{label}, predicted",
                x=[order.index(p.phase) + f for p in curve for f in STEP_AT],
                y=[p.allocated / MIB for p in curve for _ in STEP_AT],
                mode="lines",
                line={"color": palette.run_colour(i), "width": 1.5, "dash": "dash"},
                text=[f"{p.phase}<br>{_categories_text(p.categories)}" for p in curve for _ in STEP_AT],
                hovertemplate=f"{label}, predicted: %{{y:.2f}} MiB<br>%{{text}}<extra></extra>",
            )
    _axis(fig, order)
    return fig


def peak_tables(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank with a `memory_peak`, busiest first: the peak's phase and bytes, its largest live
    groups (category, module, phase) and the rest, as the run page's table lists them; each row's
    share of the peak, the rows adding up to it."""
    out = []
    for rank in doc.get("ranks") or []:
        peak = rank.get("memory_peak")
        if not peak:
            continue
        total = peak["allocated"] or 1
        rows = [{**row, "share": row["bytes"] / total} for row in peak["top"]]
        if peak.get("rest_count"):
            rows.append(
                {
                    "bytes": peak["rest_bytes"],
                    "count": peak["rest_count"],
                    "category": "the rest",
                    "module": None,
                    "phase": "",
                    "op": None,
                    "stack": None,
                    "share": peak["rest_bytes"] / total,
                }
            )
        if peak.get("unaccounted_bytes"):
            rows.append(
                {
                    "bytes": peak["unaccounted_bytes"],
                    "count": 0,
                    "category": "freed, not known at the step's start",
                    "module": None,
                    "phase": "",
                    "op": None,
                    "stack": None,
                    "share": peak["unaccounted_bytes"] / total,
                }
            )
        out.append({"rank": rank["rank"], "phase": peak["phase"], "allocated": peak["allocated"], "rows": rows})
    return sorted(out, key=lambda t: -t["allocated"])
