"""Pipeline schedules beyond GPipe and 1F1B: where each puts its stages, what it costs (from the
papers, worked by hand here), and what it refuses, naming the field and the numbers."""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.dims import pp
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.layout import SCHEDULES, Layout, last_stage_rank, p2p_per_microbatch, rank_stages, stage_rank
from parallab.core.prediction import predict
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec
from workers.strategies.pipeline import SCHEDULES as TORCH_SCHEDULES


def resolve(options: dict[str, Any], world: int = 2, strategy: str = "pp", **workload: Any) -> ResolvedJob:
    doc = {"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options}}
    return resolve_job(JobSpec.model_validate(doc), Limits())


def test_the_rank_side_has_a_torch_schedule_for_every_schedule_the_core_knows():
    assert set(TORCH_SCHEDULES) == set(SCHEDULES)


def test_interleaved_stages_loop_over_the_ranks_and_zbv_folds_them_in_a_v():
    assert [rank_stages(r, 4, 2, "interleaved_1f1b") for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [rank_stages(r, 2, 3, "interleaved_zb") for r in range(2)] == [[0, 2, 4], [1, 3, 5]]
    assert [rank_stages(r, 4, 2, "zbv") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [rank_stages(r, 4, 1, "1f1b") for r in range(4)] == [[0], [1], [2], [3]]
    # the head (and the loss) is on p−1 in a loop, on rank 0 in a V
    assert last_stage_rank(4, 2, "interleaved_1f1b") == 3 and last_stage_rank(4, 2, "zbv") == 0
    assert [stage_rank(k, 2, "zbv") for k in range(4)] == [0, 1, 1, 0]
    assert Layout(pp=2, virtual_stages=2, schedule="interleaved_1f1b").stage_layer_ranges(8) == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
        range(6, 8),
    ]


@pytest.mark.parametrize(("p", "v", "schedule", "boundaries"), [(2, 1, "1f1b", 1), (4, 1, "gpipe", 3), (2, 2, "interleaved_1f1b", 3),
                                                                (4, 3, "interleaved_1f1b", 11), (4, 2, "zbv", 6)])  # fmt: skip
def test_each_micro_batch_crosses_every_stage_boundary_between_two_ranks_once_each_way(p, v, schedule, boundaries):
    """A loop crosses v·p−1 boundaries (every one between ranks), a V 2p−2 (stages p−1 and p
    share a rank); each boundary is one send on each of its two ranks (activation forward,
    gradient back), so the ranks' sends add up to twice the boundaries."""
    per_rank = [p2p_per_microbatch(r, p, v, schedule) for r in range(p)]
    assert sum(per_rank) == 2 * boundaries
    if schedule == "interleaved_1f1b":  # the end ranks skip one boundary each (before stage 0, after the last)
        assert per_rank == [2 * v - 1] + [2 * v] * (p - 2) + [2 * v - 1]


@pytest.mark.parametrize(
    ("layout", "bubble", "formula"),
    [
        (Layout(pp=4, microbatches=8, schedule="1f1b"), 3 / 11, "(p−1)/(m+p−1)"),
        (Layout(pp=4, microbatches=8, schedule="gpipe"), 3 / 11, "(p−1)/(m+p−1)"),
        (Layout(pp=4, microbatches=8, schedule="interleaved_1f1b", virtual_stages=2), 3 / 19, "(p−1)/(v·m+p−1)"),
        (Layout(pp=2, microbatches=4, schedule="interleaved_1f1b", virtual_stages=2), 1 / 9, "(p−1)/(v·m+p−1)"),
        (Layout(pp=4, microbatches=8, schedule="interleaved_zb", virtual_stages=2), 3 / 51, "(p−1)/(3·v·m+p−1)"),
        (Layout(pp=4, microbatches=8, schedule="zbv", virtual_stages=2), 0.0, "= 0 at T_F = T_B = T_W"),
    ],
)
def test_the_bubble_is_the_papers(layout, bubble, formula):
    value, text = pp.bubble(layout)
    assert value == pytest.approx(bubble) and formula in text


def test_interleaving_keeps_the_first_stages_excess_of_activations_megatron_predicts():
    """Korthikanti et al. 2022, §4.2.3: under interleaving the first stage holds
    L·(1 + (p−1)/(p·v)) blocks' worth of one micro-batch's activations (1F1B: L)."""
    p, v, m, layers = 4, 2, 8, 16
    layout = Layout(pp=p, virtual_stages=v, microbatches=m, schedule="interleaved_1f1b")
    assert pp.in_flight(layout, 0) * layers // (p * v) == layers * (1 + (p - 1) / (p * v))
    assert pp.in_flight(layout, p - 1) == (v - 1) * p + 1  # the last rank: one round of chunks ahead, then 1F1B
    assert pp.in_flight(Layout(pp=p, microbatches=m, schedule="1f1b"), 0) == p


def test_a_prediction_names_the_schedule_its_formula_and_each_ranks_stages():
    job = resolve({"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 4})
    out = predict(job)
    assert out["bubble_fraction"] == pytest.approx(1 / 9)
    assert out["pipeline"] == {
        "schedule": "interleaved_1f1b",
        "pp": 2,
        "virtual_stages": 2,
        "microbatches": 4,
        "bubble_formula": "(p−1)/(v·m+p−1)",
        "stages_per_rank": [[0, 2], [1, 3]],
    }
    # 3 boundaries a micro-batch, each rank at 3 of them: 3× the P2P of 1F1B at the same p and m
    plain = predict(resolve({"schedule": "1f1b", "microbatches": 4}))
    assert {op: 3 * b for op, b in plain["comm_bytes_per_step"].items()} == out["comm_bytes_per_step"]
    # every rank still holds L/p blocks; ZB-V puts the embedding and the head on rank 0
    v_shape = resolve({"schedule": "zbv", "virtual_stages": 2, "microbatches": 4})
    assert v_shape.descriptor.param_elements_per_rank(v_shape)[0] > job.descriptor.param_elements_per_rank(job)[0]


@pytest.mark.parametrize(
    ("options", "workload", "loc", "says"),
    [
        ({"schedule": "interleaved_1f1b", "virtual_stages": 4}, {}, ("workload", "num_layers"),
         "layers (4) is not divisible by 8 stages (pp=2 × virtual_stages=4)"),
        ({"schedule": "1f1b", "virtual_stages": 2}, {}, ("strategy", "options", "virtual_stages"),
         "schedule 1f1b runs 1 stage(s) per rank, not virtual_stages=2"),
        ({"schedule": "gpipe", "virtual_stages": 2}, {}, ("strategy", "options", "virtual_stages"), "schedule gpipe runs 1 stage(s)"),
        ({"schedule": "zbv", "virtual_stages": 1}, {}, ("strategy", "options", "virtual_stages"),
         "schedule zbv runs 2 stage(s) per rank, not virtual_stages=1"),
        ({"schedule": "zbv", "virtual_stages": 2, "microbatches": 2}, {}, ("strategy", "options", "microbatches"),
         "needs micro-batches (2) at least 2·pp−1 = 3"),
        ({"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 5}, {"global_batch_size": 10},
         ("strategy", "options", "microbatches"), "runs micro-batches (5) in 2 rounds of pp=2: it must be a multiple of 2"),
    ],
)  # fmt: skip
def test_a_schedule_refuses_what_torch_would_naming_the_field_and_the_numbers(options, workload, loc, says):
    with pytest.raises(SpecError) as caught:
        resolve(options, **workload)
    found = [(p.loc, p.msg) for p in caught.value.problems]
    assert [p for p in found if p[0] == loc and says in p[1]], found


def test_without_a_pipeline_the_pipeline_options_are_no_part_of_the_layout():
    """pp=1 is a no-op: its options do not make a second config of the same layout."""
    assert resolve({"dp_shard": 2, "virtual_stages": 2, "microbatches": 8}, strategy="layout").descriptor.layout(
        2, resolve({"dp_shard": 2, "virtual_stages": 2}, strategy="layout").options
    ) == Layout(dp_shard=2)


def test_an_unknown_schedule_is_refused_naming_it():
    with pytest.raises(Exception) as caught:
        resolve({"schedule": "looped_bfs"})
    assert "schedule" in str(caught.value) and "interleaved_1f1b" in str(caught.value)


def test_the_planner_ranks_interleaved_1f1b_and_each_such_candidate_resolves():
    """The planner's grid is the runtime's: interleaved 1F1B over 2 chunks per rank is a candidate,
    ranked by its own bubble, and every fitting one resolves as a job the ranks run."""
    from parallab.core.hardware import load_catalogue
    from parallab.core.plan_hardware import Hardware
    from parallab.core.ranking import plan_cluster

    hw = Hardware(spec=load_catalogue().get("h100"), nodes=1, devices_per_node=2)
    ranking = plan_cluster({"model": "tiny"}, hw, world_size=2, precisions=("fp32",), checkpointing=("none",), accumulation=(1,))
    interleaved = [r for r in ranking.fits if r.strategy == "pp" and r.spec["strategy"]["options"]["schedule"] == "interleaved_1f1b"]
    assert len(interleaved) == 3, [r.label for r in ranking.fits]
    for row in interleaved:
        job = resolve_job(JobSpec.model_validate(row.spec), Limits(max_world_size=2))
        assert job.layout is not None and (job.layout.virtual_stages, job.layout.pp) == (2, 2), row.label
        assert job.descriptor.bubble_fraction(job) == pytest.approx(1 / (2 * job.layout.microbatches + 1))
