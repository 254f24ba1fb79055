"""The summary formulas of shared/DESIGN.md (`parallab.core.metrics`), on hand-made rank records."""

from __future__ import annotations

import pytest

from parallab.core.metrics import (
    bandwidths_gbps,
    busbw_factor,
    exposed_comm_fraction,
    max_rel_diff,
    peak_flops_for,
    percentile,
    pipeline_bubble,
    summarize,
    unequal_stages_bubble,
)
from parallab.core.result import Summary
from parallab.core.rundir import RunDir


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [("all_reduce", 4, 1.5), ("all_gather", 4, 0.75), ("reduce_scatter", 2, 0.5), ("all_to_all", 8, 7 / 8), ("broadcast", 4, 1.0),
     ("send", 2, 1.0), ("all_reduce", 1, 1.0)],
)  # fmt: skip
def test_busbw_factors_are_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)


def test_bandwidths_in_gb_per_s():
    assert bandwidths_gbps("all_reduce", 2e9, 1.0, 2) == (pytest.approx(2.0), pytest.approx(2.0))
    assert bandwidths_gbps("all_reduce", 0, 1.0, 2) == (None, None)


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_peak_flops_are_known_for_named_devices_only():
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("cpu") is None and peak_flops_for(None) is None


def test_loss_diff_is_the_worst_relative_step():
    assert max_rel_diff([1.0, 2.2], [1.0, 2.0]) == pytest.approx(0.1)
    assert max_rel_diff([1.0], [0.0]) is None


def test_summary_takes_each_steps_slowest_rank_and_the_largest_comm_per_op():
    ranks = [
        {
            "step_times_s": [0.1, 0.3, 0.2],
            "comm": [{"op": "all_reduce", "bytes": 100}],
            "comm_time_fraction": 0.2,
            "peak_allocated_bytes": 10,
        },
        {
            "step_times_s": [0.2, 0.1, 0.2],
            "comm": [{"op": "all_reduce", "bytes": 300}],
            "comm_time_fraction": 0.4,
            "peak_allocated_bytes": 30,
        },
    ]
    s = summarize(ranks=ranks, tokens_per_step=1000, samples_per_step=4, flops_per_token=1e6, device_name="NVIDIA H100", world_size=2,
                  loss={"values": [2.0, 1.5], "reference": [2.0, 1.0]})  # fmt: skip
    assert s["step_time_s"]["median"] == pytest.approx(0.2)  # per-step max: 0.2, 0.3, 0.2
    assert s["tokens_per_s"] == pytest.approx(5000)
    assert s["tflops_per_s"] == pytest.approx(5000 * 1e6 / 1e12)
    assert s["mfu"] == pytest.approx(5000 * 1e6 / (989e12 * 2))
    assert s["comm_bytes_per_step"] == {"all_reduce": 300}
    assert (s["comm_time_fraction"], s["peak_allocated_bytes_max"]) == (0.4, 30)
    assert s["loss_max_rel_diff_vs_reference"] == pytest.approx(0.5)
    Summary.model_validate(s)
    assert s["exposed_comm_fraction"] is None  # no rank measured its exposed communication
    assert "wire_bytes_per_step" not in s  # no rank recorded wire bytes: an upload's stated figure stands


def test_wire_bytes_per_step_are_the_largest_over_ranks_by_op():
    ranks = [
        {
            "step_times_s": [0.1],
            "comm": [{"op": "all_reduce", "bytes": 400, "wire_bytes": 600}, {"op": "send", "bytes": 8, "wire_bytes": 8}],
        },
        {"step_times_s": [0.1], "comm": [{"op": "all_reduce", "bytes": 400, "wire_bytes": 700}]},
    ]
    s = summarize(ranks=ranks, tokens_per_step=1, samples_per_step=1, flops_per_token=None, device_name=None, world_size=2)
    assert s["wire_bytes_per_step"] == {"all_reduce": 700, "send": 8}
    Summary.model_validate(s)


def test_exposed_comm_fraction_is_the_worst_ranks_share_of_its_own_step():
    split = {"compute_s": 0.06, "overlapped_comm_s": 0.01, "idle_s": 0.01}
    ranks = [
        {"step_times_s": [0.05], "step_time_breakdown": {**split, "exposed_comm_s": 0.03, "step_s": 0.1}, "exposed_comm_time_s": 0.03},
        {"step_times_s": [0.05], "step_time_breakdown": {**split, "exposed_comm_s": 0.02, "step_s": 0.1}, "exposed_comm_time_s": 0.02},
        {"step_times_s": [0.05, 0.05, 0.2], "exposed_comm_time_s": 0.01},  # an upload without the split: over its median step
    ]
    s = summarize(ranks=ranks, tokens_per_step=1, samples_per_step=1, flops_per_token=None, device_name=None, world_size=3)
    assert s["exposed_comm_fraction"] == pytest.approx(0.3)  # the profiled step's own time, not the timed steps'
    assert exposed_comm_fraction(ranks[2]) == pytest.approx(0.2)
    assert exposed_comm_fraction({"step_times_s": [0.1]}) is None
    Summary.model_validate(s)


def test_a_run_directory_names_every_file_once(tmp_path):
    run = RunDir(tmp_path / "run").create()
    names = [run.job, run.log, run.progress, run.rank_record(0), run.rank_record(1), run.trace(0), run.raw_trace(0)]
    assert len({p.name for p in names}) == len(names) and all(p.parent == run.path for p in names)
    run.write_atomic(run.rank_record(0), b"{}")
    assert run.rank_record(0).read_bytes() == b"{}"
    assert sorted(p.name for p in run.path.iterdir()) == ["rank0.json"]  # no temp file left behind


# ---- the pipeline bubble: every stage's actions on one clock ----


def gpipe(m: int, *, forward: float = 1.0, backward: float = 1.0, last_extra: float = 0.0) -> list[list[list[tuple[float, float]]]]:
    """One GPipe step of 2 stages, `m` micro-batches: stage s's actions (start, end), ideal timing.
    `last_extra`: the last stage's head and loss make each of its forwards that much longer."""
    f1 = forward + last_extra
    s0 = [(i * forward, (i + 1) * forward) for i in range(m)]
    s1, t = [], forward
    for i in range(m):
        t = max(t, s0[i][1])
        s1.append((t, t + f1))
        t += f1
    for _ in range(m):
        s1.append((t, t + backward))
        t += backward
    t0 = s1[m][1]
    for i in range(m):
        start = max(t0, s1[m + i][1])
        s0.append((start, start + backward))
        t0 = start + backward
    return [[s0], [s1]]


@pytest.mark.parametrize("m", [4, 8])
def test_an_ideal_gpipe_schedule_meets_its_theory_on_every_stage(m):
    bubble = pipeline_bubble(gpipe(m))
    theory = (2 - 1) / (m + 2 - 1)
    assert bubble is not None
    assert bubble.per_stage == pytest.approx([theory, theory]) and bubble.mean == pytest.approx(theory)
    assert bubble.imbalance == pytest.approx(0.0)


def test_idle_before_the_first_and_after_the_last_action_counts():
    """What idle between a stage's own first and last action gives: the last stage of GPipe none at all."""
    (s1,) = gpipe(4)[1]
    own_window = max(b for _, b in s1) - min(a for a, _ in s1)
    assert own_window - sum(b - a for a, b in s1) == 0.0
    assert pipeline_bubble(gpipe(4)).per_stage[1] == pytest.approx(0.2)  # type: ignore[union-attr]


def test_a_slower_last_stage_is_imbalance_a_number_of_its_own():
    bubble = pipeline_bubble(gpipe(4, last_extra=0.5))
    assert bubble is not None and bubble.imbalance == pytest.approx(10 / 9 - 1)  # busy 10 vs 8: mean 9


@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("last_extra", [0.0, 0.25, 0.5, 1.0])
def test_the_unequal_stage_formula_is_what_an_ideal_schedule_with_a_slower_last_stage_idles(m, last_extra):
    """GPipe's timing by construction (`gpipe`) against (m−1)·max t + Σ t: the stages' measured mean
    idle is the formula's, and equal stages give (p−1)/(m+p−1)."""
    bubble = pipeline_bubble(gpipe(m, last_extra=last_extra))
    assert bubble is not None
    expected = unequal_stages_bubble(bubble.busy_per_stage, m)
    assert bubble.mean == pytest.approx(expected)
    if last_extra == 0.0:
        assert expected == pytest.approx(1 / (m + 1))
    else:
        assert expected > 1 / (m + 1)  # the imbalance's idle is on top of the fill and drain


def test_the_unequal_stage_formula_refuses_what_it_cannot_use():
    with pytest.raises(ValueError):
        unequal_stages_bubble([], 4)
    with pytest.raises(ValueError):
        unequal_stages_bubble([1.0, 1.0], 0)


def test_summarize_reports_the_mean_bubble_and_every_stage():
    ranks = [{"rank": s, "step_times_s": [1.0], "pipeline_actions_us": stage} for s, stage in enumerate(gpipe(4))]
    summary = summarize(ranks=ranks, tokens_per_step=1, samples_per_step=1, flops_per_token=None, device_name=None, world_size=2)
    assert summary["bubble_fraction"] == pytest.approx(0.2) and summary["bubble_per_stage"] == pytest.approx([0.2, 0.2])
    assert pipeline_bubble([]) is None and pipeline_bubble([[[]], [[]]]) is None
