"""Shared look of every figure: one template, units on axes, a quiet palette."""

from __future__ import annotations

import copy
import functools
import json
import statistics
from typing import Any

from plotly.io import json as plotly_json

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
TEMPLATE: dict[str, Any] = {
    "layout": {
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "colorway": PALETTE,
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1f2937"},
        "xaxis": {"gridcolor": "#eef2f7", "linecolor": "#cbd5e1", "zerolinecolor": "#cbd5e1", "ticks": "outside", "tickcolor": "#cbd5e1"},
        "yaxis": {"gridcolor": "#eef2f7", "linecolor": "#cbd5e1", "zerolinecolor": "#cbd5e1"},
        "hoverlabel": {"bgcolor": "#ffffff", "font": {"size": 12}},
        "bargap": 0.25,
    }
}


def _nested(props: dict[str, Any]) -> dict[str, Any]:
    """Plotly's shorthand expanded: `marker_color=c` is `marker={"color": c}` (every `_` one level down)."""
    out: dict[str, Any] = {}
    for key, value in props.items():
        *parents, leaf = key.split("_")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        _merge(node, {leaf: value})
    return out


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """`update` merged into `into` as plotly's `update` does: dicts merge, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value) if isinstance(value, dict) else value


class Figure:
    """A Plotly figure as the plain dicts plotly.js reads: traces in `data`, `layout`.

    The subset of `plotly.graph_objects.Figure`'s building API that our figures use, without its
    per-property validation, which cost the compare page about half a second for ten runs. What it
    builds is what `go.Figure` would have serialised (tests/ui/test_figure_spec.py checks every
    figure against plotly's validated Figure, so a misspelled property still fails a test).
    """

    def __init__(self, layout: dict[str, Any], axes: dict[tuple[int, int, bool], tuple[str, str]] | None = None) -> None:
        self.data: list[dict[str, Any]] = []
        self.layout = layout
        # (row, col, secondary y) → the (x, y) axis ids its traces name; None: one plot, no subplots.
        self._axes = axes

    def add_trace(
        self, kind: str, *, row: int | None = None, col: int | None = None, secondary_y: bool | None = None, **props: Any
    ) -> None:
        trace = {"type": kind, **_nested(props)}
        if self._axes is not None:
            where = (row or 1, col or 1, bool(secondary_y))
            if where not in self._axes:
                raise ValueError(f"no subplot at row {where[0]}, col {where[1]}{' with a secondary y axis' if secondary_y else ''}")
            x, y = self._axes[where]
            trace.update(xaxis=x, yaxis=y)
        self.data.append(trace)

    def add_bar(self, **props: Any) -> None:
        self.add_trace("bar", **props)

    def add_scatter(self, **props: Any) -> None:
        self.add_trace("scatter", **props)

    def add_annotation(self, **props: Any) -> None:
        self.layout.setdefault("annotations", []).append(_nested(props))

    def add_hline(self, y: float, **props: Any) -> None:
        """A horizontal line across the plot at `y` (one plot only)."""
        line = {"type": "line", "x0": 0, "x1": 1, "xref": "x domain", "y0": y, "y1": y, "yref": "y", **_nested(props)}
        self.layout.setdefault("shapes", []).append(line)

    def add_vline(self, x: float, *, label: str | None = None, **props: Any) -> None:
        """A vertical line up the plot at `x` (one plot only), with `label` at its top."""
        line = {"type": "line", "y0": 0, "y1": 1, "yref": "y domain", "x0": x, "x1": x, "xref": "x", **_nested(props)}
        self.layout.setdefault("shapes", []).append(line)
        if label is not None:
            self.add_annotation(x=x, y=1, xref="x", yref="y domain", text=label, showarrow=False, xanchor="left", yanchor="bottom")

    def update_layout(self, **props: Any) -> None:
        _merge(self.layout, _nested(props))

    def update_xaxes(self, *, row: int | None = None, col: int | None = None, **props: Any) -> None:
        self._update_axes(0, row, col, None, props)

    def update_yaxes(self, *, row: int | None = None, col: int | None = None, secondary_y: bool | None = None, **props: Any) -> None:
        self._update_axes(1, row, col, secondary_y, props)

    def _update_axes(self, which: int, row: int | None, col: int | None, secondary_y: bool | None, props: dict[str, Any]) -> None:
        """Every axis of the subplots chosen (all when row, col or secondary_y is None), as plotly selects them."""
        if self._axes is None:
            ids = {("x", "y")[which]}
        else:
            ids = {
                axes[which]
                for (r, c, secondary), axes in self._axes.items()
                if row in (None, r) and col in (None, c) and secondary_y in (None, secondary)
            }
        update = _nested(props)
        for axis in sorted(ids):
            _merge(self.layout.setdefault(("xaxis", "yaxis")[which] + axis[1:], {}), update)

    def to_plotly_json(self) -> dict[str, Any]:
        return {"data": self.data, "layout": self.layout}

    def to_json(self) -> str:
        return plotly_json.to_json_plotly(self.to_plotly_json())


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
        **_nested(extra),
    }


def figure(title: str, *, x: str, y: str, height: int = 360, **layout: Any) -> Figure:
    """An empty figure with the house layout and both axes titled (units in brackets)."""
    fig = Figure(house_layout(title, height=height, **layout))
    fig.update_xaxes(title_text=x, automargin=True)
    fig.update_yaxes(title_text=y, automargin=True)
    return fig


@functools.lru_cache(maxsize=32)
def _grid(arguments: str) -> tuple[dict[str, Any], dict[tuple[int, int, bool], tuple[str, str]]]:
    """make_subplots' layout (axis domains, anchors, subplot titles) and each subplot's axis ids,
    worked out once per distinct set of arguments (a JSON string, so that it can be a cache key)."""
    from plotly.subplots import make_subplots

    kwargs = json.loads(arguments)
    fig = make_subplots(**kwargs)
    layout = fig.to_plotly_json()["layout"]
    layout.pop("template", None)
    rows, cols = kwargs.get("rows", 1), kwargs.get("cols", 1)
    specs = kwargs.get("specs") or [[{}] * cols] * rows
    axes = {}
    for r in range(rows):
        for c in range(cols):
            for secondary in (False, True) if specs[r][c].get("secondary_y") else (False,):
                sub = fig.get_subplot(r + 1, c + 1, secondary_y=secondary)
                axes[(r + 1, c + 1, secondary)] = ("x" + sub.xaxis.plotly_name[5:], "y" + sub.yaxis.plotly_name[5:])
    return layout, axes


def subplots(title: str, *, height: int = 380, **kwargs: Any) -> Figure:
    """A grid of subplots (make_subplots' arguments) with the house layout."""
    layout, axes = _grid(json.dumps(kwargs, sort_keys=True))
    fig = Figure({**house_layout(title, height=height), **copy.deepcopy(layout)}, axes)
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def empty(title: str, message: str) -> Figure:
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
