"""The memory timeline figures (run page and compare), built from documents: pure, no browser."""

from __future__ import annotations

from backend.figures import compare, memory, run
from backend.figures.common import MIB
from tests.ui.factories import make_document, with_memory_timeline


def _doc(*, gathered: bool, strategy: str) -> dict:
    return with_memory_timeline(make_document(strategy=strategy), gathered=gathered).model_dump(mode="json")


def test_an_untraced_run_says_so_instead_of_an_empty_chart() -> None:
    for fig in (run.run_figures(make_document().model_dump(mode="json"))["memory_timeline"], memory.compare_timelines([("a", {})])):
        assert fig.data == []
        assert [a["text"] for a in fig.layout["annotations"]] == [memory.NOT_TRACED]


def test_run_page_stacks_the_categories_to_the_allocated_bytes_and_hover_names_phase_and_category() -> None:
    doc = _doc(gathered=True, strategy="fsdp")
    fig = run.run_figures(doc)["memory_timeline"]
    stacked = [t for t in fig.data if t.get("stackgroup")]
    assert [t["name"] for t in stacked] == list(memory.COLOURS)
    points = doc["ranks"][0]["memory_timeline"]
    for i, p in enumerate(points):
        assert abs(sum(t["y"][i] for t in stacked) - p["allocated"] / MIB) < 1e-9
    assert stacked[0]["text"][0] == "forward layers.0 (FSDP::all_gather)"
    assert all(t["name"] in t["hovertemplate"] for t in stacked) and "%{text}" in stacked[0]["hovertemplate"]
    assert fig.layout["hovermode"] == "x unified"
    ticks = fig.layout["xaxis"]["ticktext"]
    assert ticks[:2] == ["forward layers.0", "forward layers.1"] and ticks[-1] == "optimizer"
    peak = next(t for t in fig.data if t["name"] == "peak")
    assert peak["y"] == [max(p["allocated"] for p in points) / MIB]


def test_compare_aligns_runs_by_phase_and_explains_the_peak_by_category() -> None:
    ddp, fsdp = _doc(gathered=False, strategy="ddp"), _doc(gathered=True, strategy="fsdp")
    fig = compare.compare_figures([("ddp ×2", ddp), ("fsdp ×2", fsdp)])["memory_timeline"]
    order = fig.layout["xaxis"]["ticktext"]
    assert [t["name"] for t in fig.data] == ["ddp ×2", "fsdp ×2", "ddp ×2, predicted", "fsdp ×2, predicted"]
    assert [t["line"].get("dash") for t in fig.data] == [None, None, "dash", "dash"]
    fsdp_curve = memory.predicted(fsdp, fsdp["ranks"][0])
    assert fsdp_curve is not None and fig.data[3]["y"][0] == fsdp_curve[0].allocated / MIB
    for trace, doc in zip(fig.data[:2], (ddp, fsdp), strict=True):
        for x, p in zip(trace["x"], doc["ranks"][0]["memory_timeline"], strict=True):
            assert order.index(p["phase"]) <= x < order.index(p["phase"]) + 1  # the same unit in both runs
    diff = memory.peak_difference(ddp["ranks"][0]["memory_timeline"], fsdp["ranks"][0]["memory_timeline"])
    peaks = [max(p["allocated"] for p in d["ranks"][0]["memory_timeline"]) for d in (ddp, fsdp)]
    assert sum(diff.values()) == peaks[1] - peaks[0] and diff["comm_buffers"] == 1 << 20
    assert "comm_buffers +1.00" in fig.layout["title"]["text"]


def test_run_page_draws_the_predicted_curve_and_rss_beside_and_names_the_largest_gap() -> None:
    doc = _doc(gathered=True, strategy="fsdp")
    fig = run.run_figures(doc)["memory_timeline"]
    predicted = next(t for t in fig.data if t["name"] == memory.PREDICTED)
    gaps = memory.prediction_gaps(doc)
    assert gaps is not None
    order = fig.layout["xaxis"]["ticktext"]
    # one level per measured phase, across that phase's unit
    levels = {order[int(x)]: y for x, y in zip(predicted["x"], predicted["y"], strict=True)}
    assert list(levels) == order and {r["phase"]: r["predicted"] / MIB for r in gaps["phases"]} == levels
    assert gaps["sentence"] in fig.layout["title"]["text"] and gaps["largest"]["phase"] in gaps["sentence"]
    rss = next(t for t in fig.data if t["name"] == memory.OUTSIDE["rss"])
    assert rss["yaxis"] == "y2" and fig.layout["yaxis2"]["overlaying"] == "y"  # its own scale, the same phases
    assert memory.ALLOCATED in fig.layout["yaxis"]["title"]["text"]
    # a document without the model stored says so, and draws no predicted curve
    doc["prediction"].pop("memory_curve")
    fig = run.run_figures(doc)["memory_timeline"]
    assert memory.PREDICTED not in [t["name"] for t in fig.data] and "no memory model" in fig.layout["title"]["text"]
    assert memory.prediction_gaps(doc) is None
    # nor does one whose stored block is not the model's inputs (an upload states its own prediction)
    for bad in ([{"params": -1}], [{"nonsense": 1}], "not a list", [7]):
        doc["prediction"]["memory_curve"] = bad
        fig = run.run_figures(doc)["memory_timeline"]
        assert memory.PREDICTED not in [t["name"] for t in fig.data] and memory.prediction_gaps(doc) is None, bad


def test_peak_tables_add_up_to_each_ranks_peak() -> None:
    doc = _doc(gathered=True, strategy="fsdp")
    tables = memory.peak_tables(doc)
    assert [t["rank"] for t in tables] == sorted(r["rank"] for r in doc["ranks"])
    for t in tables:
        assert sum(r["bytes"] for r in t["rows"]) == t["allocated"] and abs(sum(r["share"] for r in t["rows"]) - 1) < 1e-9
    assert memory.peak_tables(make_document().model_dump(mode="json")) == []
