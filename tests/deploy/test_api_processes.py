"""What several API processes (`uvicorn --workers N`, as compose runs it) share: the env-seeded
admin is created once, whichever process starts first, and the others start too."""

from __future__ import annotations

import pytest
from pydantic import SecretStr
from sqlalchemy import func, select

from backend.api.lifespan import seed_admin
from backend.config import Settings
from backend.db import session_scope
from backend.models import User
from backend.store import accounts as store

EMAIL, PASSWORD = "first-admin@lab.example", "first-admin-password-1"


def admins(settings: Settings) -> int:
    with session_scope(settings.sqlalchemy_url) as session:
        return int(session.scalar(select(func.count()).select_from(User).where(User.email == EMAIL)) or 0)


def test_a_second_process_that_loses_the_race_to_seed_the_admin_still_starts(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = settings.model_copy(update={"admin_email": EMAIL, "admin_password": SecretStr(PASSWORD)})
    seed_admin(seeded)
    assert admins(seeded) == 1
    seed_admin(seeded)  # a later start: the admin exists, nothing happens
    # The race: the other process inserted between this one's look-up (which saw nobody) and its insert.
    monkeypatch.setattr(store, "find_user", lambda session, email: None)
    seed_admin(seeded)  # the unique email refuses the insert; start-up goes on
    assert admins(seeded) == 1
