"""What the run and compare pages draw: the step-time split, the memory split beside the prediction,
the bytes per op, exposed communication and the gradient check."""

from __future__ import annotations

import pytest

from backend.figures import compare as compare_figs
from backend.figures import palette
from backend.figures import run as run_figs
from backend.figures.common import MIB, SPLIT_COLOURS, step_parts, step_split
from tests.ui.factories import make_document


def test_step_split_without_a_pipeline() -> None:
    parts = step_parts({"step_times_s": [0.9, 1.0, 1.1], "comm": [{"time_s": 0.3}, {"time_s": 0.1}]})
    assert parts == pytest.approx({"compute": 0.6, "communication": 0.4, "bubble": 0.0})


def test_pipeline_bubble_is_carved_out_of_the_receive_time_not_counted_twice() -> None:
    # 0.5 s of P2P per step, of which 0.3 s is the stage waiting for its neighbour (the bubble).
    parts = step_parts({"step_times_s": [1.0], "comm": [{"time_s": 0.4}, {"time_s": 0.1}], "bubble_fraction": 0.3})
    assert parts == pytest.approx({"compute": 0.5, "communication": 0.2, "bubble": 0.3})
    assert sum(parts.values()) == pytest.approx(1.0)


# ---- issue #9: the measured step-time split and memory split, beside the prediction ----


def breakdown(**parts: float) -> dict:
    return {"step_time_breakdown": {"compute_s": 0.0, "exposed_comm_s": 0.0, "overlapped_comm_s": 0.0, "idle_s": 0.0, **parts}}


def test_overlapped_comm_is_carved_out_of_compute_and_the_parts_sum_to_the_step() -> None:
    # compute 0.7 s of which 0.2 s had communication running beneath, 0.1 s exposed, 0.2 s idle
    split = step_split(breakdown(compute_s=0.7, overlapped_comm_s=0.2, exposed_comm_s=0.1, idle_s=0.2, step_s=1.0))
    assert split == pytest.approx({"compute": 0.5, "overlapped comm": 0.2, "exposed comm": 0.1, "idle / bubble": 0.2})
    assert sum(split.values()) == pytest.approx(1.0)


def test_a_breakdown_whose_four_parts_already_sum_to_the_step_is_drawn_as_it_is() -> None:
    split = step_split(breakdown(compute_s=0.5, overlapped_comm_s=0.2, exposed_comm_s=0.1, idle_s=0.2, step_s=1.0))
    assert split == pytest.approx({"compute": 0.5, "overlapped comm": 0.2, "exposed comm": 0.1, "idle / bubble": 0.2})
    assert step_split({"step_times_s": [1.0]}) is None


@pytest.mark.parametrize("strategy", ["ddp", "pp", "fsdp"])
def test_the_run_page_step_figure_stacks_each_rank_to_its_step_time(strategy) -> None:
    doc = make_document(strategy=strategy, world_size=2).model_dump(mode="json")
    fig = run_figs.step_breakdown(doc)
    assert [t["name"] for t in fig.data] == list(SPLIT_COLOURS)
    assert fig.data[1]["marker"]["pattern"]["shape"] == "/"  # overlapped communication hatched, apart
    for i, rank in enumerate(doc["ranks"]):
        total_ms = sum(trace["x"][i] for trace in fig.data)
        assert total_ms == pytest.approx(rank["step_time_breakdown"]["step_s"] * 1e3)


def test_the_memory_figure_stacks_the_measured_split_beside_the_predicted_components() -> None:
    doc = make_document(strategy="fsdp", world_size=2).model_dump(mode="json")
    fig = run_figs.memory_per_rank(doc)
    measured = {t["name"]: t for t in fig.data if not t["name"].endswith("(predicted)")}
    predicted = {t["name"].removesuffix(" (predicted)"): t for t in fig.data if t["name"].endswith("(predicted)")}
    assert list(measured) == ["params", "grads", "optimizer", "activations", "temporaries", "other"]
    assert list(predicted) == ["params", "grads", "optimizer", "activations"]
    rank0 = doc["ranks"][0]
    assert sum(t["y"][0] for t in measured.values()) == pytest.approx(rank0["peak_allocated_bytes"] / MIB)
    assert predicted["activations"]["y"][0] == pytest.approx(doc["prediction"]["activation_bytes_per_rank"] / MIB)
    # hatched, and filled: plotly's default pattern fill mode leaves the bar itself transparent
    assert predicted["params"]["marker"]["pattern"]["shape"] == "/"
    assert predicted["params"]["marker"]["pattern"]["bgcolor"] == measured["params"]["marker"]["color"]


def test_a_document_without_the_splits_falls_back_to_the_old_figures() -> None:
    doc = make_document(strategy="ddp", world_size=2).model_dump(mode="json")
    for rank in doc["ranks"]:
        del rank["step_time_breakdown"], rank["memory_breakdown"]
    assert [t["name"] for t in run_figs.step_breakdown(doc).data] == ["compute", "communication", "bubble"]
    assert [t["name"] for t in run_figs.memory_per_rank(doc).data][:4] == ["params", "grads", "optimizer", "other"]


def test_the_volume_figure_shows_buffer_and_wire_measured_and_predicted() -> None:
    doc = make_document(strategy="ddp", world_size=4).model_dump(mode="json")
    fig = run_figs.comm_volume(doc)
    assert [t["name"] for t in fig.data] == ["buffer, measured", "buffer, predicted", "wire, measured", "wire, predicted"]
    buffer, wire = fig.data[0]["y"][0], fig.data[2]["y"][0]
    assert wire == pytest.approx(buffer * 2 * 3 / 4, rel=1e-6)  # all-reduce on 4 ranks: 2(n−1)/n
    assert all(t["marker"]["pattern"]["bgcolor"] == t["marker"]["color"] for t in fig.data if "pattern" in t["marker"])
    assert run_figs.comm_volume(make_document(strategy="single", world_size=1).model_dump(mode="json")) is None


def test_compare_figures_show_exposed_communication_and_the_gradient_check() -> None:
    good = make_document(strategy="ddp", world_size=2).model_dump(mode="json")
    bad = make_document(strategy="fsdp", world_size=2, gradient_error=0.5).model_dump(mode="json")
    figures = compare_figs.compare_figures([("ddp", good), ("fsdp", bad)])
    exposure = figures["exposure"]
    assert [t["name"] for t in exposure.data] == ["communication (all)", "exposed (no compute overlaps it)"]
    assert exposure.data[1]["y"][0] == pytest.approx(good["summary"]["exposed_comm_fraction"] * 100)
    gradients = figures["gradients"]
    assert list(gradients.data[0]["y"]) == pytest.approx([3e-7, 0.5]) and gradients.layout["yaxis"]["type"] == "log"
    assert list(gradients.data[0]["marker"]["color"]) == [palette.VERDICT["passed"], palette.VERDICT["failed"]]
    steps = figures["steps"]
    assert "exposed comm" in [t["name"] for t in steps.data]


def test_an_interleaved_pipelines_bubble_is_drawn_per_rank_with_its_stages_and_formula() -> None:
    """Two chunks a rank at pp=2 beside dp_shard=2 (pp outermost: ranks 0, 1 are pp rank 0)."""
    pipeline = {"virtual_stages": 2, "stages_per_rank": [[0, 2], [1, 3]], "bubble_formula": "(p−1)/(v·m+p−1)"}
    doc = {
        "ranks": [{"rank": r, "bubble_fraction": b} for r, b in enumerate([0.4, 0.5, 0.3, 0.2])],
        "prediction": {"bubble_fraction": 1 / 9, "pipeline": pipeline},
    }
    fig = run_figs.pipeline_bubble(doc)
    assert fig is not None
    bars, theory = fig.data
    assert list(bars["x"]) == ["rank 0: stages 0, 2", "rank 1: stages 0, 2", "rank 2: stages 1, 3", "rank 3: stages 1, 3"]
    assert list(bars["y"]) == pytest.approx([40, 50, 30, 20])
    assert theory["name"] == "theory (p−1)/(v·m+p−1)" and list(theory["y"]) == pytest.approx([100 / 9] * 4)
    one_stage = run_figs.pipeline_bubble({"ranks": doc["ranks"][:2], "prediction": {"bubble_fraction": 0.2}})
    assert one_stage is not None and list(one_stage.data[0]["x"]) == ["stage 0", "stage 1"]
    assert one_stage.data[1]["name"] == "theory (p−1)/(m+p−1)"
