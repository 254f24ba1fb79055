"""Figures of one run, from its result document (a plain dict). Pure: data in, figure out."""

from __future__ import annotations

from typing import Any

from backend.figures import memory, palette
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
    predicted_memory,
    step_parts,
    step_split,
    subplots,
)


def memory_per_rank(doc: dict[str, Any]) -> Figure:
    """Per-rank peak memory stacked by what holds it, beside the predicted components.

    With the MemTracker split (`memory_breakdown`): params, grads, optimizer, activations,
    temporaries and other per rank, and a hatched bar of the prediction for the busiest rank
    (model state parts + activations). Without it: model state and the rest of the peak, the
    predicted model state marked."""
    ranks = doc.get("ranks") or []
    if not ranks:
        return empty("Memory per rank", "no per-rank data")
    splits = [memory_split(r) for r in ranks]
    if all(split is not None for split in splits):
        return _memory_split(doc, ranks, [s for s in splits if s is not None])
    fig = figure("Memory per rank (peak)", x="rank", y="memory [MiB]")
    names = [f"rank {r['rank']}" for r in ranks]
    parts = [memory_parts(r) for r in ranks]
    for key, colour in MEMORY_COLOURS.items():
        fig.add_bar(
            name=key, x=names, y=[p[key] for p in parts], marker_color=colour, hovertemplate="%{x}: %{y:.2f} MiB " + key + "<extra></extra>"
        )
    predicted = ((doc.get("prediction") or {}).get("model_state_bytes_per_rank")) or None
    if predicted:
        total = sum(predicted.values()) / MIB
        fig.add_scatter(
            name="predicted model state",
            x=names,
            y=[total] * len(names),
            mode="markers+lines",
            marker={"symbol": "line-ew-open", "size": 30, "color": palette.INK, "line": {"width": 3}},
            line={"dash": "dot", "color": palette.INK, "width": 1},
            hovertemplate="predicted params+grads+optimizer: %{y:.2f} MiB<extra></extra>",
        )
    fig.update_layout(barmode="stack")
    return fig


def _memory_split(doc: dict[str, Any], ranks: list[dict[str, Any]], splits: list[dict[str, float]]) -> Figure:
    title = "Allocated memory per rank at the peak (not process RSS), beside the prediction"
    why = zero_gradients_note(doc, splits)
    fig = figure(title + (f"<br><sub>{why}</sub>" if why else ""), x="rank", y="allocated memory [MiB]")
    names = [f"rank {r['rank']}" for r in ranks]
    predicted = predicted_memory(doc.get("prediction") or {})
    label = "predicted (busiest rank)"
    for key, colour in MEMORY_SPLIT_COLOURS.items():
        fig.add_bar(
            name=key,
            legendgroup=key,
            x=names,
            y=[split[key] for split in splits],
            marker_color=colour,
            hovertemplate="%{x}: %{y:.2f} MiB " + key + "<extra></extra>",
        )
        if predicted is not None and key in predicted:
            fig.add_bar(
                name=f"{key} (predicted)",
                legendgroup=key,
                showlegend=False,
                x=[label],
                y=[predicted[key]],
                marker={"color": colour, "pattern": {"shape": "/", "fgcolor": "#ffffff", "bgcolor": colour}},
                hovertemplate="predicted: %{y:.2f} MiB " + key + "<extra></extra>",
            )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(categoryorder="array", categoryarray=[*names, label])
    return fig


SHARDED_GRADIENTS = frozenset({"fsdp", "hsdp", "hybrid", "3d", "layout"})
"""Strategies that reduce-scatter each gradient into its shard as soon as it is made."""


def zero_gradients_note(doc: dict[str, Any], splits: list[dict[str, float]]) -> str | None:
    """Why the gradients read 0 at the peak, in a sentence (None when they do not)."""
    if not splits or any(split.get("grads", 0) > 0 for split in splits):
        return None
    if (doc.get("strategy") or {}).get("name") in SHARDED_GRADIENTS:
        return "Gradients read 0: each is reduce-scattered into its shard and the full gradient freed before the peak."
    return "Gradients read 0: none is held at the moment of the peak (made and freed around it, or not yet made)."


def step_breakdown(doc: dict[str, Any]) -> Figure:
    """Each rank's step split into compute, communication and bubble/idle.

    With `step_time_breakdown`: compute, the communication compute overlaps (hatched, inside the
    compute time), exposed communication and idle/bubble, summing to the rank's step time.
    Without it: the median step, all communication together (overlap unknown)."""
    ranks = doc.get("ranks") or []
    splits = [step_split(r) for r in ranks]
    if ranks and all(split is not None for split in splits):
        fig = figure("Step time per rank: where it goes", x="time per step [ms]", y="rank")
        names = [f"rank {r['rank']}" for r in ranks]
        for key, colour in SPLIT_COLOURS.items():
            marker: dict[str, Any] = {"color": colour}
            if key == "overlapped comm":
                marker["pattern"] = {"shape": "/", "fgcolor": SPLIT_COLOURS["compute"], "bgcolor": colour}
            fig.add_bar(
                name=key,
                y=names,
                x=[(split or {}).get(key, 0.0) * 1e3 for split in splits],
                orientation="h",
                marker=marker,
                hovertemplate="%{y}: %{x:.2f} ms " + key + "<extra></extra>",
            )
        fig.update_layout(barmode="stack")
        fig.update_yaxes(autorange="reversed")
        return fig
    if not any(r.get("step_times_s") for r in ranks):
        return empty("Step time breakdown", "no step times recorded")
    fig = figure("Step time breakdown (median step; overlap not measured)", x="time per step [ms]", y="rank")
    names = [f"rank {r['rank']}" for r in ranks]
    parts = [step_parts(r) for r in ranks]
    for key, colour in TIME_COLOURS.items():
        fig.add_bar(
            name=key,
            y=names,
            x=[p[key] * 1e3 for p in parts],
            orientation="h",
            marker_color=colour,
            hovertemplate="%{y}: %{x:.2f} ms " + key + "<extra></extra>",
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    return fig


def comm_volume(doc: dict[str, Any]) -> Figure | None:
    """Bytes per step by op: the buffer (nccl-tests' convention) and the bytes on the wire, each
    measured (largest rank) beside predicted. None when nothing was communicated or predicted."""
    summary, prediction = doc.get("summary") or {}, doc.get("prediction") or {}
    series = {
        "buffer, measured": (summary.get("comm_bytes_per_step") or {}, palette.BYTES["buffer"], None),
        "buffer, predicted": (prediction.get("comm_bytes_per_step") or {}, palette.BYTES["buffer"], "/"),
        "wire, measured": (summary.get("wire_bytes_per_step") or {}, palette.BYTES["wire"], None),
        "wire, predicted": (prediction.get("wire_bytes_per_step") or {}, palette.BYTES["wire"], "/"),
    }
    ops = sorted({op for values, _, _ in series.values() for op in values})
    if not ops:
        return None
    fig = figure("Bytes per step by op: buffer and wire, measured and predicted", x="op", y="MiB per step")
    for name, (values, colour, pattern) in series.items():
        if not values:
            continue
        marker: dict[str, Any] = {"color": colour}
        if pattern:
            marker["pattern"] = {"shape": pattern, "fgcolor": "#ffffff", "bgcolor": colour}
        fig.add_bar(
            name=name,
            x=ops,
            y=[values[op] / MIB if op in values else None for op in ops],
            marker=marker,
            hovertemplate="%{x}: %{y:.3f} MiB " + name + "<extra></extra>",
        )
    fig.update_layout(barmode="group")
    return fig


def comm_by_op(doc: dict[str, Any]) -> Figure:
    """Communication by op: bytes per step (predicted marked), time per step, bus bandwidth."""
    ranks = doc.get("ranks") or []
    ops = sorted({c["op"] for r in ranks for c in r.get("comm") or []})
    if not ops:
        return empty("Communication by op", "no communication recorded (single process?)")
    fig = subplots(
        "Communication by op", rows=1, cols=3, subplot_titles=("bytes per step", "time per step", "bus bandwidth"), horizontal_spacing=0.09
    )
    for i, r in enumerate(ranks):
        by_op = {c["op"]: c for c in r.get("comm") or []}
        colour = palette.rank_colours(len(ranks))[i]
        common = {"legendgroup": f"rank{r['rank']}", "marker_color": colour, "x": ops}
        fig.add_bar(
            name=f"rank {r['rank']}",
            y=[(by_op.get(o) or {}).get("bytes", 0) / MIB for o in ops],
            row=1,
            col=1,
            hovertemplate="%{x}: %{y:.3f} MiB<extra>rank " + str(r["rank"]) + "</extra>",
            **common,
        )
        fig.add_bar(
            name=f"rank {r['rank']}",
            y=[(by_op.get(o) or {}).get("time_s", 0) * 1e3 for o in ops],
            row=1,
            col=2,
            showlegend=False,
            hovertemplate="%{x}: %{y:.3f} ms<extra>rank " + str(r["rank"]) + "</extra>",
            **common,
        )
        fig.add_bar(
            name=f"rank {r['rank']}",
            y=[(by_op.get(o) or {}).get("busbw_gbps") for o in ops],
            row=1,
            col=3,
            showlegend=False,
            hovertemplate="%{x}: %{y:.3f} GB/s<extra>rank " + str(r["rank"]) + "</extra>",
            **common,
        )
    predicted = (doc.get("prediction") or {}).get("comm_bytes_per_step") or {}
    if predicted:
        fig.add_scatter(
            name="predicted",
            x=ops,
            y=[(predicted.get(o) or 0) / MIB if o in predicted else None for o in ops],
            mode="markers",
            marker={"symbol": "diamond-open", "size": 12, "color": palette.INK, "line": {"width": 2}},
            row=1,
            col=1,
            hovertemplate="%{x}: predicted %{y:.3f} MiB<extra></extra>",
        )
    fig.update_yaxes(title_text="MiB per step", row=1, col=1)
    fig.update_yaxes(title_text="ms per step", row=1, col=2)
    fig.update_yaxes(title_text="busbw [GB/s]", row=1, col=3)
    fig.update_xaxes(title_text="op")
    fig.update_layout(barmode="group", height=380)
    return fig


def timeline(doc: dict[str, Any]) -> Figure:
    """One profiled step: communication ops on a lane per rank, over time. Events may be bars of a
    downsampled timeline (`count` events merged, `busy_us` of them busy; `services.timeline`)."""
    events = doc.get("timeline") or []
    if not events:
        return empty("Timeline of one step", "no timeline (submit with tracing on)")
    ranks = sorted({e["rank"] for e in events})
    title = "Timeline of one profiled step"
    total = doc.get("timeline_total")
    if total and total > len(events):
        title += f" ({total:,} events shown as {len(events):,} bars; full detail in the Perfetto trace)"
    fig = figure(title, x="time [ms]", y="rank", height=max(220, 90 + 45 * len(ranks)))
    ops = sorted({e["op"] for e in events})
    t0 = min(e["start_us"] for e in events)
    for i, op in enumerate(ops):
        sel = [e for e in events if e["op"] == op]
        fig.add_bar(
            name=op,
            orientation="h",
            y=[f"rank {e['rank']}" for e in sel],
            x=[e["dur_us"] / 1e3 for e in sel],
            base=[(e["start_us"] - t0) / 1e3 for e in sel],
            marker_color=palette.op_colour(i),
            customdata=[[(e.get("bytes") or 0) / MIB, e.get("count", 1), e.get("busy_us", e["dur_us"]) / 1e3] for e in sel],
            hovertemplate=op
            + ": start %{base:.3f} ms, %{x:.3f} ms, %{customdata[0]:.3f} MiB"
            + " (%{customdata[1]} events, %{customdata[2]:.3f} ms busy)<extra>%{y}</extra>",
        )
    fig.update_layout(barmode="overlay")
    fig.update_yaxes(categoryorder="array", categoryarray=[f"rank {r}" for r in ranks], autorange="reversed")
    return fig


def critical_path(doc: dict[str, Any]) -> Figure | None:
    """The last profiled step's critical path: its segments on a lane per rank it passed through,
    coloured by part (compute by op class, transfer, wait, bubble, idle), beside the timeline."""
    cp = doc.get("critical_path") or {}
    path = cp.get("path") or []
    if not path:
        return None
    ranks = sorted({s["rank"] for s in path})
    length = cp.get("length_s") or 0.0
    fig = figure(
        f"Critical path of one profiled step (mean {length * 1e3:.1f} ms per step over {cp.get('steps', 0)})",
        x="time [ms]",
        y="rank",
        height=max(200, 90 + 45 * len(ranks)),
    )
    families = {"compute": "compute", "transfer": "exposed comm", "wait": "imbalance", "bubble": "idle / bubble", "idle": "idle / bubble"}
    parts = sorted({s["part"] for s in path}, key=lambda p: (p.split(" ")[0], p))
    for i, part in enumerate(parts):
        sel = [s for s in path if s["part"] == part]
        family = part.split(" ", 1)[0]
        colour = palette.op_colour(i) if family in ("compute", "transfer") else palette.TIME.get(families.get(family, "idle / bubble"))
        fig.add_bar(
            name=f"{part} ({(cp.get('parts_s') or {}).get(part, 0.0) * 1e3:.1f} ms a step)",
            orientation="h",
            y=[f"rank {s['rank']}" for s in sel],
            x=[s["dur_us"] / 1e3 for s in sel],
            base=[s["start_us"] / 1e3 for s in sel],
            marker_color=colour,
            hovertemplate=part + ": start %{base:.3f} ms, %{x:.3f} ms<extra>%{y}</extra>",
        )
    fig.update_layout(barmode="overlay")
    fig.update_yaxes(categoryorder="array", categoryarray=[f"rank {r}" for r in ranks], autorange="reversed")
    return fig


MAX_CURVE_POINTS = 2000
"""A curve with more points is drawn from each bucket's first, lowest, highest and last point."""


def thin(values: list[float], limit: int = MAX_CURVE_POINTS) -> tuple[list[int], list[float]]:
    """(1-based steps, values) of a curve, at most about `limit` points: all of them when few, else
    per bucket its first, lowest, highest and last point (M4: the drawn line keeps every extreme)."""
    if len(values) <= limit:
        return list(range(1, len(values) + 1)), list(values)
    size = -(-len(values) * 4 // limit)
    keep: list[int] = []
    for lo in range(0, len(values), size):
        bucket = range(lo, min(lo + size, len(values)))
        picks = {bucket[0], bucket[-1], min(bucket, key=values.__getitem__), max(bucket, key=values.__getitem__)}
        keep += sorted(picks)
    return [i + 1 for i in keep], [values[i] for i in keep]


def loss_curve(doc: dict[str, Any]) -> Figure:
    """The loss of every measured step against the single-process reference."""
    loss = doc.get("loss") or {}
    values, reference = loss.get("values") or [], loss.get("reference") or []
    if not values:
        return empty("Loss", "no loss recorded")
    fig = figure("Loss against the reference", x="measured step", y="loss")
    steps, shown = thin(values)
    # the run's own line: the colour a comparison gives its first run
    fig.add_scatter(
        name=doc.get("strategy", {}).get("name", "run"), x=steps, y=shown, mode="lines+markers", line={"color": palette.run_colour(0)}
    )
    if reference:
        ref_steps, ref_shown = thin(reference)
        fig.add_scatter(
            name="reference (single)",
            x=ref_steps,
            y=ref_shown,
            mode="lines",
            line={"dash": "dash", "color": palette.INK},
        )
    return fig


def moe_load(doc: dict[str, Any]) -> Figure | None:
    """Tokens routed to each expert per rank (MoE runs only), in the ranks' colours, and the mean
    per expert as a line in the imbalance colour: the busiest bar's height over it is the imbalance."""
    ranks = [r for r in doc.get("ranks") or [] if (r.get("moe") or {}).get("tokens_per_expert")]
    if not ranks:
        return None
    fig = figure("MoE expert load", x="expert", y="tokens per step")
    colours = palette.rank_colours(len(ranks))
    experts: list[str] = []
    for r, colour in zip(ranks, colours, strict=True):
        moe = r["moe"]
        counts = moe["tokens_per_expert"]
        extra = f"imbalance {moe.get('imbalance', 0):.2f}, dropped {moe.get('dropped_tokens', 0)}"
        experts = [f"expert {i}" for i in range(len(counts))]
        fig.add_bar(name=f"rank {r['rank']} ({extra})", x=experts, y=counts, marker_color=colour)
    every = [c for r in ranks for c in r["moe"]["tokens_per_expert"]]
    mean = sum(every) / len(every)
    fig.add_scatter(
        name="mean per expert (imbalance: the busiest over it)",
        x=experts,
        y=[mean] * len(experts),
        mode="lines",
        line={"color": palette.TIME["imbalance"], "dash": "dash", "width": 2},
        hovertemplate="mean %{y:,.0f} tokens per expert<extra></extra>",
    )
    fig.update_layout(barmode="group")
    return fig


def pipeline_bubble(doc: dict[str, Any]) -> Figure | None:
    """Measured idle fraction of each pipeline rank against the schedule's theory (pp runs only):
    (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) interleaved, as the prediction names it.
    A rank holding several chunks (virtual stages) is one bar, named by the stages it holds."""
    ranks = [r for r in doc.get("ranks") or [] if r.get("bubble_fraction") is not None]
    if not ranks:
        return None
    prediction = doc.get("prediction") or {}
    pipeline = prediction.get("pipeline") or {}
    held = pipeline.get("stages_per_rank") or []
    fig = figure("Pipeline bubble", x="pipeline rank", y="idle fraction of the step [%]")
    names = [stage_label(r["rank"], held, world_size=len(doc.get("ranks") or [])) for r in ranks]
    fig.add_bar(name="measured", x=names, y=[r["bubble_fraction"] * 100 for r in ranks], marker_color=palette.TIME["idle / bubble"])
    theory = prediction.get("bubble_fraction")
    if theory is not None:
        formula = pipeline.get("bubble_formula") or "(p−1)/(m+p−1)"
        fig.add_scatter(
            name=f"theory {formula}", x=names, y=[theory * 100] * len(names), mode="lines", line={"dash": "dash", "color": palette.INK}
        )
    return fig


def stage_label(rank: int, stages_per_rank: list[list[int]], *, world_size: int) -> str:
    """ "stage 1" for a rank holding one stage, "rank 0: stages 0, 2" for one holding several
    (virtual stages). pp is the outermost mesh dim: rank r is pp rank r // (world size / pp)."""
    if not stages_per_rank or all(len(s) == 1 for s in stages_per_rank):
        return f"stage {rank}"
    inner = max(world_size // len(stages_per_rank), 1)
    return f"rank {rank}: stages {', '.join(map(str, stages_per_rank[min(rank // inner, len(stages_per_rank) - 1)]))}"


def run_figures(doc: dict[str, Any]) -> dict[str, Figure | None]:
    """Every figure that applies to this run, by id, in page order. The timeline is None when the
    document comes without its `timeline` key (the page loads it lazily, downsampled)."""
    figures: dict[str, Figure | None] = {
        "memory": memory_per_rank(doc),
        "steps": step_breakdown(doc),
        "comm": comm_by_op(doc),
        "timeline": timeline(doc) if "timeline" in doc else None,
        "memory_timeline": memory.rank_timeline(doc),
        "loss": loss_curve(doc),
    }
    path = critical_path(doc)
    if path is not None:  # beside the timeline
        figures = {**dict(list(figures.items())[:4]), "critical_path": path, **dict(list(figures.items())[4:])}
    for key, builder in (("volume", comm_volume), ("moe", moe_load), ("bubble", pipeline_bubble)):
        fig = builder(doc)
        if fig is not None:
            figures[key] = fig
    return figures
