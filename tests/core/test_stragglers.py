"""The matching of collectives across ranks and the straggler rule, on synthetic records."""

from __future__ import annotations

import random

import pytest

from parallab.core.result import ResultDocument, Summary
from parallab.core.stragglers import CollectiveArrival, dim_of, match, name_stragglers

WORLD = "0,1,2,3"


def _records(
    late: int | None, delay_us: float, n: int = 30, *, jitter_us: float = 200.0, seed: int = 0, skew: dict[int, float] | None = None
) -> dict[int, list[CollectiveArrival]]:
    """4 ranks, `n` world all-reduces 10 ms apart; `late` enters each `delay_us` after the others;
    every rank's arrival jitters by up to `jitter_us`; `skew`: µs added to a rank's clock."""
    rng = random.Random(seed)
    out: dict[int, list[CollectiveArrival]] = {r: [] for r in range(4)}
    for seq in range(n):
        base = seq * 10_000.0
        arrive = {r: base + rng.uniform(0, jitter_us) + (delay_us if r == late else 0.0) for r in range(4)}
        end = max(arrive.values()) + 500.0
        for r in range(4):
            shift = (skew or {}).get(r, 0.0)
            out[r].append(CollectiveArrival(group=WORLD, seq=seq, op="all_reduce", arrive_us=arrive[r] + shift, end_us=end + shift))
    return out


def test_a_late_rank_is_named_with_its_share_and_the_wait_it_caused():
    m = match(_records(late=3, delay_us=5000.0), world_size=4, steps=3)
    named = name_stragglers(m)
    assert [s.rank for s in named] == [3]
    assert named[0].last_fraction == 1.0
    # each of the 3 others waits ≈ 5 ms (less its own jitter) in each of 30 collectives
    assert named[0].wait_caused_s == pytest.approx(3 * 30 * 5e-3, rel=0.05)
    assert named[0].wait_caused_s_per_step == pytest.approx(named[0].wait_caused_s / 3)
    assert all(e.transfer_us == pytest.approx(500.0) for e in m.examples)


def test_random_order_names_no_one_over_many_seeds():
    for seed in range(50):
        m = match(_records(late=None, delay_us=0.0, jitter_us=20_000.0, seed=seed), world_size=4)
        assert name_stragglers(m) == [], seed


def test_always_last_by_a_hair_is_not_named():
    m = match(_records(late=1, delay_us=300.0, jitter_us=100.0), world_size=4)
    assert m.ranks[1].last_fraction == 1.0
    assert name_stragglers(m) == []  # under 1 ms of wait caused per collective


def test_a_missing_rank_and_a_truncated_trace_are_reported_and_the_rest_matched():
    records = _records(late=2, delay_us=5000.0)
    records[1] = records[1][:20]  # its trace ends early
    del records[3]  # wrote no record
    m = match({**records, 0: records[0]}, world_size=4)
    assert {(s.rank, s.reason.split(" ")[0]) for s in m.skipped} == {(3, "no"), (1, "10")}
    assert "truncated" in next(s.reason for s in m.skipped if s.rank == 1)
    # a collective needs every member of its group: rank 3 missing leaves none of the world's matched
    assert m.groups[0].matched == 0 and m.groups[0].unmatched == 30
    # with rank 3 present, the truncated rank costs only its missing sequence numbers
    records = _records(late=2, delay_us=5000.0)
    records[1] = records[1][:20]
    m = match(records, world_size=4)
    assert (m.groups[0].matched, m.groups[0].unmatched) == (20, 10)
    assert [s.rank for s in name_stragglers(m)] == [2]
    untraced = match({0: records[0], 1: None, 2: records[2], 3: records[3]}, world_size=4)
    assert untraced.skipped[0].rank == 1 and "untraced" in untraced.skipped[0].reason


def test_a_record_from_another_run_is_skipped_saying_so_not_named_a_straggler():
    records = _records(late=None, delay_us=0.0)
    records[3] = _records(late=None, delay_us=0.0, seed=1, skew={3: 3.6e9})[3]  # the same job an hour later
    m = match(records, world_size=4)
    assert [(s.rank, "another run" in s.reason) for s in m.skipped] == [(3, True)]
    assert name_stragglers(m) == [] and 3 not in {r.rank for r in m.ranks}
    assert m.groups[0].matched == 0  # the world's collectives need rank 3: none matched, none guessed
    # the same record among the run's own: matched as usual
    assert match(_records(late=None, delay_us=0.0), world_size=4).skipped == []


def test_hosts_clocks_are_aligned_on_collective_ends():
    skewed = _records(late=0, delay_us=5000.0, skew={2: 8000.0, 3: 8000.0})
    naive = match(skewed, world_size=4)
    assert [s.rank for s in name_stragglers(naive)] != [0]  # 8 ms of clock skew hides the real straggler
    aligned = match(skewed, world_size=4, host_of={0: "a", 1: "a", 2: "b", 3: "b"})
    assert [s.rank for s in name_stragglers(aligned)] == [0]
    assert "aligned" in aligned.clock


def test_dimension_of_a_group():
    mesh = [("pp", 2), ("dp_shard", 2), ("tp", 2)]
    assert dim_of([0, 1], mesh) == "tp"
    assert dim_of([1, 3], mesh) == "dp_shard"
    assert dim_of([2, 6], mesh) == "pp"
    assert dim_of([0, 1, 2, 3], mesh) == "dp_shard+tp"
    assert dim_of([0], mesh) is None


def test_the_examples_are_capped_and_the_aggregates_count_everything():
    m = match(_records(late=2, delay_us=2000.0, n=200), world_size=4)
    assert len(m.examples) == 64
    assert m.groups[0].matched == 200
    assert sum(s.last for s in m.ranks) == 200


def test_stored_documents_without_the_new_fields_still_parse():
    assert Summary.model_validate({"tokens_per_s": 1.0, "step_time_s": {"median": 1.0, "p90": 1.0}}).stragglers is None
    assert "collectives_matched" in ResultDocument.model_fields
    assert ResultDocument.model_fields["collectives_matched"].default is None


def test_a_pair_in_random_order_names_no_one():
    """In a group of two, each rank is last half the time by chance: the share alone would name one."""
    rng = random.Random(1)
    for seed in range(50):
        n = 8 + seed % 5
        records: dict[int, list[CollectiveArrival]] = {0: [], 1: []}
        for seq in range(n):
            arrive = {r: seq * 50_000.0 + rng.uniform(0, 20_000.0) for r in (0, 1)}
            for r in (0, 1):
                end = max(arrive.values()) + 100
                records[r].append(CollectiveArrival(group="0,1", seq=seq, op="all_reduce", arrive_us=arrive[r], end_us=end))
        assert name_stragglers(match(records, world_size=2)) == [], seed


def test_a_rank_last_more_often_but_within_the_others_jitter_is_not_named():
    """A loaded host: every rank is now and then late by a few ms; rank 0 a little more often."""

    def run(lateness_us: float) -> list[int]:
        rng = random.Random(7)
        records: dict[int, list[CollectiveArrival]] = {r: [] for r in range(4)}
        for seq in range(40):
            base = seq * 50_000.0
            laggard = 0 if seq % 10 < 8 else rng.choice([1, 2, 3])
            late = lateness_us if laggard == 0 else 3000.0
            arrive = {r: base + rng.uniform(0, 200) + (late if r == laggard else 0.0) for r in range(4)}
            for r in range(4):
                records[r].append(CollectiveArrival(WORLD, seq, "all_reduce", arrive[r], max(arrive.values()) + 500))
        return [s.rank for s in name_stragglers(match(records, world_size=4))]

    assert run(3000.0) == []  # last in 80 % (beyond chance) but by the same 3 ms as the others
    assert run(20_000.0) == [0]  # the same share, by 20 ms: it stands out
