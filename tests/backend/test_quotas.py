"""Quotas on queued work: the pattern that queued 692 runs from 53 sweep requests is stopped at the
per-user limit (429 naming it, nothing of the refused request stored); a sweep asking for more runs
than a sweep may queue is refused; admins and exempt users are not limited."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import Run, Sweep
from backend.services import auth, tokens

PASSWORD = "quota-test-password"
SWEEP = {"workload": {"model": "tiny"}, "world_size": 2, "top": 10, "controls": 3, "steps": 2, "precisions": ["fp32"], "accumulation": [1]}
"""13 runs a request: 53 of them queued 692 (one precision and no accumulation: a quicker plan, as many runs)."""
SPEC = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}}


def bearer(settings, email: str, role: str = "member") -> dict[str, str]:
    with session_scope(settings.sqlalchemy_url) as session:
        user = auth.create_user(session=session, email=email, password=PASSWORD, role=role)
        scopes = ["admin"] if role == "admin" else ["submit"]
        return {"Authorization": f"Bearer {tokens.create_token(session=session, name='jobs', scopes=scopes, user=user)}"}


def counts(settings) -> tuple[int, int]:
    with session_scope(settings.sqlalchemy_url) as session:
        runs = session.execute(select(func.count()).select_from(Run)).scalar_one()
        sweeps = session.execute(select(func.count()).select_from(Sweep)).scalar_one()
        return runs, sweeps


REQUESTS = 6
"""The incident's requests, one after another, as far as proves the stop: the three that fit under
40 (3 × 13 = 39), then three refused in a row (each one plans its 13 runs before it is refused, so
the 53 of the incident cost 50 plans more without reaching another branch)."""


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # a plan a request: once is enough
def test_repeated_sweep_requests_stop_at_the_per_user_limit_of_queued_runs(client, settings) -> None:
    settings.security.allow_local_mode, settings.security.secret_key = False, "quota-test-secret"
    ada = bearer(settings, "ada@lab.org")
    answers = [client.post("/api/v1/sweeps", json=SWEEP, headers=ada) for _ in range(REQUESTS)]
    accepted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code == 429]
    assert [a.status_code for a in answers] == [202] * 3 + [429] * (REQUESTS - 3)  # 3 × 13 = 39 of 40, then every one refused
    detail = refused[0].json()["detail"]
    assert "ada@lab.org has 39 runs queued or running and may have at most 40 (max_active_runs_per_user)" in detail, detail
    assert "this would add 13" in detail
    assert counts(settings) == (39 + 1, 3), "nothing of a refused sweep is stored (+1: the pool's calibrate run, no user's)"
    # One run more still fits; the next does not.
    assert client.post("/api/v1/runs", json=SPEC, headers=ada).status_code == 202
    over = client.post("/api/v1/runs", json=SPEC, headers=ada)
    assert over.status_code == 429 and "at most 40" in over.json()["detail"]
    # Another member has a quota of their own; an admin has none.
    assert client.post("/api/v1/sweeps", json=SWEEP, headers=bearer(settings, "bo@lab.org")).status_code == 202
    root = bearer(settings, "root@lab.org", role="admin")
    assert all(client.post("/api/v1/sweeps", json=SWEEP, headers=root).status_code == 202 for _ in range(4))
    # Cancelled runs no longer count.
    sweep_id = accepted[0].json()["id"]
    assert client.post(f"/api/v1/sweeps/{sweep_id}/cancel", headers=ada).status_code == 200
    assert client.post("/api/v1/sweeps", json=SWEEP, headers=ada).status_code == 202


def test_a_sweep_may_queue_at_most_max_runs_per_sweep_unless_exempt(client, settings) -> None:
    settings.security.allow_local_mode, settings.security.secret_key = False, "quota-test-secret"
    settings.quotas.max_runs_per_sweep = 12
    ada = bearer(settings, "ada@lab.org")
    refused = client.post("/api/v1/sweeps", json=SWEEP, headers=ada)
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("a sweep may queue at most 12 runs (max_runs_per_sweep); this one would queue 13")
    assert counts(settings) == (0, 0)
    settings.quotas.quota_exempt_emails = ["ada@lab.org"]
    assert client.post("/api/v1/sweeps", json=SWEEP, headers=ada).status_code == 202


def test_the_form_says_the_limit_too(client, settings) -> None:
    settings.quotas.max_active_runs_per_user = 1
    with session_scope(settings.sqlalchemy_url) as session:
        auth.create_user(session=session, email="ada@lab.org", password=PASSWORD, role="member")
    settings.security.allow_local_mode, settings.security.secret_key = False, "quota-test-secret"
    login = client.get("/login").text
    token = login.split('name="csrf_token" value="')[1].split('"')[0]
    client.post("/login", data={"email": "ada@lab.org", "password": PASSWORD, "csrf_token": token, "next": "/"})
    ada = bearer(settings, "bo@lab.org")  # a second member fills nothing of ada's quota
    assert client.post("/api/v1/runs", json=SPEC, headers=ada).status_code == 202
    form = client.get("/runs/new").text
    token = form.split('name="csrf_token" value="')[1].split('"')[0]
    fields = {"model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "2", "csrf_token": token}
    first = client.post("/runs/new", data=fields, follow_redirects=False)
    assert first.status_code == 303, first.text[:500]
    second = client.post("/runs/new", data=fields, follow_redirects=False)
    assert second.status_code == 429 and "may have at most 1 (max_active_runs_per_user)" in second.text
