"""The flight-recorder analysis (parallab.core.hangs) on synthetic dumps shaped as the harness
writes them (torch 2.13's gloo entries inside parallab's envelope). The real dumps of real hung
gloo jobs are checked in tests/workers/test_hangs.py."""

from __future__ import annotations

import json
from typing import Any

from parallab.core.hangs import FORMAT, analyse, kept, kept_files

RUN = "run-a"
WORLD = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}


def entry(group: str, seq: int, op: str, sizes: list[list[int]] | None = None, *, t: int = 0, p2p: bool = False) -> dict[str, Any]:
    sizes = [[8]] if sizes is None else sizes
    desc = {"0": "default_pg"}.get(group, "mesh_tp" if group in ("3", "4") else "")
    return {
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "is_p2p": p2p,
        "profiling_name": f"gloo:{op}",
        "process_group": [group, desc],
        "input_sizes": sizes,
        "input_dtypes": ["Float"] * len(sizes),
        "time_created_ns": t or seq * 1000,
        "state": "scheduled",
        "retired": True,
    }


def dump(
    rank: int,
    entries: list[dict[str, Any]],
    *,
    world: int = 4,
    run: str = RUN,
    groups: dict | None = None,
    reason: str = "stopped by SIGTERM",
) -> bytes:
    doc = {
        "format": FORMAT,
        "run": run,
        "rank": rank,
        "world_size": world,
        "reason": reason,
        "groups": groups if groups is not None else WORLD,
        "torch": {"version": "2.10", "entries": entries, "pg_config": {"": {"desc": "", "name": "", "ranks": "[]"}}},
    }
    return json.dumps(doc).encode()


def agreeing(upto: int) -> list[dict[str, Any]]:
    return [entry("0", s, "all_reduce") for s in range(1, upto + 1)]


def test_a_mismatch_names_the_sequence_both_calls_and_the_ranks() -> None:
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1]}}
    files = {
        0: dump(0, [*agreeing(2), entry("0", 3, "all_reduce", [[10]])], world=2, groups=groups),
        1: dump(1, [*agreeing(2), entry("0", 3, "barrier", [])], world=2, groups=groups),
    }
    report = analyse(files, world_size=2, run=RUN)
    assert report.sentence == (
        "hang: ranks disagree at collective 3 of the world group (ranks 0, 1): rank 0 called all_reduce(Float[10]); rank 1 called barrier"
    )
    assert (report.sequence, report.calls, report.never_arrived, report.problems) == (3, {0: "all_reduce(Float[10])", 1: "barrier"}, [], [])


def test_agreeing_dumps_name_nothing() -> None:
    report = analyse({r: dump(r, agreeing(5)) for r in range(4)}, world_size=4, run=RUN)
    assert report.sentence is None and report.sequence is None and report.dumps == dict.fromkeys(range(4), "ok")


def test_the_same_op_with_other_sizes_is_a_disagreement() -> None:
    files = {r: dump(r, [*agreeing(1), entry("0", 2, "all_reduce", [[8 if r else 16]])]) for r in range(4)}
    report = analyse(files, world_size=4, run=RUN)
    assert report.sequence == 2 and report.calls[0] == "all_reduce(Float[16])" and report.calls[3] == "all_reduce(Float[8])"
    assert "ranks 1, 2, 3 called all_reduce(Float[8])" in (report.sentence or "")


def test_a_rank_that_never_arrived_is_named_with_its_last_sequence() -> None:
    files = {r: dump(r, agreeing(4 if r == 2 else 5)) for r in range(4)}
    report = analyse(files, world_size=4, run=RUN)
    assert report.never_arrived == [2] and report.last_sequence == {2: 4} and report.sequence == 5
    assert report.sentence == (
        "hang: rank 2 never arrived at collective 5 of the world group (ranks 0, 1, 2, 3), where ranks 0, 1, 3 called "
        "all_reduce(Float[8]); last there: rank 2 at 4"
    )


def test_a_rank_that_failed_before_arriving_says_how() -> None:
    files = {r: dump(r, agreeing(5), reason="RuntimeError: Connection closed by peer") for r in range(3)}
    files[3] = dump(3, agreeing(4), reason="ValueError: the batch is empty\nmore lines")
    report = analyse(files, world_size=4, run=RUN)
    assert report.never_arrived == [3] and report.reasons[3].startswith("ValueError")
    assert (report.sentence or "").endswith("last there: rank 3 at 4; rank 3 had failed: ValueError: the batch is empty")


def test_the_ring_compares_only_what_every_rank_still_holds() -> None:
    # Rank 0's ring dropped sequences 1-3; the others hold them. Nothing there is a disagreement.
    files = {r: dump(r, [e for e in agreeing(6) if r or e["collective_seq_id"] > 3]) for r in range(4)}
    files[3] = dump(3, agreeing(5))
    report = analyse(files, world_size=4, run=RUN)
    assert report.sequence == 6 and report.never_arrived == [3]


def test_a_subgroup_is_named_by_its_dimension_and_the_earliest_disagreement_wins() -> None:
    groups = {**WORLD, "3": {"desc": "mesh_tp", "ranks": [0, 1]}, "4": {"desc": "mesh_tp", "ranks": [2, 3]}}
    late = [entry("0", 1, "all_reduce", t=100), entry("0", 2, "all_reduce", t=900)]
    files = {
        0: dump(0, [*late, entry("3", 1, "all_gather", t=500)], groups=groups),
        1: dump(1, [*late, entry("3", 1, "all_reduce", t=400)], groups=groups),
        2: dump(2, [late[0]], groups=groups),  # never reached the world's second
        3: dump(3, late, groups=groups),
    }
    report = analyse(files, world_size=4, run=RUN)
    assert report.group == "3" and report.group_ranks == [0, 1] and report.sequence == 1
    assert (report.sentence or "").startswith(
        "hang: ranks disagree at collective 1 of the tp group 3 (ranks 0, 1): rank 0 called all_gather"
    )


def test_point_to_point_operations_are_not_matched() -> None:
    files = {r: dump(r, [*agreeing(2), entry("0", 1 + r, "send" if r % 2 else "recv", p2p=True)]) for r in range(4)}
    assert analyse(files, world_size=4, run=RUN).sentence is None


def test_a_truncated_dump_is_reported_and_the_others_still_analysed() -> None:
    files = {r: dump(r, agreeing(3 if r == 1 else 4)) for r in range(4)}
    files[2] = files[2][: len(files[2]) // 2]
    report = analyse(files, world_size=4, run=RUN)
    assert report.dumps[2] == "truncated" and report.problems == ["rank 2's dump is truncated or not JSON"]
    assert report.never_arrived == [1]
    assert (report.sentence or "").endswith("(rank 2: no readable dump)")


def test_a_dump_from_another_run_is_reported_as_such_not_matched() -> None:
    files = {r: dump(r, agreeing(4)) for r in range(4)}
    files[3] = dump(3, agreeing(9), run="run-b")  # would read as the others never arriving at 5-9
    report = analyse(files, world_size=4, run=RUN)
    assert report.dumps[3] == "foreign" and report.problems == ["rank 3's dump is from another run (run-b), not this one (run-a)"]
    assert report.never_arrived == [] and (report.sentence or "").startswith("hang not located: rank 3's dump is from another run")
    assert "last at collective 4 of the world group (ranks 0, 1, 2, 3): ranks 0, 1, 2 called all_reduce(Float[8])" in (
        report.sentence or ""
    )


def test_missing_and_malformed_dumps_are_named() -> None:
    files: dict[int, bytes | None] = {0: dump(0, agreeing(4)), 1: None}
    files[2] = json.dumps(
        {"format": FORMAT, "run": RUN, "rank": 2, "world_size": 4, "torch": {"entries": [{"collective_seq_id": "x"}]}}
    ).encode()
    files[3] = b'{"entries": []}'  # torch's own dump, no envelope
    report = analyse(files, world_size=4, run=RUN)
    assert report.dumps == {0: "ok", 1: "missing", 2: "invalid", 3: "invalid"}
    assert report.problems[0] == "rank 1 left no dump (it died before it could write one, or its node's dumps never reached the lab)"
    assert report.problems[1].startswith("rank 2's dump is malformed: torch.entries.0.collective_seq_id:")
    assert report.problems[2].startswith("rank 3's dump is not a parallab flight-recorder dump")


def test_a_dump_filed_under_another_rank_or_world_is_not_trusted() -> None:
    files = {0: dump(0, agreeing(2), world=2), 1: dump(0, agreeing(2), world=2)}
    report = analyse(files, world_size=2, run=RUN)
    assert report.dumps == {0: "ok", 1: "foreign"} and report.problems == ["the dump filed as rank 1's was written by rank 0"]
    assert analyse({0: dump(0, agreeing(2), world=8)}, world_size=1, run=RUN).dumps == {0: "foreign"}


def test_no_dump_at_all_gives_no_sentence() -> None:
    report = analyse({}, world_size=2, run=RUN)
    assert report.sentence is None and report.dumps == {0: "missing", 1: "missing"}


def test_kept_analyses_every_rank_names_an_absent_one_and_gives_the_files_back() -> None:
    """Two nodes' dumps merged (ranks 0-1 on node 0, 2-3 on node 1, rank 3's never came): every
    rank is in the kept value, rank 3 named missing; the files come back out for a late merge."""
    files: dict[int, bytes | str | None] = {r: dump(r, [*agreeing(2), entry("0", 3, "all_reduce")]) for r in range(3)}
    value = kept(files, world_size=4, run=RUN)
    assert value is not None and sorted(value["dumps"]) == ["0", "1", "2", "3"] and value["dumps"]["3"] is None
    report = value["report"]
    assert report["dumps"] == {"0": "ok", "1": "ok", "2": "ok", "3": "missing"}
    assert report["problems"] == ["rank 3 left no dump (it died before it could write one, or its node's dumps never reached the lab)"]
    assert report["sentence"].startswith("hang not located: rank 3 left no dump")
    back = kept_files(value)
    assert sorted(back) == [0, 1, 2, 3] and back[3] is None and json.loads(back[2] or "")["rank"] == 2
    late = kept({**back, 3: dump(3, [*agreeing(2), entry("0", 3, "barrier", [])])}, world_size=4, run=RUN)
    assert late is not None and late["report"]["problems"] == []
    assert late["report"]["sentence"].endswith("ranks 0, 1, 2 called all_reduce(Float[8]); rank 3 called barrier")
    assert kept({0: None}, world_size=2, run=RUN) is None
