"""The leaderboard's maintained tables (issue 12) agree with a direct recompute from `runs`.

`leaderboard_entries` holds exactly the ranked runs (succeeded, with a throughput and a workload
key), `leaderboard_cells` their per-config counts and best throughput and `leaderboard_counts`
each config's runs per source, branch, uploader and check outcome, through ingest, cancel,
a status change after success and delete, on SQLite and Postgres; and the leaderboard read from
them ranks, counts and orders rows as a recompute over the runs does, filters (the user's too)
included.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import LeaderboardCell, LeaderboardCount, LeaderboardEntry, Run
from backend.services import leaderboard as leaderboard_service
from backend.services.ingest import attach_result, ingest_upload
from backend.store import accounts as accounts_store
from backend.store import leaderboard as leaderboard_store
from backend.store import runs as run_store
from tests.ui.factories import make_document, store_run

GPU = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}
CONFIG = leaderboard_store.CONFIG


def ranked_runs(session) -> list[Run]:
    """The direct recompute: which runs the leaderboard ranks."""
    runs = session.execute(select(Run)).scalars().all()
    return [r for r in runs if r.status == "succeeded" and r.tokens_per_s is not None and r.workload_key is not None]


def assert_consistent(session) -> None:
    runs = ranked_runs(session)
    entries = {e.id: e for e in session.execute(select(LeaderboardEntry)).scalars()}
    assert set(entries) == {r.id for r in runs}
    for run in runs:
        for column in leaderboard_store.ENTRY_COLUMNS:
            assert getattr(entries[run.id], column) == getattr(run, column), (run.id, column)
    expected: dict[tuple[Any, ...], tuple[int, float]] = {}
    for run in runs:
        key = tuple(getattr(run, c) for c in CONFIG)
        count, best = expected.get(key, (0, 0.0))
        expected[key] = (count + 1, max(best, run.tokens_per_s))
    cells = {
        tuple(getattr(c, k) for k in CONFIG): (c.runs, c.best_tokens_per_s)
        for c in session.execute(select(LeaderboardCell).where(LeaderboardCell.subset == "all")).scalars()
    }
    assert cells == expected
    # the counts: how many runs of each config share a source, branch, uploader and check outcome
    tallied = Counter(tuple(getattr(run, c) for c in leaderboard_store.COUNT_KEY) for run in runs)
    counts = Counter()
    for row in session.execute(select(LeaderboardCount)).scalars():
        counts[tuple(getattr(row, c) for c in leaderboard_store.COUNT_KEY)] += row.runs
    assert counts == tallied


def add_run(session, doc, *, user_id: int | None = None, status: str = "running") -> Run:
    run = Run(
        name=doc.name,
        status=status,
        source="form",
        spec={"workload": doc.workload, "strategy": doc.strategy.model_dump(), "trace": False},
        strategy=doc.strategy.name,
        world_size=doc.strategy.world_size,
        model=str(doc.workload["model"]),
        user_id=user_id,
    )
    session.add(run)
    session.flush()
    return run


@pytest.fixture
def lab(settings) -> dict[str, Any]:
    with session_scope(settings.sqlalchemy_url) as session:
        ada = accounts_store.add_user(session, email="ada@lab.example", password_hash="x", role="member")
        ids: dict[str, Any] = {"ada": ada.id}
        plan = [
            ("ddp2a", "ddp", 2, 16_000.0, None),
            ("ddp2b", "ddp", 2, 15_000.0, ada.id),
            ("ddp2c", "ddp", 2, 16_000.0, None),  # ties ddp2a
            ("fsdp2", "fsdp", 2, 14_000.0, ada.id),
            ("tp2", "tp", 2, 11_000.0, None),
            ("ddp4", "ddp", 4, 28_000.0, ada.id),
        ]
        for key, strategy, n, tps, user in plan:
            run = add_run(session, make_document(strategy=strategy, world_size=n, tokens_per_s=tps), user_id=user)
            attach_result(session, run=run, document=make_document(strategy=strategy, world_size=n, tokens_per_s=tps))
            ids[key] = run.id
        ids["gpu"] = store_run(
            session, make_document(strategy="fsdp", world_size=8, tokens_per_s=400_000.0, hardware=GPU, branch="main")
        ).id
        failed = add_run(session, make_document(strategy="ddp", world_size=2, tokens_per_s=99_000.0))
        run_store.set_status(session, failed, "failed", error="out of memory")
        ids["failed"] = failed.id
        running = add_run(session, make_document(strategy="ddp", world_size=2, tokens_per_s=1.0))
        ids["running"] = running.id
        session.commit()
    return ids


def recompute_every_run(session, *, user_id: int | None = None) -> dict[str, dict[str, int]]:
    """rank (1 + faster runs of the group) and config_runs per run, straight from `runs`."""
    runs = [r for r in ranked_runs(session) if user_id is None or r.user_id == user_id]
    configs = Counter(tuple(getattr(r, c) for c in CONFIG) for r in runs)
    out = {}
    for r in runs:
        faster = sum(
            1 for o in runs if (o.workload_key, o.hardware_key) == (r.workload_key, r.hardware_key) and o.tokens_per_s > r.tokens_per_s
        )
        out[r.id] = {"rank": faster + 1, "config_runs": configs[tuple(getattr(r, c) for c in CONFIG)]}
    return out


def board(session, **kwargs: Any) -> leaderboard_service.Leaderboard:
    return leaderboard_service.get_leaderboard(session=session, query=leaderboard_service.LeaderboardQuery(**kwargs))


def test_the_tables_follow_ingest_status_changes_and_delete(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        assert_consistent(session)
        entries = set(session.execute(select(LeaderboardEntry.id)).scalars())
        assert lab["failed"] not in entries and lab["running"] not in entries
        # the running run finishes: ranked, and its config's cell counts it
        running = session.get(Run, lab["running"])
        attach_result(session, run=running, document=make_document(strategy="ddp", world_size=2, tokens_per_s=17_000.0))
        session.commit()
        assert_consistent(session)
        # the best run of a config leaves the board (marked failed after success): the cell's best falls back
        run_store.set_status(session, session.get(Run, lab["ddp4"]), "failed", error="diverged")
        session.commit()
        assert_consistent(session)
        # a cancelled run never enters it
        cancelled = add_run(session, make_document(strategy="tp", world_size=2, tokens_per_s=5.0), status="queued")
        run_store.set_status(session, cancelled, "cancelled", error="cancelled before it started")
        session.commit()
        assert_consistent(session)
        # the uploader, stored with the upload, reaches the row and its filter
        uploaded, _ = ingest_upload(
            session,
            document=make_document(strategy="fsdp", world_size=2, tokens_per_s=12_000.0, seed=3),
            idempotency_key=None,
            user_id=lab["ada"],
        )
        session.commit()
        session.expire(uploaded)  # read back as stored (SQLite keeps no time zone)
        assert_consistent(session)
        assert uploaded.id in {r["id"] for r in board(session, best_only=False, user_id=lab["ada"]).rows}
        # delete: the entry and the cell go (the config's only run) or shrink
        run_store.delete_run(session, lab["tp2"])
        run_store.delete_run(session, lab["ddp2a"])
        session.commit()
        assert_consistent(session)
        assert session.execute(select(LeaderboardCell).where(LeaderboardCell.strategy == "tp")).first() is None


def test_rebuild_matches_what_ingest_maintained(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        before = {
            e.id: {c: getattr(e, c) for c in leaderboard_store.ENTRY_COLUMNS} for e in session.execute(select(LeaderboardEntry)).scalars()
        }
        assert leaderboard_store.rebuild(session) == len(before)
        session.commit()
        after = {
            e.id: {c: getattr(e, c) for c in leaderboard_store.ENTRY_COLUMNS} for e in session.execute(select(LeaderboardEntry)).scalars()
        }
        assert after == before
        assert_consistent(session)


@pytest.mark.parametrize("sort", [None, "rank", "mfu", "tokens_per_s", "step_time_median_s", "config_runs", "created_at"])
@pytest.mark.parametrize("descending", [True, False])
def test_every_run_pages_rank_and_order_as_a_recompute(settings, lab, sort, descending) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        expected = recompute_every_run(session)
        whole = board(session, best_only=False, sort=sort, descending=descending, limit=500)
        assert whole.total == len(expected) == 7
        assert {r["id"]: {"rank": r["rank"], "config_runs": r["config_runs"]} for r in whole.rows} == expected
        # pages of 2 stitch into the whole board, in the same order
        paged = [
            r["id"]
            for offset in range(0, 8, 2)
            for r in board(session, best_only=False, sort=sort, descending=descending, limit=2, offset=offset).rows
        ]
        assert paged == [r["id"] for r in whole.rows]
        sign = -1 if descending else 1
        if sort in ("rank", "config_runs"):  # planned from the cells: the board's whole order, ties included
            order = sorted(whole.rows, key=lambda r: (sign * r[sort], r["model"], r["workload_key"], r["hardware_key"], r["rank"], r["id"]))
            assert [r["id"] for r in order] == [r["id"] for r in whole.rows]
        if sort in ("mfu", "tokens_per_s", "step_time_median_s", "created_at", "rank", "config_runs"):
            values = [r[sort] for r in whole.rows if r[sort] is not None]
            assert values == sorted(values, reverse=descending)


def test_filters_and_the_user_rank_within_what_they_keep(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        mine = board(session, best_only=False, user_id=lab["ada"], limit=500)
        expected = recompute_every_run(session, user_id=lab["ada"])
        assert {r["id"]: {"rank": r["rank"], "config_runs": r["config_runs"]} for r in mine.rows} == expected
        assert {r["id"] for r in mine.rows} == {lab["ddp2b"], lab["fsdp2"], lab["ddp4"]}
        assert board(session, best_only=False, user_id=-1).rows == []
        # best per config: the cells (a strategy filter) and the filtered runs (a branch filter) agree with a recompute
        best = board(session)
        assert {(r["strategy"], r["world_size"], r["hardware_key"]): (round(r["tokens_per_s"]), r["config_runs"]) for r in best.rows} == {
            ("ddp", 2, "cpu"): (16_000.0, 3),
            ("fsdp", 2, "cpu"): (14_000.0, 1),
            ("tp", 2, "cpu"): (11_000.0, 1),
            ("ddp", 4, "cpu"): (28_000.0, 1),
            ("fsdp", 8, "cuda:NVIDIA H100 80GB HBM3"): (400_000.0, 1),
        }
        assert [r["id"] for r in best.rows if r["strategy"] == "ddp" and r["world_size"] == 2] == [min(lab["ddp2a"], lab["ddp2c"])]
        ddp = sorted((round(r["tokens_per_s"]), r["rank"], r["config_runs"]) for r in board(session, strategy="ddp").rows)
        assert ddp == [(16_000.0, 2, 3), (28_000.0, 1, 1)]
        mine_best = board(session, user_id=lab["ada"])
        assert sorted((r["strategy"], r["world_size"], r["rank"], r["config_runs"]) for r in mine_best.rows) == [
            ("ddp", 2, 2, 1),
            ("ddp", 4, 1, 1),
            ("fsdp", 2, 3, 1),
        ]
        by_branch = board(session, branch="main")
        assert [(r["id"], r["rank"], r["config_runs"]) for r in by_branch.rows] == [(lab["gpu"], 1, 1)]


def test_filter_menus_list_what_the_ranked_runs_hold(settings, lab) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        runs = ranked_runs(session)
        values = leaderboard_store.filter_values(session)
        for name in leaderboard_store.FILTERS:
            assert values[name] == sorted({getattr(r, name) for r in runs if getattr(r, name) is not None}), name
        assert values["user_id"] == [lab["ada"]] and values["branch"] == ["main"]


def cell_rows(session) -> dict[tuple[Any, ...], dict[str, Any]]:
    columns = [c.name for c in LeaderboardCell.__table__.columns if c.name != "id"]
    cells = session.execute(select(LeaderboardCell)).scalars()
    return {(*(getattr(c, k) for k in CONFIG), c.subset): {k: getattr(c, k) for k in columns} for c in cells}


def test_cells_added_to_on_ingest_equal_a_recompute(settings, lab) -> None:
    """Ingest adds a run to its config's cell (runs + 1, best = max) instead of recomputing it; every
    column of every cell — the attributes too — is what a rebuild from the entries gives."""
    with session_scope(settings.sqlalchemy_url) as session:
        for tps in (15_500.0, 30_000.0, 1_000.0):  # below, above and far below the config's best
            store_run(session, make_document(strategy="ddp", world_size=2, tokens_per_s=tps, branch="main"))
        assert_consistent(session)
        maintained = cell_rows(session)
        leaderboard_store.rebuild(session)
        session.flush()
        assert cell_rows(session) == maintained


def test_concurrent_ingests_of_one_config_all_count(settings, lab) -> None:
    """Uploads of one config committing at once: the cell counts each of them (the config's lock
    orders the adds and a recompute that would miss one)."""
    import threading

    from backend.db import get_sessionmaker

    if not settings.sqlalchemy_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers")
    docs = [make_document(strategy="ddp", world_size=2, tokens_per_s=20_000.0 + i, seed=i, branch="main") for i in range(8)]
    barrier = threading.Barrier(len(docs) + 1)

    def upload(i: int) -> None:
        session = get_sessionmaker(settings.sqlalchemy_url)()
        try:
            barrier.wait()
            if i == 0:  # a delete of the config's run beside the adds: a recompute under the same lock
                run_store.delete_run(session, lab["ddp2a"])
                session.commit()
            store_run(session, docs[i])
        finally:
            session.close()

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(len(docs))]
    for t in threads:
        t.start()
    barrier.wait()
    for t in threads:
        t.join()
    with session_scope(settings.sqlalchemy_url) as session:
        assert_consistent(session)
