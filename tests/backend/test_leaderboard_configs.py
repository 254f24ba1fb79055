"""Leaderboard rows are configurations: a strategy's options split rows (FSDP resharding after
forward, ≈ ZeRO-3, against keeping the gathered parameters, ≈ ZeRO-2), each with its own median
and n, and the row says which options it ran. The workload key (the CI series' key) is shared.
Through the upload path, on SQLite and Postgres.
"""

from __future__ import annotations

from backend.db import session_scope
from backend.services import leaderboard as service
from parallab.core.spec import OPTIONS_KEY_CHARS, options_key
from tests.ui.factories import make_document, store_run

ZERO3 = {"reshard_after_forward": True}
ZERO2 = {"reshard_after_forward": False}


def fsdp(tokens_per_s: float, options: dict[str, bool], seed: int):
    doc = make_document(strategy="fsdp", world_size=2, tokens_per_s=tokens_per_s, seed=seed)
    return doc.model_copy(update={"strategy": doc.strategy.model_copy(update={"options": options})})


def test_the_two_fsdp_variants_are_two_rows_with_their_own_median_and_n(settings, client) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        runs = [store_run(session, fsdp(tps, ZERO3, i)) for i, tps in enumerate((100_000.0, 110_000.0, 120_000.0))]
        runs += [store_run(session, fsdp(tps, ZERO2, 10 + i)) for i, tps in enumerate((200_000.0, 210_000.0))]
        session.commit()
        assert len({r.workload_key for r in runs}) == 1  # one workload: the series' key is not split
        board = service.get_leaderboard(session=session, query=service.LeaderboardQuery(strategy="fsdp"))
    rows = {r["strategy_options"]: (r["n"], r["median"], r["rank"]) for r in board.rows}
    assert rows == {
        "reshard_after_forward=false": (2, 205_000.0, 1),
        "reshard_after_forward=true": (3, 110_000.0, 2),
    }
    every = client.get("/api/v1/leaderboard?runs=all&strategy=fsdp").json()["items"]
    assert (
        sorted((r["strategy_options"], r["config_runs"]) for r in every)
        == [("reshard_after_forward=false", 2)] * 2 + [("reshard_after_forward=true", 3)] * 3
    )
    html = client.get("/leaderboard?strategy=fsdp").text
    assert html.count("data-options>reshard_after_forward=false<") == 1
    assert html.count("data-options>reshard_after_forward=true<") == 1


def test_the_options_key_is_stable_words_and_bounded() -> None:
    assert options_key({"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 8}) == (
        "microbatches=8, schedule=interleaved_1f1b, virtual_stages=2"
    )
    assert options_key({}) == ""
    long = options_key({f"option_{i}": "x" * 20 for i in range(20)})
    assert len(long) == OPTIONS_KEY_CHARS
    assert long != options_key({f"option_{i}": "x" * 20 for i in range(19)} | {"option_19": "y" * 20})
