"""The critical path on the run page, the diff that explains a change on compare and in
`parallab compare --why` (documents fabricated as the worker writes them, the analysis run on
synthetic segments; no torchrun)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from parallab.cli import app
from parallab.core.critpath import COLL, COMPUTE, StepSegments, analyse
from parallab.core.stragglers import CollectiveArrival, match
from tests.backend.test_repeats import _store

runner = CliRunner()


def _segments(late_us: float, base: float = 0.0) -> StepSegments:
    s = StepSegments(start_us=base, end_us=base + 1200 + late_us)
    s.add(COMPUTE, "matmul", "", -1, base, base + 800 + late_us)
    s.add(COLL, "all_reduce", "0,1,2", 0, base + 800 + late_us, base + 1200 + late_us)
    return s


def _path(*, bad: bool):
    """Three ranks, rank 1 late; with `bad`: rank 2's record from another run (an hour away)."""
    per_rank = {0: [_segments(0)], 1: [_segments(300)], 2: [_segments(0, base=3.6e9 if bad else 0.0)]}
    cp = analyse(per_rank, world_size=4 if bad else 3, mesh=[("dp_shard", 4 if bad else 3)])
    assert cp is not None
    return cp


def test_the_run_page_draws_the_path_and_says_what_it_left_out_and_why(client, settings) -> None:
    cp = _path(bad=True)
    (run_id,) = _store(settings, "ddp", [9_000], edit=lambda doc: doc.model_copy(update={"critical_path": cp}))
    page = client.get(f"/runs/{run_id}").text
    assert 'id="critical-path"' in page and "through rank 1" in page and "compute matmul" in page
    assert 'data-path-skipped-rank="2"' in page and "another run" in page
    assert 'data-path-skipped-rank="3"' in page and "no record" in page
    assert 'id="chart-critical_path"' in page
    # the run's other figures stay
    assert 'id="chart-steps"' in page and 'id="chart-memory"' in page


def test_the_run_page_says_which_analyses_skipped_a_rank_whose_trace_was_cut_short(client, settings) -> None:
    cut = "the profiler's trace could not be read (the trace ends at byte 4096); its analyses were skipped"
    cp = analyse({0: [_segments(0)], 1: None, 2: [_segments(0)]}, world_size=3, mesh=[("dp_shard", 3)], unread={1: cut})
    times = [CollectiveArrival(group="0,1,2", seq=i, op="all_reduce", arrive_us=i * 1e4, end_us=i * 1e4 + 500) for i in range(5)]
    matched = match({0: times, 1: None, 2: times}, world_size=3, unread={1: cut})
    both = {"critical_path": cp, "collectives_matched": matched}
    (run_id,) = _store(settings, "ddp", [9_000], edit=lambda doc: doc.model_copy(update=both))
    page = client.get(f"/runs/{run_id}").text
    assert 'data-path-skipped-rank="1"' in page and 'data-skipped-rank="1"' in page
    assert page.count("the trace ends at byte 4096") == 2  # the critical path and the matching, each says so
    assert 'id="critical-path"' in page and 'id="chart-steps"' in page and 'id="chart-memory"' in page  # the rest stays


def test_a_run_without_the_analysis_has_no_path_section(client, settings) -> None:
    (run_id,) = _store(settings, "ddp", [9_000])
    page = client.get(f"/runs/{run_id}").text
    assert 'id="critical-path"' not in page and 'id="chart-critical_path"' not in page


def _explained(step_s: float, gather_s: float):
    def edit(doc):
        parts = {"compute matmul": 0.6, "transfer dp_shard all_gather": gather_s, "idle": 0.1}  # the timed step 0.1 s longer
        summary = doc.summary.model_copy(update={"step_time_s": doc.summary.step_time_s.model_copy(update={"median": step_s})})
        cp = _path(bad=False).model_copy(update={"rank_parts_s": parts, "rank_step_s": sum(parts.values())})
        return doc.model_copy(update={"summary": summary, "critical_path": cp})

    return edit


def test_compare_explains_the_change_with_its_parts_and_residual(client, settings) -> None:
    base = _store(settings, "fsdp", [9_000] * 3, edit=_explained(1.0, 0.2))
    other = _store(settings, "fsdp", [8_000] * 3, edit=_explained(1.2, 0.4))
    table = client.get("/compare.json", params={"ids": ",".join(base + other), "baseline": base[0]}).json()
    (why,) = table["why"]
    assert why["problem"] is None and why["why"]["adds_up"] is True
    top = why["why"]["parts"][0]
    assert top["part"] == "transfer dp_shard all_gather" and abs(top["delta_s"] - 0.2) < 1e-9
    page = client.get("/compare", params={"ids": ",".join(base + other), "baseline": base[0]}).text
    assert 'id="why"' in page and 'data-part="transfer dp_shard all_gather"' in page and 'data-adds-up="yes"' in page


def test_compare_says_when_a_run_cannot_be_explained(client, settings) -> None:
    base = _store(settings, "fsdp", [9_000], edit=_explained(1.0, 0.2))
    other = _store(settings, "ddp", [9_000])  # untraced: no critical path
    (why,) = client.get("/compare.json", params={"ids": ",".join(base + other)}).json()["why"]
    assert why["why"] is None and "critical_path.rank_parts_s" in why["problem"]


def _doc(step: float, gather: float) -> dict:
    parts = {"compute matmul": 0.6, "transfer dp_shard all_gather": gather, "idle": 0.1}  # the timed step 0.1 s longer
    return {"summary": {"step_time_s": {"median": step}}, "critical_path": {"rank_parts_s": parts, "rank_step_s": sum(parts.values())}}


def test_the_cli_explains_two_repeat_groups_from_files(tmp_path) -> None:
    files = {}
    for side, step, gather in (("a", 1.0, 0.2), ("b", 1.2, 0.4)):
        files[side] = []
        for i, e in enumerate((0.0, 0.01, -0.01)):
            path = tmp_path / f"{side}{i}.json"
            path.write_text(json.dumps(_doc(step + e, gather + e)))
            files[side].append(str(path))
    ok = runner.invoke(app, ["compare", ",".join(files["a"]), ",".join(files["b"]), "--why"])
    assert ok.exit_code == 0, ok.output
    assert "transfer dp_shard all_gather" in ok.output and "±" in ok.output and "residual" in ok.output
    # B's window not moving with its timed step: the parts do not add up, exit 1
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps(_doc(1.2, 0.2)))
    off = runner.invoke(app, ["compare", files["a"][0], str(flat), "--why"])
    assert off.exit_code == 1 and "do NOT add up" in off.output, off.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {"step_time_s": {"median": 1.0}}}))
    refused = runner.invoke(app, ["compare", files["a"][0], str(bad), "--why"])
    assert refused.exit_code == 2 and "critical_path.rank_parts_s" in refused.output, refused.output


def test_runs_with_a_straggler_are_filtered_and_flagged_on_the_leaderboard(client, settings) -> None:
    from tests.backend.test_stragglers_pages import _stored

    late = _stored(settings, 1)
    clean = [_stored(settings, None) for _ in range(2)]
    listed = client.get("/", params={"straggler": "true"}).text
    assert f"/runs/{late}" in listed and not any(f"/runs/{c}" in listed for c in clean)
    rest = client.get("/api/v1/runs", params={"straggler": "false"}).json()["items"]
    assert {r["id"] for r in rest} >= set(clean) and late not in {r["id"] for r in rest}
    assert client.get("/api/v1/runs", params={"straggler": "maybe"}).status_code == 422
    board = client.get("/leaderboard").text
    assert 'data-straggler-runs="1"' in board and "1 of 3 runs had a straggler" in board, board[board.find("checks") :][:2000]


def test_compare_keeps_only_the_runs_with_a_straggler_when_asked(client, settings) -> None:
    from tests.backend.test_stragglers_pages import _stored

    late, clean = _stored(settings, 1), _stored(settings, None)
    page = client.get("/compare", params={"ids": f"{late},{clean}", "straggler": "True"}).text
    assert f"/runs/{late}" in page and f"/runs/{clean}" not in page.split('id="compare-table"', 1)[1]
