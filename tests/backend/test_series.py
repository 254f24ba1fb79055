"""CI series through the API (issue #11): batch uploads, verdicts in the answer, a baseline that moves
with main, dismissals kept, CI metadata checked, uploaders recorded and filtered, logins."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from backend.api import csrf
from backend.db import session_scope
from backend.models import Run, SeriesVerdict
from backend.services import auth, tokens
from tests.backend.ci_documents import document, slowed

PASSWORD = "series-test-password"


def member(settings, email: str, role: str = "member", scopes: tuple[str, ...] = ("upload",)) -> dict[str, str]:
    """A new user with a token of `scopes`; the Authorization header."""
    with session_scope(settings.sqlalchemy_url) as session:
        user = auth.create_user(session=session, email=email, password=PASSWORD, role=role)
        return {"Authorization": f"Bearer {tokens.create_token(session=session, name='ci', scopes=list(scopes), user=user)}"}


def upload(client, headers, body, status: int = 201) -> dict:
    response = client.post("/api/v1/results", json=body, headers=headers)
    assert response.status_code == status, response.text
    return response.json()


def verdict(item: dict, metric: str = "tokens_per_s") -> dict:
    return next(v for v in item["verdicts"] if v["metric"] == metric)


def count_runs(settings) -> int:
    with session_scope(settings.sqlalchemy_url) as session:
        return session.execute(select(func.count()).select_from(Run)).scalar_one()


def test_an_upload_joins_its_series_records_its_uploader_and_answers_with_verdicts(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    first = upload(client, ada, document(ci_url="https://ci.example/jobs/1", pr=7))
    assert first["user"] == "ada@lab.org" and first["series_id"] and first["pr"] == 7 and first["ci_url"] == "https://ci.example/jobs/1"
    assert {v["metric"] for v in first["verdicts"]} == {"tokens_per_s", "step_time_p50", "peak_memory_per_rank", "exposed_comm_fraction"}
    assert all(v["verdict"] == "no_baseline" for v in first["verdicts"]) and first["regressed"] is False
    second = upload(client, ada, slowed(document(), 1.01))
    assert second["series_id"] == first["series_id"], "same workload, strategy, options, hardware, repository and branch"
    other_branch = upload(client, ada, document(branch="feature/x"))
    assert other_branch["series_id"] != first["series_id"]
    no_branch = upload(client, ada, document(branch=None))
    assert no_branch["series_id"] is None and no_branch["verdicts"] == []


def test_a_batch_is_stored_all_or_nothing_and_replayed_by_its_key(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    bad = slowed(document(), 1.0)
    bad["ranks"][0]["model_state_bytes"]["grads"] = -1
    response = client.post("/api/v1/results", json=[document(), bad], headers=ada)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", 1, "ranks", 0, "model_state_bytes", "grads"]
    assert count_runs(settings) == 0, "nothing of a refused batch is kept"
    assert client.post("/api/v1/results", json=[], headers=ada).status_code == 422
    keyed = {**ada, "Idempotency-Key": "ci-build-9"}
    batch = upload(client, keyed, [document(), slowed(document(), 1.02), slowed(document(), 0.98)])
    assert len(batch["items"]) == 3 and batch["regressed"] is False
    again = client.post("/api/v1/results", json=[document(), slowed(document(), 1.02), slowed(document(), 0.98)], headers=keyed)
    assert again.status_code == 200 and [i["id"] for i in again.json()["items"]] == [i["id"] for i in batch["items"]]
    assert count_runs(settings) == 3


def test_a_branch_is_judged_against_main_and_the_baseline_moves_when_main_moves(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    main = upload(client, ada, document(tokens_per_s=1000.0))
    patched = client.patch(f"/api/v1/series/{main['series_id']}", json={"window": 3}, headers=ada)
    assert patched.status_code == 200 and patched.json()["config"]["window"] == 3
    for factor in (1.01, 0.99):
        upload(client, ada, slowed(document(tokens_per_s=1000.0), factor))

    same = upload(client, ada, document(tokens_per_s=1000.0, branch="feature", commit="feed001"))
    assert verdict(same)["verdict"] == "unchanged" and verdict(same)["baseline_branch"] == "main" and verdict(same)["baseline_n"] == 3
    slow = upload(client, ada, slowed(document(tokens_per_s=1000.0, branch="feature", commit="feed002"), 1.25))
    v = verdict(slow)
    assert v["verdict"] == "regressed" and v["change_pct"] == pytest.approx(-20, abs=1) and slow["regressed"] is True
    assert v["test"] == "t_test" and v["threshold"] == 0.01 and v["lower"] > v["value"]
    assert verdict(slow, "step_time_p50")["verdict"] == "regressed"

    for factor in (1.25, 1.26, 1.24):  # main moves: it is now 20% slower
        upload(client, ada, slowed(document(tokens_per_s=1000.0, commit="abcd123"), factor))
    now_same = upload(client, ada, slowed(document(tokens_per_s=1000.0, branch="feature", commit="feed003"), 1.25))
    assert verdict(now_same)["verdict"] == "unchanged", "judged against the latest main results"
    assert verdict(now_same)["baseline"] == pytest.approx(800, rel=0.02)
    back = upload(client, ada, document(tokens_per_s=1000.0, branch="feature", commit="feed004"))
    assert verdict(back)["verdict"] == "improved"


def test_an_alert_dismissed_as_a_false_positive_stays_dismissed(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    for factor in (1.0, 1.01, 0.99):
        upload(client, ada, slowed(document(), factor))
    slow = upload(client, ada, slowed(document(commit="bad0001"), 1.5))
    alert = verdict(slow)
    response = client.post(f"/api/v1/series/{slow['series_id']}/alerts/{alert['id']}/dismiss", json={"note": "noisy runner"}, headers=ada)
    assert response.status_code == 200 and response.json()["dismissed"] is True
    series = client.get(f"/api/v1/series/{slow['series_id']}", headers=ada).json()
    kept = next(v for p in series["points"] if p["run_id"] == slow["id"] for v in p["verdicts"] if v["metric"] == "tokens_per_s")
    assert kept["dismissed"] and kept["dismiss_note"] == "noisy runner" and kept["verdict"] == "regressed"
    assert series["open_alerts"] == 1, "throughput dismissed; the step time's alert is still open"
    unchanged = next(v for v in slow["verdicts"] if v["verdict"] != "regressed")
    refused = client.post(f"/api/v1/series/{slow['series_id']}/alerts/{unchanged['id']}/dismiss", json={}, headers=ada)
    assert refused.status_code == 422
    assert client.get("/api/v1/series/nope", headers=ada).status_code == 404
    assert client.patch(f"/api/v1/series/{slow['series_id']}", json={"test": "magic"}, headers=ada).status_code == 422
    misspelt = client.patch(f"/api/v1/series/{slow['series_id']}", json={"windw": 3}, headers=ada)
    assert misspelt.status_code == 422 and "unknown series setting 'windw'; valid: alpha, baseline_branch," in misspelt.text
    assert "did you mean 'window'?" in misspelt.text


@pytest.mark.parametrize(
    ("field", "value"),
    [("branch", "a..b"), ("branch", "has space"), ("commit", "xyz123"), ("ci_url", "ftp://ci/1"), ("pr", 0), ("repository", "a b")],
)
def test_ci_metadata_is_checked_and_named_when_wrong(client, settings, field, value) -> None:
    ada = member(settings, "ada@lab.org")
    doc = document()
    doc["source"][field] = value
    response = client.post("/api/v1/results", json=doc, headers=ada)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "source", field]
    assert count_runs(settings) == 0


def test_runs_and_the_leaderboard_filter_by_and_show_the_uploader(client, settings) -> None:
    ada, bo = member(settings, "ada@lab.org"), member(settings, "bo@lab.org")
    upload(client, ada, document(tokens_per_s=900.0))
    upload(client, bo, document(tokens_per_s=1100.0))
    assert {r["user"] for r in client.get("/api/v1/runs", params={"user": "ada@lab.org"}).json()["items"]} == {"ada@lab.org"}
    assert client.get("/api/v1/runs", params={"user": "nobody@lab.org"}).json()["items"] == []
    board = client.get("/api/v1/leaderboard", params={"runs": "all"}).json()["items"]
    assert sorted(r["user"] for r in board) == ["ada@lab.org", "bo@lab.org"]
    only_bo = client.get("/api/v1/leaderboard", params={"runs": "all", "user": "bo@lab.org"}).json()["items"]
    assert [r["user"] for r in only_bo] == ["bo@lab.org"]
    page = client.get("/leaderboard", params={"runs": "all"}).text
    assert "ada@lab.org" in page and "bo@lab.org" in page


def test_a_member_cannot_cancel_another_members_run_but_an_admin_can(client, settings) -> None:
    settings.security.allow_local_mode, settings.security.secret_key = False, "series-test-secret"  # off loopback a real secret is required
    ada = member(settings, "ada@lab.org", scopes=("submit",))
    bo = member(settings, "bo@lab.org", scopes=("submit",))
    root = member(settings, "root@lab.org", role="admin", scopes=("admin",))
    spec = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}}
    created = client.post("/api/v1/runs", json=spec, headers=ada)
    assert created.status_code == 202 and created.json()["user"] == "ada@lab.org"
    run_id = created.json()["id"]
    refused = client.post(f"/api/v1/runs/{run_id}/cancel", headers=bo)
    assert refused.status_code == 403 and client.get(f"/api/v1/runs/{run_id}", headers=bo).json()["status"] == "queued"
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=root).json()["status"] == "cancelled"


def test_a_member_cannot_switch_off_another_members_regression_detection(client, settings) -> None:
    """The request that changed another member's series: window 2, a baseline branch that does not
    exist and min_change 0.99. Refused (403) with nothing changed; the owner and an admin may."""
    settings.security.allow_local_mode, settings.security.secret_key = False, "series-test-secret"
    ada = member(settings, "ada@lab.org")
    bo = member(settings, "bo@lab.org")
    root = member(settings, "root@lab.org", role="admin", scopes=("admin",))
    for factor in (1.0, 1.01, 0.99):
        upload(client, ada, slowed(document(), factor))
    slow = upload(client, ada, slowed(document(commit="bad0001"), 1.5))
    series_url = f"/api/v1/series/{slow['series_id']}"
    before = client.get(series_url, headers=bo).json()
    assert before["owner_id"] is not None
    attack = {"window": 2, "baseline_branch": "no-such-branch", "min_change": 0.99}
    refused = client.patch(series_url, json=attack, headers=bo)
    assert refused.status_code == 403, refused.text
    assert "owner" in refused.text
    assert client.get(series_url, headers=bo).json()["config"] == before["config"], "nothing of a refused change is kept"
    alert = verdict(slow)
    dismiss = client.post(f"{series_url}/alerts/{alert['id']}/dismiss", json={"note": "not mine"}, headers=bo)
    assert dismiss.status_code == 403, dismiss.text
    assert client.get(series_url, headers=bo).json()["open_alerts"] == before["open_alerts"] > 0
    assert client.patch(series_url, json={"window": 5}, headers=ada).json()["config"]["window"] == 5
    assert client.patch(series_url, json={"min_change": 0.02}, headers=root).json()["config"]["min_change"] == 0.02
    assert client.post(f"{series_url}/alerts/{alert['id']}/dismiss", json={}, headers=root).json()["dismissed"] is True


def form_token(client, path: str = "/login") -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match
    return match.group(1)


@pytest.mark.parametrize(("host", "secure"), [("127.0.0.1", False), ("10.1.2.3", True)])
def test_login_sets_an_httponly_samesite_cookie_secure_off_loopback_and_logout_ends_it(client, settings, host, secure) -> None:
    settings.security.allow_local_mode, settings.server.host, settings.security.secret_key = False, host, "series-test-secret"
    member(settings, "ada@lab.org")
    assert client.get("/", follow_redirects=False).headers["location"] == "/login?next=%2F"
    if secure:  # off loopback the CSRF cookie is Secure too; httpx sends Secure cookies over https only,
        # so let the jar's copy travel on this plain-http test client, as a browser over TLS would send it
        assert "secure" in client.get("/login").headers["set-cookie"].lower()
        for cookie in client.cookies.jar:
            cookie.secure = False
    token = form_token(client)
    wrong = client.post("/login", data={"csrf_token": token, "email": "ada@lab.org", "password": "nope"}, follow_redirects=False)
    assert wrong.status_code == 401 and "wrong email or password" in wrong.text
    forged = client.post("/login", data={"email": "ada@lab.org", "password": PASSWORD}, follow_redirects=False)
    assert forged.status_code == 403, "the login form needs its CSRF token too"
    ok = client.post(
        "/login", data={"csrf_token": token, "email": "ada@lab.org", "password": PASSWORD, "next": "/leaderboard"}, follow_redirects=False
    )
    assert ok.status_code == 303 and ok.headers["location"] == "/leaderboard"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=lax" in cookie.lower() and ("Secure" in cookie) is secure
    if secure:  # httpx keeps Secure cookies for https only: carry it by hand, as a browser over TLS would
        client.cookies.set("parallab_session", ok.cookies["parallab_session"])
    page = client.get("/")
    assert page.status_code == 200 and "ada@lab.org" in page.text
    assert client.post("/logout", data={"csrf_token": form_token(client, "/")}, follow_redirects=False).status_code == 303
    client.cookies.delete("parallab_session")
    client.cookies.set("parallab_session", ok.cookies["parallab_session"])
    assert client.get("/", follow_redirects=False).status_code == 303, "the session is gone server-side, not only in this browser"


def test_a_member_makes_a_token_on_the_tokens_page_shown_once(client, settings) -> None:
    settings.security.allow_local_mode, settings.security.secret_key = False, "series-test-secret"
    member(settings, "ada@lab.org")
    token = form_token(client)
    client.post("/login", data={"csrf_token": token, "email": "ada@lab.org", "password": PASSWORD})
    page = client.post("/tokens", data={"csrf_token": form_token(client, "/tokens"), "name": "ci", "scope": ["upload"]})
    plain = re.search(r'id="new-token-value">(plb_[^<]+)<', page.text).group(1)
    assert plain not in client.get("/tokens").text, "shown once"
    stored = upload(client, {"Authorization": f"Bearer {plain}"}, document())
    assert stored["user"] == "ada@lab.org"
    admin_scope = client.post("/tokens", data={"csrf_token": form_token(client, "/tokens"), "name": "x", "scope": ["admin"]})
    assert admin_scope.status_code == 422 and "cannot hold the admin scope" in admin_scope.text


def test_the_series_page_draws_the_history_and_marks_the_alert(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    for factor in (1.0, 1.01, 0.99):
        upload(client, ada, slowed(document(), factor))
    slow = upload(client, ada, slowed(document(commit="bad0001"), 1.25))
    page = client.get(f"/series/{slow['series_id']}")
    assert page.status_code == 200
    assert f'data-run="{slow["id"]}"' in page.text and 'class="alert-row"' in page.text and "verdict-regressed" in page.text
    assert "threshold band" in page.text and '"symbol":["x"]' in page.text.replace(" ", "")
    run_page = client.get(f"/runs/{slow['id']}").text
    assert f'href="/series/{slow["series_id"]}"' in run_page
    assert slow["series_id"] in client.get("/series").text
    with session_scope(settings.sqlalchemy_url) as session:
        assert (
            session.execute(select(func.count()).select_from(SeriesVerdict).where(SeriesVerdict.verdict == "regressed")).scalar_one() >= 1
        )


def test_csrf_guards_api_writes_made_with_a_login_session(client, settings) -> None:
    settings.security.allow_local_mode, settings.security.secret_key = False, "series-test-secret"
    member(settings, "ada@lab.org")
    client.post("/login", data={"csrf_token": form_token(client), "email": "ada@lab.org", "password": PASSWORD})
    spec = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}}
    assert client.post("/api/v1/runs", json=spec).status_code == 403, "a cookie alone cannot write through the API"
    token = form_token(client, "/")
    assert client.post("/api/v1/runs", json=spec, headers={"X-CSRF-Token": token}).status_code == 202
    assert client.get("/api/v1/runs?user=ada@lab.org").json()["items"][0]["user"] == "ada@lab.org"
    assert csrf.COOKIE in client.cookies


def test_latest_values_read_what_the_per_metric_query_reads(settings) -> None:
    """The baseline of every metric in two queries (the latest runs, then their verdicts) equals the
    per-metric query over the whole series: runs without a metric, ties on created_at at the
    window's edge, excluded runs and windows longer than the series included."""
    from datetime import UTC, datetime, timedelta

    from backend.models import Series
    from backend.store import series as series_store

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with session_scope(settings.sqlalchemy_url) as session:
        session.add(
            Series(id="s" * 32, family="f" * 32, branch="main", workload_key="w", hardware_key="cpu", strategy="ddp", world_size=2,
                   options={}, model="tiny", label="tiny", test="t_test", window=10, baseline_branch="main", alpha=0.01, mad_k=4.0,
                   min_change=0.02)
        )  # fmt: skip
        session.flush()
        runs = []
        for i in range(14):
            at = t0 + timedelta(minutes=i if i not in (9, 10) else 9)  # runs 9 and 10 tie
            run = Run(name=f"r{i}", status="succeeded", source="ci", spec={}, strategy="ddp", world_size=2, model="tiny",
                      series_id="s" * 32, created_at=at)  # fmt: skip
            session.add(run)
            runs.append(run)
        session.flush()
        rows = []
        for i, run in enumerate(runs):
            metrics = ["tokens_per_s"] + (["peak_memory_per_rank"] if i % 3 else []) + (["exposed_comm_fraction"] if i < 4 else [])
            for metric in metrics:
                rows.append({"series_id": "s" * 32, "run_id": run.id, "metric": metric, "value": float(i),
                             "verdict": "unchanged", "baseline_n": 0, "baseline_branch": "main", "test": "t_test",
                             "threshold": 0.01, "dismissed": False})  # fmt: skip
        series_store.add_verdicts(session, rows)
        session.flush()
        metrics = ["tokens_per_s", "peak_memory_per_rank", "exposed_comm_fraction", "step_time_p50"]
        for window in (1, 2, 3, 4, 5, 10, 20):
            for exclude in ([], [runs[13].id], [runs[12].id, runs[11].id], [r.id for r in runs]):
                got = series_store.latest_values(session, series_id="s" * 32, metrics=metrics, window=window, exclude_runs=exclude)
                for metric in metrics:
                    want = series_store.baseline_values(session, series_id="s" * 32, metric=metric, window=window, exclude_runs=exclude)
                    assert got[metric] == want, (window, len(exclude), metric)
