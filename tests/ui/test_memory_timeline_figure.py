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
    for trace, doc in zip(fig.data, (ddp, fsdp), strict=True):
        for x, p in zip(trace["x"], doc["ranks"][0]["memory_timeline"], strict=True):
            assert order.index(p["phase"]) <= x < order.index(p["phase"]) + 1  # the same unit in both runs
    diff = memory.peak_difference(ddp["ranks"][0]["memory_timeline"], fsdp["ranks"][0]["memory_timeline"])
    peaks = [max(p["allocated"] for p in d["ranks"][0]["memory_timeline"]) for d in (ddp, fsdp)]
    assert sum(diff.values()) == peaks[1] - peaks[0] and diff["comm_buffers"] == 1 << 20
    assert "comm_buffers +1.00" in fig.layout["title"]["text"]
