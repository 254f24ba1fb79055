"""The merge (`workers.aggregate.build_result`) runs the matching on the ranks' records: synthetic
records, no torchrun (the real ones come from test_stragglers.py's gloo job)."""

from __future__ import annotations

import pytest

from parallab.core.result import ModelStateBytes, RankRecord
from parallab.core.stragglers import CollectiveArrival, columns
from tests.workers.conftest import make_job
from workers.aggregate import build_result


def _records(*, traced: bool = True, late: int = 1) -> list[RankRecord]:
    def arrivals(rank: int) -> list[CollectiveArrival]:
        delay = 4000.0 if rank == late else 0.0
        return [
            CollectiveArrival(group="0,1", seq=i, op="all_reduce", arrive_us=i * 1e4 + delay, end_us=i * 1e4 + 4500.0) for i in range(30)
        ]

    return [
        RankRecord(
            rank=r,
            model_state_bytes=ModelStateBytes(params=1, grads=1, optimizer=1),
            step_times_s=[0.1, 0.1],
            profiled_steps=3 if traced else 0,
            collective_times=columns(arrivals(r)) if traced else None,
        )
        for r in range(2)
    ]


def test_the_merge_matches_collectives_and_names_the_straggler():
    doc = build_result(make_job("ddp", 2), _records())
    assert doc.collectives_matched is not None
    assert [(g.group, g.dim, g.matched) for g in doc.collectives_matched.groups] == [("0,1", "dp_replicate", 30)]
    assert [s.rank for s in doc.summary.stragglers or []] == [1]
    assert doc.summary.stragglers[0].wait_caused_s_per_step == pytest.approx(30 * 4e-3 / 3)
    assert "collective_times" not in doc.ranks[0].model_dump()  # merged, not stored per rank


def test_an_untraced_run_is_not_analysed():
    doc = build_result(make_job("ddp", 2, trace=False), _records(traced=False))
    assert doc.collectives_matched is None and doc.summary.stragglers is None


def test_a_traced_run_whose_ranks_gave_no_times_is_not_called_clean():
    records = [r.model_copy(update={"collective_times": None}) for r in _records()]
    doc = build_result(make_job("ddp", 2), records)
    assert doc.summary.stragglers is None  # not "no rank stands out": nothing was matched
    assert doc.collectives_matched is not None
    assert [s.rank for s in doc.collectives_matched.skipped] == [0, 1]


CUT = "the profiler's trace could not be read (the trace ends at byte 4096); its analyses were skipped"


def test_a_rank_whose_trace_was_cut_short_is_skipped_saying_so_and_the_rest_is_kept():
    records = _records()
    records[1] = records[1].model_copy(update={"collective_times": None, "trace_note": CUT})
    doc = build_result(make_job("ddp", 2), records)
    assert doc.collectives_matched is not None and doc.critical_path is None  # no rank gave step segments here
    (skip,) = doc.collectives_matched.skipped
    assert skip.rank == 1 and skip.reason == f"no collective times: {CUT}"
    assert doc.summary.step_time_s.median == pytest.approx(0.1)  # the run's other figures stay
    # a note beside a trace that was analysed (kept in part, over the cap) is not a reason to skip
    kept = [r.model_copy(update={"trace_note": "trace over 16 bytes; kept the last profiled step only"}) for r in _records()]
    assert build_result(make_job("ddp", 2), kept).collectives_matched.skipped == []
