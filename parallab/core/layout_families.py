"""The ranking folded by layout family: the fastest configuration of each family on top, its
near-identical variants under it (the `/plan` page's first answer; the full ranking stays beside).

A ranking of every strategy × degree × precision × recomputation × accumulation lists many rows
that differ only in a knob that barely moves the step (accumulation 2 or 4, a recomputation mode
that costs nothing where activations are small): the question "which layout?" drowns in them.
A family is the set of parallel dimensions a configuration uses (degree > 1), so `fsdp` on 16
ranks and `fsdp` on 8 × `tp` 2 are different families, and FSDP with or without recomputation
is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from parallab.core.layout import DATA_PARALLEL, MeshAxisName
from parallab.core.ranking import PlanRow
from parallab.core.strategies import layout_of

NEAR_IDENTICAL = 0.03
"""A variant whose predicted step is within 3% of its family's best is folded under it: the
planner's estimate is not closer than a few percent to a measured step (its own gap tolerance is
far wider), and repeated runs of one configuration on one host differ by about that much, so rows
closer than this cannot be told apart by prediction and would be decided by measuring anyway."""

SHARDED = "fsdp"
"""Sharded data parallelism's name in a family (replicas are `DATA_PARALLEL`)."""

LAYOUT_DIMS: dict[str, str] = {
    **{axis.value: axis.value for axis in MeshAxisName},
    MeshAxisName.DP_REPLICATE.value: DATA_PARALLEL,
    MeshAxisName.DP_SHARD.value: SHARDED,
}
"""A layout's degree → its name in a family: its own, but replicas are `dp` and shards `fsdp`."""

FAMILY_ORDER: tuple[str, ...] = (
    *(axis.value for axis in (MeshAxisName.PP, MeshAxisName.TP, MeshAxisName.CP, MeshAxisName.EP)),
    DATA_PARALLEL,
    SHARDED,
)
"""How a family is spelled: outermost-first as a layout is usually described (`pp×tp×fsdp`)."""


def layout_family(row: PlanRow) -> str:
    """The dimensions of `row` with degree > 1, e.g. `fsdp`, `tp×fsdp`, `pp×tp×fsdp`; `single`
    for one rank. From the strategy's layout (which tells replicas from shards); where the
    strategy has none, from the row's mesh (its data-parallel degree counts as `dp`)."""
    world = int((row.spec.get("strategy") or {}).get("world_size") or 1)
    layout = layout_of(row.strategy, world, row.options)
    if layout is not None:
        used = {LAYOUT_DIMS[d] for d in LAYOUT_DIMS if getattr(layout, d) > 1}
    else:
        used = {d for d, degree in row.mesh.items() if degree > 1}
    return "×".join(d for d in FAMILY_ORDER if d in used) or "single"


@dataclass(frozen=True)
class Ranked:
    """A row and its place in the full ranking (1: the fastest predicted)."""

    rank: int
    row: PlanRow


@dataclass
class FamilyFold:
    """A family's fastest row, the rows within `NEAR_IDENTICAL` of it, and how many more it has."""

    family: str
    best: Ranked
    variants: list[Ranked] = field(default_factory=list)
    """Same family, predicted step within the threshold of `best`'s, fastest first."""
    others: int = 0
    """The family's rows further off: in the full ranking only."""


def near_identical(row: PlanRow, best: PlanRow, threshold: float = NEAR_IDENTICAL) -> bool:
    """Whether `row`'s predicted step is within `threshold` (relative) of `best`'s, bounds included.
    A row without an estimate is never near anything."""
    if row.step_time_s is None or best.step_time_s is None:
        return False
    return row.step_time_s <= best.step_time_s * (1 + threshold)


def fold_by_family(rows: Sequence[PlanRow], threshold: float = NEAR_IDENTICAL) -> list[FamilyFold]:
    """`rows` (a ranking's fits, fastest first) grouped by `layout_family`: one fold per family,
    in the order of their best rows. Each family's best is its fastest predicted row (ties: the
    earlier in the ranking); rows without an estimate rank after those with one."""
    if threshold < 0:
        raise ValueError(f"threshold: must be ≥ 0, got {threshold}")
    by_family: dict[str, list[Ranked]] = {}
    for rank, row in enumerate(rows, start=1):
        by_family.setdefault(layout_family(row), []).append(Ranked(rank, row))
    folds = []
    for family, members in by_family.items():
        ordered = sorted(members, key=lambda r: (r.row.step_time_s is None, r.row.step_time_s or 0.0, r.rank))
        best, rest = ordered[0], ordered[1:]
        variants = [r for r in rest if near_identical(r.row, best.row, threshold)]
        folds.append(FamilyFold(family, best, variants, len(rest) - len(variants)))
    return sorted(folds, key=lambda f: (f.best.row.step_time_s is None, f.best.row.step_time_s or 0.0, f.best.rank))
