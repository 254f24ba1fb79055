"""Concurrent CI uploads of one series and one config (issue 12) on Postgres: every upload lands.

The first uploads of a branch race to create its series while others, a moment later, find it
and update it; every one of them also adds its run to the same leaderboard cell. Each upload
takes the series' and the cell's locks, so the order they take them in must be the same for all
of them, or two of them wait for each other until Postgres kills one (a deadlock, which the API
answers with 503). And a savepoint rolled back because another upload created the series first
must not take this upload's own run with it.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from backend.db import get_sessionmaker, session_scope
from backend.models import LeaderboardCell, Run, Series, SeriesVerdict
from backend.services.auth import Principal
from backend.services.uploads import upload_results
from tests.ui.factories import make_document

UPLOADERS = 10
ROUNDS = 3
EACH = 4  # uploads per uploader per round, back to back: later ones find the series and update it


def test_concurrent_first_uploads_of_a_series_all_land(settings) -> None:
    if not settings.sqlalchemy_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers")
    principal = Principal(via="token", role="member", scopes=frozenset({"upload"}))
    errors: list[BaseException] = []
    for round_ in range(ROUNDS):
        branch = f"race/{round_}"  # a new series each round: its first uploads race to create it
        docs = [
            make_document(strategy="ddp", world_size=2, tokens_per_s=20_000.0 + i, seed=i, branch=branch) for i in range(UPLOADERS * EACH)
        ]
        barrier = threading.Barrier(UPLOADERS)

        def upload(i: int, docs=docs, barrier=barrier, branch=branch) -> None:
            session = get_sessionmaker(settings.sqlalchemy_url)()
            try:
                barrier.wait()
                for j in range(EACH):
                    key = f"{branch}-{i}-{j}"
                    upload_results(session=session, documents=[docs[i * EACH + j]], batch=False, idempotency_key=key, principal=principal)
                    session.commit()
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
            finally:
                session.close()

        threads = [threading.Thread(target=upload, args=(i,)) for i in range(UPLOADERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    with session_scope(settings.sqlalchemy_url) as session:
        runs = session.execute(select(Run)).scalars().all()
        assert len(runs) == UPLOADERS * EACH * ROUNDS
        assert {r.status for r in runs} == {"succeeded"}
        assert all(r.result is not None and r.series_id is not None for r in runs)
        assert session.execute(select(func.count()).select_from(Series)).scalar_one() == ROUNDS
        judged = session.execute(select(func.count(func.distinct(SeriesVerdict.run_id)))).scalar_one()
        assert judged == UPLOADERS * EACH * ROUNDS
        cells = session.execute(select(LeaderboardCell).where(LeaderboardCell.subset == "all")).scalars().all()
        assert [c.runs for c in cells] == [UPLOADERS * EACH * ROUNDS]
