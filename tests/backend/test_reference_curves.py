"""The lab's reference curves (issue 12): the first writer wins, a second insert is a no-op; one
curve per (key, device). On SQLite and Postgres."""

from __future__ import annotations

from backend.config import Settings
from backend.db import session_scope
from backend.store import references as store

KEY = "ab" * 32


def add(settings: Settings, loss: list[float], device: str = "cpu") -> bool:
    with session_scope(settings.sqlalchemy_url) as session:
        return store.add_curve(
            session, key=KEY, device=device, model="tiny", seed=0, workload={"model": "tiny", "seed": 0}, loss=loss, run_id=None
        )


def curve(settings: Settings, device: str = "cpu") -> list[float] | None:
    with session_scope(settings.sqlalchemy_url) as session:
        row = store.get_curve(session, KEY, device)
        return None if row is None else list(row.loss)


def test_the_first_curve_stored_wins_and_a_second_insert_changes_nothing(settings: Settings) -> None:
    assert curve(settings) is None
    assert add(settings, [3.0, 2.5]) is True
    assert add(settings, [9.0, 9.0]) is False
    assert curve(settings) == [3.0, 2.5]


def test_curves_are_kept_per_device_kind(settings: Settings) -> None:
    assert add(settings, [3.0, 2.5], device="cpu")
    assert curve(settings, "cuda") is None
    assert add(settings, [3.0, 2.4], device="cuda")
    assert curve(settings, "cuda") == [3.0, 2.4] and curve(settings, "cpu") == [3.0, 2.5]
