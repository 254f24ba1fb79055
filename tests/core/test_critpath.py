"""The critical path and the ranks' split steps on synthetic segments (`parallab.core.critpath`)."""

from __future__ import annotations

import pytest

from parallab.core.critpath import COLL, COMPUTE, RECV, SEND, StepSegments, analyse, arrivals, op_class, partition

MESH = [("pp", 2), ("dp_shard", 2)]


def seg(t0: float, t1: float, *rows: tuple[str, str, str, int, float, float]) -> StepSegments:
    s = StepSegments(start_us=t0, end_us=t1)
    for row in rows:
        s.add(*row)
    return s


def two_ranks(late: float = 0.0, base: float = 0.0) -> dict[int, StepSegments]:
    """Rank 1 computes `late` µs longer, then both all-reduce on group 0,1 for 100 µs."""
    return {
        0: seg(
            base,
            base + 1000 + late,
            (COMPUTE, "matmul", "", -1, base, base + 800),
            (COLL, "all_reduce", "0,1", 0, base + 800, base + 900 + late + 100),
        ),
        1: seg(
            base,
            base + 1000 + late,
            (COMPUTE, "matmul", "", -1, base, base + 800 + late),
            (COLL, "all_reduce", "0,1", 0, base + 800 + late, base + 1000 + late),
        ),
    }


def test_op_classes():
    assert op_class("aten::addmm") == op_class("aten::mm") == op_class("autograd::engine::evaluate_function: MmBackward0") == "matmul"
    assert op_class("aten::_scaled_dot_product_efficient_attention") == "attention"
    assert op_class("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert op_class("aten::add_", in_optimizer=True) == "optimizer"
    assert op_class("aten::_foreach_add_") == "optimizer"
    assert op_class("aten::native_layer_norm") == op_class("aten::gelu") == op_class("aten::t") == "norms and elementwise"


def test_a_split_step_covers_the_step_and_splits_the_wait_from_the_transfer():
    steps = two_ranks(late=300)
    pieces = partition(steps[0], arrivals(steps), MESH)
    assert pieces[0].start == 0 and pieces[-1].end == 1300
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
    by = {p.part: p.end - p.start for p in pieces}
    # rank 0 arrived at 800, rank 1 at 1100: 300 µs of wait, then 200 µs of transfer
    assert by == {"compute matmul": 800, "wait dp_shard all_reduce": 300, "transfer dp_shard all_reduce": 200}


def test_the_path_moves_to_the_rank_that_arrived_last():
    cp = analyse({r: [s] for r, s in two_ranks(late=300).items()}, world_size=2, mesh=[("dp_shard", 2)])
    assert cp is not None and cp.steps == 1 and not cp.skipped
    # the path runs through rank 1's 1100 µs of compute, never through rank 0's wait
    assert cp.parts_s == pytest.approx({"compute matmul": 1100e-6, "transfer dp_shard all_reduce": 200e-6})
    assert cp.length_s == pytest.approx(1300e-6)
    assert [(s.rank, s.part) for s in cp.path] == [(1, "compute matmul"), (0, "transfer dp_shard all_reduce")] or [
        (s.rank, s.part) for s in cp.path
    ] == [(1, "compute matmul"), (1, "transfer dp_shard all_reduce")]
    assert cp.rank_parts_s["wait dp_shard all_reduce"] == pytest.approx(300e-6 / 2)


def test_without_a_member_of_its_group_a_collective_is_unmatched_not_transfer():
    steps = two_ranks(late=300)
    cp = analyse({0: [steps[0]]}, world_size=2, mesh=[("dp_shard", 2)])
    assert cp is not None and [s.rank for s in cp.skipped] == [1] and "no record" in cp.skipped[0].reason
    assert cp.parts_s == pytest.approx({"compute matmul": 800e-6, "unmatched dp_shard all_reduce": 500e-6})


def pipeline() -> dict[int, StepSegments]:
    """Stage 0 computes 0–500, sends 500–520 and idles to 990; stage 1 posts its receive at 0,
    gets it at 520 and computes to 1000, the step's end."""
    return {
        0: seg(0, 990, (COMPUTE, "matmul", "", -1, 0, 500), (SEND, "pp send", "p2p:0->2", 0, 500, 520)),
        2: seg(0, 1000, (RECV, "pp recv", "p2p:0->2", 0, 0, 520), (COMPUTE, "attention", "", -1, 520, 1000)),
    }


def test_a_stage_waiting_for_its_input_is_the_bubble_on_the_path():
    cp = analyse({r: [s] for r, s in pipeline().items()}, world_size=4, mesh=MESH)
    assert cp is not None
    assert cp.parts_s == pytest.approx({"compute attention": 480e-6, "bubble": 500e-6, "transfer pp recv": 20e-6})
    assert {s.part for s in cp.path} == {"compute attention", "bubble", "transfer pp recv"}


def test_a_truncated_trace_is_named_and_the_steps_every_rank_holds_are_analysed():
    steps = [two_ranks(late=300, base=i * 10_000) for i in range(3)]
    cp = analyse({0: [s[0] for s in steps], 1: [s[1] for s in steps[:2]]}, world_size=2, mesh=[("dp_shard", 2)])
    assert cp is not None and cp.steps == 2
    assert [(s.rank, "truncated" in s.reason and "2 of the 3" in s.reason) for s in cp.skipped] == [(1, True)]


def test_a_record_from_another_run_is_left_out_and_named():
    ours = [two_ranks(late=300) for _ in range(1)]
    a = {r: [s] for r, s in ours[0].items()}
    extra = two_ranks(late=0, base=3.6e9)[0]  # an hour later: another run's rank record
    cp = analyse({**a, 2: [extra]}, world_size=3, mesh=[("dp_shard", 3)])
    assert cp is not None and cp.ranks == [0, 1]
    assert [(s.rank, "another run" in s.reason) for s in cp.skipped] == [(2, True)]
    assert cp.length_s == pytest.approx(1300e-6)


def test_bad_segments_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="kind"):
        StepSegments(start_us=0, end_us=1, kind=["bogus"], label=[""], key=[""], seq=[0], start=[0], end=[1])
    with pytest.raises(ValueError, match="one length"):
        StepSegments(start_us=0, end_us=1, kind=["compute"], label=[], key=[""], seq=[0], start=[0], end=[1])


def test_a_step_whose_segments_cannot_be_read_is_named_and_the_others_analysed():
    good = [two_ranks(late=300, base=i * 10_000) for i in range(2)]
    bad = two_ranks(late=0, base=20_000)
    bad[0].key[-1] = bad[1].key[-1] = "rank0,rank1"  # not a group of global ranks
    cp = analyse({r: [g[r] for g in good] + [bad[r]] for r in (0, 1)}, world_size=2, mesh=[("dp_shard", 2)])
    assert cp is not None and cp.steps == 2 and cp.length_s == pytest.approx(1300e-6)
    assert [(s.rank, "unreadable" in s.reason and "step 2" in s.reason) for s in cp.skipped] == [(None, True)]
