"""Time migration 0027 (uploads relabelled) on a scratch Postgres holding N uploads under the old labels.

One stripped upload (no gradient, replica or loss reference) is stored through ingest at 0026,
copied N times in SQL across CONFIGS configs (world sizes), its labels set back to the old ones
(nothing failed, nothing stated: listed as verified) and the leaderboard rebuilt; then the
upgrade to 0027 is timed.

    PYTHONPATH=$PWD python benchmarks/migration_uploads_relabelled.py 20000 1000
"""

from __future__ import annotations

import sys
import time

from sqlalchemy import inspect, text

from backend.db import get_engine, get_sessionmaker
from backend.migrate import upgrade
from backend.store import leaderboard as leaderboard_store
from tests.backend.test_uploads_relabelled import stripped
from tests.conftest import scratch_postgres
from tests.ui.factories import store_run


def copies(table: str, key: str, columns: list[str], spread: str) -> str:
    """INSERT ... SELECT of the seed row N times under new ids (`spread`: a column expression varied per copy)."""
    listed = ", ".join(columns)
    chosen = ", ".join(spread if c == "world_size" else c for c in columns)
    return (
        f"INSERT INTO {table} ({key}, {listed}) SELECT substr(md5(g::text), 1, 32), {chosen} "
        f"FROM {table}, generate_series(1, :n) g WHERE {key} = :id"
    )


def main(n: int, configs: int) -> None:
    with scratch_postgres("parallab_bench0027") as url:
        upgrade(url, "0026")
        with get_sessionmaker(url)() as session:
            seed = store_run(session, stripped(), source="ci").id
        engine = get_engine(url)
        run_columns = [c["name"] for c in inspect(engine).get_columns("runs") if c["name"] != "id"]
        result_columns = [c["name"] for c in inspect(engine).get_columns("run_results") if c["name"] != "run_id"]
        with engine.begin() as conn:
            conn.execute(text(copies("runs", "id", run_columns, "world_size + (g % :configs)")), {"n": n, "id": seed, "configs": configs})
            conn.execute(text(copies("run_results", "run_id", result_columns, "")), {"n": n, "id": seed})
            conn.execute(text("UPDATE runs SET checks_failed = NULL, checks_stated = NULL"))
        with get_sessionmaker(url)() as session:
            leaderboard_store.rebuild(session)
            session.commit()
        verified = "SELECT coalesce(sum(runs), 0) FROM leaderboard_cells WHERE subset = 'verified'"
        with engine.connect() as conn:
            before = conn.execute(text(verified)).scalar_one()
        start = time.perf_counter()
        upgrade(url)
        took = time.perf_counter() - start
        with engine.connect() as conn:
            after = conn.execute(text(verified)).scalar_one()
        print(f"{n + 1} uploads over {min(n, configs)} configs: 0026 -> 0027 in {took:.1f} s; verified runs {before} -> {after}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
