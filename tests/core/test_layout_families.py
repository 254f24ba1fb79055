"""Folding a ranking by layout family: which family a row is in, which rows fold under a
family's best (the threshold's edges included), and the order of the folds."""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.layout_families import NEAR_IDENTICAL, fold_by_family, layout_family, near_identical
from parallab.core.ranking import MESH_DIMS, PlanRow


def row(strategy: str, world: int, step: float | None, options: dict[str, Any] | None = None, **mesh: int) -> PlanRow:
    """A fitting row of `strategy` on `world` ranks with a predicted step of `step` seconds."""
    return PlanRow(
        spec={"strategy": {"name": strategy, "world_size": world, "options": options or {}}},
        strategy=strategy,
        options=options or {},
        mesh={d: mesh.get(d, 1) for d in MESH_DIMS},
        precision="bf16",
        activation_checkpointing="none",
        grad_accumulation_steps=1,
        microbatches=None,
        micro_batch_size=None,
        step_time_s=step,
    )


@pytest.mark.parametrize(
    ("strategy", "world", "options", "family"),
    [
        ("single", 1, {}, "single"),
        ("fsdp", 8, {}, "fsdp"),
        ("ddp", 8, {}, "dp"),
        ("hsdp", 8, {"dp_replicate": 2}, "dp×fsdp"),
        ("hybrid", 8, {"tp": 2}, "tp×fsdp"),
        ("3d", 8, {"pp": 2, "tp": 2}, "pp×tp×fsdp"),
        ("tp", 8, {}, "tp"),
    ],
)
def test_a_family_is_the_dimensions_with_degree_above_one(strategy, world, options, family):
    assert layout_family(row(strategy, world, 1.0, options)) == family


def test_a_strategy_without_a_layout_falls_back_to_the_rows_mesh():
    assert layout_family(row("no-such-strategy", 8, 1.0, tp=2, pp=4)) == "pp×tp"
    assert layout_family(row("no-such-strategy", 8, 1.0, dp=8)) == "dp"


def test_the_threshold_is_inclusive_and_nothing_past_it_folds():
    best = row("fsdp", 8, 0.2)
    edge = row("fsdp", 8, 0.2 * (1 + NEAR_IDENTICAL))
    past = row("fsdp", 8, 0.2 * (1 + NEAR_IDENTICAL) * 1.0001)
    assert near_identical(edge, best) and not near_identical(past, best)
    assert not near_identical(row("fsdp", 8, None), best) and not near_identical(best, row("fsdp", 8, None))
    assert near_identical(past, best, threshold=0.05) and not near_identical(edge, best, threshold=0.0)


def test_each_family_gets_its_fastest_row_on_top_and_its_close_variants_under_it():
    rows = [  # a ranking: fastest first
        row("fsdp", 8, 1.00),
        row("fsdp", 8, 1.02, {"reshard_after_forward": False}),
        row("hybrid", 8, 1.025, {"tp": 2}),
        row("fsdp", 8, 1.03),
        row("hybrid", 8, 1.05, {"tp": 2}),
        row("fsdp", 8, 1.20),
        row("tp", 8, 3.0),
    ]
    folds = fold_by_family(rows)
    assert [f.family for f in folds] == ["fsdp", "tp×fsdp", "tp"]
    fsdp, hybrid, tp = folds
    assert fsdp.best.rank == 1 and [v.rank for v in fsdp.variants] == [2, 4] and fsdp.others == 1
    # 1.05 is 2.4% over 1.025: a variant of its own family's best, not of the overall best
    assert hybrid.best.rank == 3 and [v.rank for v in hybrid.variants] == [5] and hybrid.others == 0
    assert tp.best.rank == 7 and tp.variants == [] and tp.others == 0
    assert sum(1 + len(f.variants) + f.others for f in folds) == len(rows)  # every row accounted for


def test_a_family_whose_best_has_no_estimate_comes_last_and_folds_nothing():
    folds = fold_by_family([row("tp", 8, None), row("tp", 8, None), row("fsdp", 8, 2.0)])
    assert [f.family for f in folds] == ["fsdp", "tp"]
    assert folds[1].best.rank == 1 and folds[1].variants == [] and folds[1].others == 1


def test_a_negative_threshold_is_refused_by_name():
    with pytest.raises(ValueError, match="threshold"):
        fold_by_family([row("fsdp", 8, 1.0)], threshold=-0.01)
    assert fold_by_family([]) == []
