"""Figures are built as plain dicts, unvalidated: plotly's validated Figure is the oracle that they
name only real properties, with values plotly accepts, and serialise as plotly would have."""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
import pytest
from plotly.io import json as plotly_json
from plotly.subplots import make_subplots

from backend.api.pages.rendering import figure_json
from backend.figures import common, compare, live, run, scaling, series, sweeps
from tests.ui.factories import make_document

STRATEGIES = ("ddp", "fsdp", "tp", "pp", "hybrid")


def compare_runs() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{s} ×2", make_document(strategy=s, world_size=2, seed=i).model_dump(mode="json")) for i, s in enumerate(STRATEGIES)]


def every_figure() -> dict[str, common.Figure]:
    """Every builder of every module, on fixed factory input (and the empty cases)."""
    figures: dict[str, common.Figure] = {}
    for n, runs in (("5", compare_runs()), ("0", [])):
        figures |= {f"compare[{n}].{k}": f for k, f in compare.compare_figures(runs).items()}
    traced = make_document(strategy="fsdp", world_size=2).model_dump(mode="json")
    traced["timeline"] = [
        {"rank": r, "op": op, "start_us": 10.0 * i, "dur_us": 4.0, "bytes": 1024}
        for r in (0, 1)
        for i, op in enumerate(["all_gather", "reduce_scatter"])
    ]
    from tests.ui.test_palette import _critical_path

    pp = make_document(strategy="pp", world_size=2).model_copy(update={"critical_path": _critical_path()}).model_dump(mode="json")
    for name, doc in (("fsdp", traced), ("pp", pp), ("empty", {})):
        figures |= {f"run[{name}].{k}": f for k, f in run.run_figures(doc).items() if f is not None}
    points = [
        {
            "label": f"c{i}",
            "value": 100 + i,
            "lower": 95.0,
            "upper": 105.0,
            "verdict": ("regressed", "improved", None)[i % 3],
            "dismissed": i == 3,
        }
        for i in range(5)
    ]
    figures["series"] = series.history(points, title="Throughput", unit="tokens/s", higher_is_better=True)
    sweep = [
        {"label": f"p{i}", "role": ("top", "control")[i % 2], "status": "done", "predicted_tokens_per_s": 100.0 + i}
        | {"measured_tokens_per_s": 90.0 + i, "predicted_memory_bytes": 2**20 * (i + 1), "measured_memory_bytes": 2**21 * (i + 1)}
        for i in range(4)
    ]
    figures |= {f"sweep.{k}": f for k, f in sweeps.sweep_figures(sweep, spearman=0.8).items()}
    scaled = [
        {"strategy": s, "world_size": w, "tokens_per_s": 90.0 * w, "ideal_tokens_per_s": 100.0 * w, "efficiency": None if w == 1 else 0.9}
        for s in ("ddp", "fsdp")
        for w in (1, 2, 4)
    ]
    figures["scaling.throughput"] = scaling.throughput(scaled)
    figures["scaling.efficiency"] = scaling.efficiency(scaled)
    history = [
        {"t": 100.0 + i, "phase": "train", "step": i, "loss": 3 - 0.1 * i, "tokens_per_s": 1e3, "memory_bytes": 2**20} for i in range(4)
    ]
    figures["live"] = live.live_figure(history)
    return figures


def as_plotly_json(value: Any) -> Any:
    """What the browser receives: the figure through plotly's JSON encoder, parsed back."""
    return json.loads(plotly_json.to_json_plotly(value))


def validated(spec: dict[str, Any]) -> Any:
    """The figure plotly's validated graph objects make of `spec` (ValueError on a property that doesn't exist)."""
    return as_plotly_json(go.Figure(spec).to_plotly_json())


FIGURES = every_figure()


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_plotlys_validated_figure_of_each_spec_is_the_spec(name: str) -> None:
    spec = FIGURES[name].to_plotly_json()
    assert validated(spec) == as_plotly_json(spec)
    assert json.loads(str(figure_json(FIGURES[name]))) == as_plotly_json(spec), "the page embeds the same JSON"


def test_a_misspelled_property_fails_the_oracle() -> None:
    fig = common.figure("t", x="x", y="y")
    fig.add_bar(x=[1], y=[2], marker_colour="#000000")  # the British spelling plotly doesn't know
    with pytest.raises(ValueError, match="colour"):
        validated(fig.to_plotly_json())
    fig = common.figure("t", x="x", y="y")
    fig.update_layout(barmod="stack")
    with pytest.raises(ValueError, match="barmod"):
        validated(fig.to_plotly_json())


@pytest.mark.parametrize(
    "arguments",
    [
        {"specs": [[{"secondary_y": True}]]},
        {"rows": 1, "cols": 3, "subplot_titles": ("a", "b", "c"), "horizontal_spacing": 0.09},
        {
            "rows": 2,
            "cols": 1,
            "shared_xaxes": True,
            "specs": [[{"secondary_y": True}], [{}]],
            "row_heights": [0.65, 0.35],
            "vertical_spacing": 0.08,
        },
    ],
)
def test_subplots_put_each_trace_on_the_axes_make_subplots_gives_it(arguments: dict[str, Any]) -> None:
    ours = common.subplots("t", height=300, **arguments)
    theirs = make_subplots(figure=go.Figure(layout=common.house_layout("t", height=300)), **arguments)
    theirs.update_xaxes(automargin=True)
    theirs.update_yaxes(automargin=True)
    rows, cols = arguments.get("rows", 1), arguments.get("cols", 1)
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            for secondary in (
                (False, True) if (arguments.get("specs") or [[{}] * cols] * rows)[r - 1][c - 1].get("secondary_y") else (False,)
            ):
                kwargs = {"secondary_y": True} if secondary else {}
                ours.add_scatter(name=f"{r},{c},{secondary}", x=[1], y=[r], row=r, col=c, **kwargs)
                theirs.add_scatter(name=f"{r},{c},{secondary}", x=[1], y=[r], row=r, col=c, **kwargs)
                ours.update_yaxes(title_text=f"{r}{c}{secondary}", row=r, col=c, secondary_y=secondary)
                theirs.update_yaxes(title_text=f"{r}{c}{secondary}", row=r, col=c, secondary_y=secondary)
    ours.update_xaxes(title_text="x", row=rows, col=1)
    theirs.update_xaxes(title_text="x", row=rows, col=1)
    assert as_plotly_json(ours.to_plotly_json()) == as_plotly_json(theirs.to_plotly_json())


def test_a_trace_on_a_subplot_the_grid_lacks_is_refused_by_name() -> None:
    fig = common.subplots("t", rows=1, cols=2)
    with pytest.raises(ValueError, match="row 1, col 2 with a secondary y"):
        fig.add_bar(x=[1], y=[1], row=1, col=2, secondary_y=True)


def test_a_run_name_that_closes_the_script_tag_is_escaped() -> None:
    name = "</script><script>alert(1)</script>&"
    fig = compare.throughput([(name, make_document().model_dump(mode="json"))])
    text = str(figure_json(fig))
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["data"][0]["x"] == [name]
