"""The leaderboard ranks a config by the median of its runs, with n and the median's 95 % interval
(`parallab.core.stats`), greys and can hide runs that failed a correctness check, and can keep
only runs whose checks the lab made — on the API, the exports and the page, SQLite and Postgres."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import inspect, select, text

from backend.db import get_engine, get_sessionmaker, session_scope
from backend.migrate import downgrade, upgrade
from backend.models import LeaderboardCell, LeaderboardEntry, Run
from backend.services import leaderboard as leaderboard_service
from backend.store import leaderboard as leaderboard_store
from backend.store import runs as run_store
from backend.store.leaderboard import query as leaderboard_query
from parallab.core.flags import failed_checks
from parallab.core.stats import median_interval
from tests.conftest import empty_tables
from tests.ui.factories import make_document, store_run

LUCKY = [10_000.0, 10_100.0, 10_200.0, 10_300.0, 50_000.0]
"""ddp ×2: four ordinary runs and one lucky outlier (best of N: 50,000)."""
STEADY = [12_000.0, 12_100.0, 12_200.0, 12_300.0, 12_400.0]
"""fsdp ×2: steadily faster than ddp's median, never near its luckiest run."""
TEN = [9_100.0, 9_900.0, 9_300.0, 9_800.0, 9_500.0, 9_700.0, 9_200.0, 9_600.0, 9_400.0, 9_000.0]
"""tp ×2: ten runs, enough for a 95 % interval from order statistics (the 2nd and 9th)."""


def doc(**kwargs: Any) -> Any:
    """A run's document that passes its loss check unless told otherwise."""
    return make_document(**{"loss_noise": 1e-7, **kwargs})


def board(session, **kwargs: Any) -> leaderboard_service.Leaderboard:
    return leaderboard_service.get_leaderboard(session=session, query=leaderboard_service.LeaderboardQuery(limit=500, **kwargs))


def by_config(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["strategy"], r["world_size"]): r for r in rows}


def seed_lab(url: str) -> dict[str, Any]:
    """Runs of four configs on one workload: the lab's own (form) runs, one CI upload (its gradient
    and replica checks stated), one run whose gradient check failed, one lone run."""
    ids: dict[str, Any] = {}
    with session_scope(url) as session:
        for strategy, values in (("ddp", LUCKY), ("fsdp", STEADY), ("tp", TEN)):
            for i, tps in enumerate(values):
                store_run(session, doc(strategy=strategy, world_size=2, tokens_per_s=tps, seed=i), source="form")
        ids["failed"] = store_run(
            session, doc(strategy="fsdp", world_size=2, tokens_per_s=12_050.0, seed=9, gradient_error=1e-3), source="form"
        ).id
        ids["stated"] = store_run(session, doc(strategy="ddp", world_size=2, tokens_per_s=10_150.0, seed=7), source="ci").id
        ids["lone"] = store_run(session, doc(strategy="ddp", world_size=4, tokens_per_s=20_000.0), source="form").id
    return ids


@pytest.fixture(scope="module")
def seeded() -> Iterator[dict[str, dict[str, Any]]]:
    """The lab's ids by database URL, seeded once per database for the module: every test but one
    only reads it (seeding took a second a test, half the module's time). Emptied at the end, as
    the shared `db_url` would have."""
    labs: dict[str, dict[str, Any]] = {}
    yield labs
    for url in labs:
        empty_tables(url)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, seeded: dict[str, dict[str, Any]]) -> str:
    """This module's `db_url`: the session's database holding the lab, seeded on first use (on
    emptied tables, as the shared fixture gives them) instead of emptied for every test."""
    url = request.getfixturevalue(f"{request.param}_url")
    if url not in seeded:
        empty_tables(url)
        seeded[url] = seed_lab(url)
    return url


@pytest.fixture
def lab(db_url: str, seeded: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The seeded runs' ids (see `seed_lab`)."""
    return seeded[db_url]


@pytest.fixture
def changed_lab(db_url: str, seeded: dict[str, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The lab, for a test that changes it: seeded again afterwards, so the next test reads the
    lab `seed_lab` makes (the same dict, its ids replaced)."""
    yield seeded[db_url]
    empty_tables(db_url)
    seeded[db_url].clear()
    seeded[db_url].update(seed_lab(db_url))


def test_a_lucky_outlier_does_not_win_the_median_does(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        rows = by_config(board(session, checks="passed", verified=True).rows)
        ddp, fsdp = rows[("ddp", 2)], rows[("fsdp", 2)]
        # best of N would put ddp first: its luckiest run beats every fsdp run
        assert max(LUCKY) > max(STEADY)
        assert ddp["median"] == pytest.approx(10_200.0) and fsdp["median"] == pytest.approx(12_200.0)
        assert fsdp["rank"] < ddp["rank"]
        ranks = {key: r["rank"] for key, r in rows.items()}
        assert ranks == {("ddp", 4): 1, ("fsdp", 2): 2, ("ddp", 2): 3, ("tp", 2): 4}
        # the row stands for the run at the median, not the luckiest one
        assert ddp["tokens_per_s"] == pytest.approx(10_200.0)


@pytest.mark.parametrize("path", ["cells", "filtered runs", "shape group"])
def test_n_and_the_interval_are_the_statistics_modules(settings, lab, path) -> None:
    """The same figures whether the cells answer (the default board) or the filtered runs do."""
    query = {"cells": {}, "filtered runs": {"source": "form"}, "shape group": {"group": "shape"}}[path]
    with session_scope(settings.sqlalchemy_url) as session:
        rows = by_config(board(session, **query).rows)
        tp = rows[("tp", 2)]
        expected = median_interval(TEN)
        assert tp["n"] == tp["config_runs"] == 10
        assert tp["median"] == pytest.approx(expected.estimate)
        assert tp["interval"] == pytest.approx({"low": expected.low, "high": expected.high, "coverage": expected.coverage})
        assert (expected.low, expected.high) == (9_100.0, 9_800.0)  # the 2nd and 9th order statistics
        assert tp["interval_note"].startswith("n=10, 95% interval")
        # under 6 runs there is no 95 % interval: the range, and the note says so
        ddp = rows[("ddp", 2)]
        ddp_values = LUCKY + ([10_150.0] if path != "filtered runs" else [])
        small = median_interval(ddp_values)
        assert ddp["n"] == len(ddp_values)
        assert ddp["interval"] == pytest.approx({"low": small.low, "high": small.high, "coverage": small.coverage})
        if small.coverage < 0.95:
            assert "too few runs" in ddp["interval_note"]
        lone = rows[("ddp", 4)]
        assert lone["n"] == 1 and lone["interval"] is None and lone["interval_note"] == "n=1, no interval"


CHECK_FILTERS = [{}, {"checks": "passed"}, {"verified": True}, {"checks": "passed", "verified": True}]


@pytest.mark.parametrize("filters", CHECK_FILTERS, ids=["all", "passed", "verified", "passed+verified"])
@pytest.mark.parametrize("group", ["workload", "shape", "precision"])
def test_the_cells_and_the_runs_give_the_same_figures(settings, lab, group, filters) -> None:
    """The two sources of a config's figures agree, for every config and a chosen few (`only`),
    under each combination of the check filters (a cell subset each)."""
    with session_scope(settings.sqlalchemy_url) as session:
        request = leaderboard_store.Board(filters=filters, group=group, sort=None, descending=True, limit=500, offset=0)
        assert request.cellable

        def keyed(figures: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
            return {f["median_run_id"]: f for f in figures}

        from_cells = keyed(leaderboard_query._cell_medians(session, request))
        from_runs = keyed(leaderboard_query._config_medians(session, request))
        assert from_cells == from_runs and len(from_cells) == 4
        tp = next(f for f in from_runs.values() if f["n"] == 10)
        tp_key = tuple(getattr(session.get(LeaderboardEntry, tp["median_run_id"]), c) for c in request.config)
        assert leaderboard_query._config_medians(session, request, only=[tp_key]) == [tp]


SUBSET_RULES = {
    "all": lambda e: True,
    "passed": lambda e: e.checks_failed is None,
    "verified": lambda e: e.checks_stated is None,
    "passed_verified": lambda e: e.checks_failed is None and e.checks_stated is None,
}
"""Which entries each cell subset counts, written from the filters' meaning (not from the store)."""


def assert_cells_hold_the_medians(session) -> None:
    """Every cell's figures are `median_interval` of its config's entries in its subset, and
    every non-empty subset of every config has its cell."""
    values: dict[tuple[Any, ...], list[float]] = {}
    tallies: dict[tuple[Any, ...], tuple[int, int]] = {}
    for e in session.execute(select(LeaderboardEntry)).scalars():
        for subset, keeps in SUBSET_RULES.items():
            if keeps(e):
                key = (*(getattr(e, c) for c in leaderboard_store.CONFIG), subset)
                values.setdefault(key, []).append(e.tokens_per_s)
                failed, stated = tallies.get(key, (0, 0))
                tallies[key] = (failed + (e.checks_failed is not None), stated + (e.checks_stated is not None))
    cells = {(*(getattr(c, k) for k in leaderboard_store.CONFIG), c.subset): c for c in session.execute(select(LeaderboardCell)).scalars()}
    assert set(cells) == set(values)
    for key, cell in cells.items():
        iv = median_interval(values[key])
        assert (cell.runs, cell.median_tokens_per_s, cell.interval_low, cell.interval_high, cell.interval_coverage) == (
            len(values[key]),
            pytest.approx(iv.estimate),
            iv.low,
            iv.high,
            pytest.approx(iv.coverage),
        ), key
        assert (cell.best_tokens_per_s, (cell.failed_runs, cell.stated_runs)) == (max(values[key]), tallies[key]), key
        median_run = session.get(LeaderboardEntry, cell.median_run_id)
        assert median_run is not None and median_run.tokens_per_s == sorted(values[key])[len(values[key]) // 2]


def test_the_cells_keep_the_median_through_ingest_delete_and_rebuild(settings, changed_lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        assert_cells_hold_the_medians(session)
        run_store.delete_run(session, changed_lab["lone"])
        tp_run = session.execute(select(Run.id).where(Run.strategy == "tp", Run.tokens_per_s == 9_000.0)).scalar_one()
        run_store.delete_run(session, tp_run)
        session.commit()
        assert_cells_hold_the_medians(session)
        maintained = {
            (c.strategy, c.world_size, c.subset): (c.median_tokens_per_s, c.failed_runs, c.stated_runs)
            for c in session.execute(select(LeaderboardCell)).scalars()
        }
        leaderboard_store.rebuild(session)
        session.flush()
        assert_cells_hold_the_medians(session)
        rebuilt = {
            (c.strategy, c.world_size, c.subset): (c.median_tokens_per_s, c.failed_runs, c.stated_runs)
            for c in session.execute(select(LeaderboardCell)).scalars()
        }
        assert rebuilt == maintained
        assert maintained[("fsdp", 2, "all")][1] == 1 and maintained[("ddp", 2, "all")][2] == 1
        assert maintained[("fsdp", 2, "passed")][1] == 0 and maintained[("ddp", 2, "verified")][2] == 0


def test_failed_checks_are_flagged_and_checks_passed_hides_them(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        every = {r["id"]: r for r in board(session, best_only=False).rows}
        assert every[lab["failed"]]["checks_failed"] == ["gradient"] and every[lab["failed"]]["checks_flagged"]
        assert not any(r["checks_flagged"] for i, r in every.items() if i != lab["failed"])
        passed = board(session, best_only=False, checks="passed")
        assert lab["failed"] not in {r["id"] for r in passed.rows} and passed.total == len(every) - 1
        for sort in ("rank", "config_runs", "mfu"):  # the planned sorts keep to the filter too
            for descending in (True, False):
                sorted_board = board(session, best_only=False, checks="passed", verified=True, sort=sort, descending=descending)
                assert {r["id"] for r in sorted_board.rows} == {r["id"] for r in passed.rows} - {lab["stated"]}, (sort, descending)
                assert sorted_board.total == passed.total - 1
        # a config counts its failed runs, and is flagged; checks=passed takes them out of its median
        fsdp = by_config(board(session).rows)[("fsdp", 2)]
        assert fsdp["n"] == 6 and fsdp["failed_runs"] == 1 and fsdp["checks_flagged"]
        assert fsdp["median"] == pytest.approx(median_interval([*STEADY, 12_050.0]).estimate)
        fsdp_passed = by_config(board(session, checks="passed").rows)[("fsdp", 2)]
        assert fsdp_passed["n"] == 5 and fsdp_passed["failed_runs"] == 0 and not fsdp_passed["checks_flagged"]
        assert fsdp_passed["median"] == pytest.approx(12_200.0)


def test_verified_keeps_only_the_labs_own_checks_and_stated_ones_are_labelled(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        every = {r["id"]: r for r in board(session, best_only=False).rows}
        stated = every[lab["stated"]]
        assert stated["stated"] and set(stated["checks_stated"]) >= {"gradient_check"}
        assert [i for i, r in every.items() if r["stated"]] == [lab["stated"]]
        verified = board(session, best_only=False, verified=True)
        assert lab["stated"] not in {r["id"] for r in verified.rows} and verified.total == len(every) - 1
        ddp = by_config(board(session).rows)[("ddp", 2)]
        assert ddp["n"] == 6 and ddp["stated_runs"] == 1 and ddp["stated"]
        assert by_config(board(session, verified=True).rows)[("ddp", 2)]["n"] == 5


def test_the_api_carries_n_median_and_interval_and_refuses_bad_values(client, lab) -> None:
    answer = client.get("/api/v1/leaderboard")
    assert answer.status_code == 200
    tp = next(r for r in answer.json()["items"] if r["strategy"] == "tp")
    expected = median_interval(TEN)
    assert (tp["n"], tp["median"]) == (10, pytest.approx(expected.estimate))
    assert tp["interval"] == pytest.approx({"low": expected.low, "high": expected.high, "coverage": expected.coverage})
    every = client.get("/api/v1/leaderboard", params={"runs": "all", "checks": "passed", "verified": "true", "limit": 500}).json()
    assert lab["failed"] not in {r["id"] for r in every["items"]} and lab["stated"] not in {r["id"] for r in every["items"]}
    assert all(r["n"] is None and r["interval"] is None for r in every["items"])
    for url in ("/api/v1/leaderboard", "/leaderboard", "/leaderboard.json"):
        for name, bad in (("checks", "failed"), ("verified", "maybe")):
            refused = client.get(url, params={name: bad})
            assert refused.status_code == 422, (url, name)
            assert name in refused.text, (url, name)
    lines = list(csv.reader(io.StringIO(client.get("/leaderboard.csv", params={"strategy": "tp"}).text)))
    header = lines[0]
    assert {"n", "median", "interval_low", "interval_high", "checks_failed", "checks_stated"} <= set(header)
    assert float(lines[1][header.index("interval_low")]) == expected.low


def test_the_page_greys_flags_labels_and_filters(client, lab) -> None:
    page = client.get("/leaderboard", params={"runs": "all"}).text
    assert 'data-checks-flagged="true"' in page and "⚑ gradient" in page
    assert 'data-stated="true"' in page and ">stated</span>" in page
    assert '<select name="checks"' in page and '<select name="verified"' in page
    hidden = client.get("/leaderboard", params={"runs": "all", "checks": "passed", "verified": "true"}).text
    assert 'data-checks-flagged="true"' not in hidden and 'data-stated="true"' not in hidden
    assert '<option value="passed" selected>' in hidden and '<option value="true" selected>' in hidden
    best = client.get("/leaderboard").text
    assert "n=1" in best and "no interval" in best and "⚑ 1 of 6 failed" in best


def test_failed_checks_follow_the_stored_flags_rule() -> None:
    summary = {
        "loss_max_rel_diff_vs_reference": 0.5,
        "gradient_check": {"passed": True, "max_rel_err": 1e-7, "tolerance": 1e-5},
        "replica_check": {"passed": False, "max_rel_diff": 0.1, "tolerance": 1e-6, "worst_param": "w", "worst_ranks": [0, 1]},
    }
    assert failed_checks(summary, "fp32") == ["loss", "replica"]
    assert failed_checks({"loss_max_rel_diff_vs_reference": 0.0}, "fp32") == []


def _snapshot(url: str) -> dict[str, Any]:
    """Every row of the leaderboard's tables and what they derive from (a cell without its
    surrogate id: a config's cells are rewritten whenever one of its runs changes)."""
    with get_engine(url).connect() as conn:
        snapshot = {
            table: sorted(tuple(r) for r in conn.execute(text(f"SELECT * FROM {table}")))
            for table in ("runs", "run_results", "leaderboard_entries")
        }
        for table in ("leaderboard_cells", "leaderboard_counts"):
            rows = conn.execute(text(f"SELECT * FROM {table}")).mappings()
            snapshot[table] = sorted((tuple(sorted((k, _value(k, v)) for k, v in r.items() if k != "id")) for r in rows), key=repr)
        return snapshot


def _value(column: str, value: Any) -> Any:
    """A column's value for comparison: JSON as what it holds (SQLite keeps its text, spaced as
    whichever connection wrote it)."""
    return repr(json.loads(value)) if column == "marks" and isinstance(value, str) else repr(value) if column == "marks" else value


@pytest.mark.parametrize(
    ("down_to", "added"),
    [
        ("0018", "leaderboard_cells.median_tokens_per_s"),
        ("0019", "leaderboard_cells.subset"),
        ("0020", "leaderboard_counts"),
        ("0021", "leaderboard_cells.marks"),
        ("0022", "leaderboard_cells.strategy_options"),
    ],
)
def test_migrations_move_a_populated_database_down_and_up_with_nothing_lost(scratch_url: str, down_to: str, added: str) -> None:
    """0019 (medians, checks), 0020 (a cell per subset of a config's runs), 0021 (the counts),
    0022 (the rank marks) and 0023 (the strategy's options in the config), each walked down and up again."""
    upgrade(scratch_url)
    with get_sessionmaker(scratch_url)() as session:
        for i, tps in enumerate(TEN[:7]):
            store_run(session, doc(strategy="tp", world_size=2, tokens_per_s=tps, seed=i), source="form")
        store_run(session, doc(strategy="ddp", world_size=2, tokens_per_s=1.0, gradient_error=1e-3), source="form")
        store_run(session, doc(strategy="ddp", world_size=2, tokens_per_s=2.0, seed=1), source="ci")
        for i, reshard in enumerate((True, False, False)):  # two configs from 0023 on, one before
            fsdp = doc(strategy="fsdp", world_size=2, tokens_per_s=50.0 + i, seed=i)
            options = {"reshard_after_forward": reshard}
            store_run(session, fsdp.model_copy(update={"strategy": fsdp.strategy.model_copy(update={"options": options})}), source="form")
    before = _snapshot(scratch_url)
    downgrade(scratch_url, down_to)
    table, _, column = added.partition(".")
    inspector = inspect(get_engine(scratch_url))
    assert (column not in {c["name"] for c in inspector.get_columns(table)}) if column else not inspector.has_table(table)
    with get_engine(scratch_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == len(before["runs"])
        every_run = " WHERE subset = 'all'" if down_to >= "0020" else ""  # (the subsets' cells came with 0020)
        assert conn.execute(text(f"SELECT sum(runs) FROM leaderboard_cells{every_run}")).scalar_one() == len(before["leaderboard_entries"])
    upgrade(scratch_url)
    assert _snapshot(scratch_url) == before
    with get_sessionmaker(scratch_url)() as session:
        failed = session.execute(select(Run.checks_failed, Run.checks_stated).where(Run.strategy == "ddp").order_by(Run.tokens_per_s)).all()
        assert [tuple(r) for r in failed][0] == ("gradient", None) and "gradient_check" in (failed[1].checks_stated or "")
        assert_cells_hold_the_medians(session)
