"""The audit's forged uploads: "verified" means the lab's worker ran it, a missing check is "not
checked" everywhere, an uploaded loss reference is the uploader's word, ranks are held to the
document's own world size, and a CI series is its owner's.

Each forgery starts from a worker-like document (`make_document`, consistent with itself) beside
a genuine run of the lab's own (`store_run(source="form")`) of the same config.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import RankMetric, Run, SeriesVerdict
from backend.services.tokens import create_token
from backend.store import references as references_store
from parallab.core.checks import reference_key_of
from parallab.core.result import ResultDocument
from tests.backend.ci_documents import document as ci_document
from tests.backend.test_series import member
from tests.backend.test_series import upload as upload_as
from tests.ui.factories import make_document, store_run

GENUINE_TPS = 5_816.0


@pytest.fixture
def upload(client, settings):
    with session_scope(settings.sqlalchemy_url) as session:
        headers = {"Authorization": f"Bearer {create_token(session=session, name='ci', scopes=['upload'])}"}
    return lambda doc: client.post("/api/v1/results", json=doc, headers=headers)


@pytest.fixture
def genuine(settings) -> str:
    """The lab's own run of the config (a worker's run: every check present and passed)."""
    with session_scope(settings.sqlalchemy_url) as session:
        return store_run(session, make_document(tokens_per_s=GENUINE_TPS, loss_noise=1e-7), source="form").id


def doubled(**kwargs: Any) -> dict[str, Any]:
    """The genuine config at twice its throughput, consistent with its own ranks."""
    return make_document(tokens_per_s=2 * GENUINE_TPS, loss_noise=1e-7, seed=1, **kwargs).model_dump(mode="json")


def stripped() -> dict[str, Any]:
    """The audit's first forgery: gradient check, replica check, end-of-run check and loss reference
    all removed."""
    doc = doubled()
    doc["summary"].pop("gradient_check")
    doc["summary"].pop("replica_check")
    doc["summary"].pop("frozen_check")
    doc["summary"].pop("loss_max_rel_diff_vs_reference")
    doc["loss"]["reference"] = None
    return doc


def board(client, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/api/v1/leaderboard", params={"runs": "all", "limit": 500, **params})
    assert response.status_code == 200, response.text
    return response.json()["items"]


def test_an_upload_with_every_check_removed_is_not_checked_everywhere_and_never_verified(upload, client, genuine) -> None:
    response = upload(stripped())
    assert response.status_code == 201, response.text
    forged = response.json()
    summary = forged["result"]["summary"]
    assert summary["checks_not_checked"] == ["loss_reference", "gradient_check", "replica_check", "frozen_check"]
    # the leaderboard: only the lab's run under verified and passed; the forgery labelled "not checked"
    for params in ({"verified": "true", "checks": "passed"}, {"verified": "true"}, {"checks": "passed"}):
        assert [r["id"] for r in board(client, **params)] == [genuine], params
    best = client.get("/api/v1/leaderboard", params={"verified": "true", "checks": "passed"}).json()["items"]
    assert [r["tokens_per_s"] for r in best] == [pytest.approx(GENUINE_TPS)]
    rows = {r["id"]: r for r in board(client)}
    assert rows[forged["id"]]["checks_not_checked"] == ["loss", "gradient", "replica", "frozen"]
    assert rows[forged["id"]]["checks_failed"] == [] and rows[genuine]["checks_not_checked"] == []
    page = client.get("/leaderboard", params={"runs": "all"}).text
    assert "not checked: loss, gradient, replica, frozen" in page
    # the run page and compare say "not checked" for each check, never "passed"
    run_page = client.get(f"/runs/{forged['id']}").text
    for anchor in ('id="gradient-check"', 'id="replica-check"', 'id="frozen-check"'):
        card = run_page[run_page.index(anchor) :]
        assert "not checked" in card[: card.index("</h2>")] and "passed</span>" not in card[: card.index("</h2>")]
    assert 'data-reference="not checked"' in run_page
    compared = client.get("/api/v1/compare", params={"ids": f"{genuine},{forged['id']}"}).json()
    rows_by_key = {row["key"]: row["values"] for row in compared["metrics"]}
    assert rows_by_key["loss_check"][1] == rows_by_key["gradient_check"][1] == rows_by_key["replica_check"][1] == "not checked"
    assert rows_by_key["gradient_check"][0] == "passed"


def test_an_upload_with_every_check_stated_and_passed_is_still_not_verified(upload, client, genuine) -> None:
    response = upload(doubled())
    assert response.status_code == 201, response.text
    assert response.json()["result"]["summary"]["checks_not_checked"] == []
    assert [r["id"] for r in board(client, verified="true")] == [genuine]
    assert {r["id"] for r in board(client, checks="passed")} == {genuine, response.json()["id"]}


def test_a_forged_reference_equal_to_the_values_is_labelled_stated_by_the_uploader(upload, client, genuine) -> None:
    doc = doubled()
    doc["loss"]["reference"] = list(doc["loss"]["values"])
    doc["summary"]["loss_max_rel_diff_vs_reference"] = 0.0
    response = upload(doc)
    assert response.status_code == 201, response.text
    run = response.json()
    assert "loss_reference" in run["result"]["summary"]["checks_stated"]
    page = client.get(f"/runs/{run['id']}").text
    card = page[page.index('id="stat-loss"') :]
    assert "reference stated by the uploader" in card[: card.index("</div>")]
    compared = client.get("/api/v1/compare", params={"ids": f"{genuine},{run['id']}"}).json()
    loss = next(row["values"] for row in compared["metrics"] if row["key"] == "loss_check")
    assert loss == ["within the recipe's tolerance", "within the recipe's tolerance (reference stated by the uploader)"]
    assert [r["id"] for r in board(client, verified="true")] == [genuine]


def test_the_labs_reference_decides_the_verdict_and_the_uploaded_one_is_kept_beside_it(upload, client, settings) -> None:
    """The forged reference (equal to the values) against the lab's own curve: the lab's one finds
    the loss drift the forgery hid, and the uploader's curve stays in the document, labelled."""
    doc = make_document(tokens_per_s=2 * GENUINE_TPS).model_dump(mode="json")  # loss 1e-4 off its reference
    lab_curve = list(doc["loss"]["reference"])
    with session_scope(settings.sqlalchemy_url) as session:
        key = reference_key_of(ResultDocument.model_validate(doc))
        assert key is not None
        references_store.add_curve(session, key=key, device="cpu", model="tiny", seed=0, workload={}, loss=lab_curve, run_id=None)
    doc["loss"]["reference"] = list(doc["loss"]["values"])
    doc["summary"].pop("loss_max_rel_diff_vs_reference")
    response = upload(doc)
    assert response.status_code == 201, response.text
    run = response.json()
    loss = run["result"]["loss"]
    assert loss["reference"] == lab_curve and loss["reference_source"] == "lab database"
    assert loss["stated_reference"] == doc["loss"]["values"]
    assert "loss_reference" not in run["result"]["summary"]["checks_stated"]
    assert "loss_max_rel_diff_vs_reference" in [f["metric"] for f in run["result"]["flags"]]
    compared = client.get("/api/v1/compare", params={"ids": run["id"]}).json()
    verdict = next(row["values"][0] for row in compared["metrics"] if row["key"] == "loss_check")
    assert verdict == "beyond the recipe's tolerance ⚑ (the lab's reference; the uploader's kept beside it)"
    page = client.get(f"/runs/{run['id']}").text
    assert "the uploader's kept beside it" in page


def count(settings, table) -> int:
    with session_scope(settings.sqlalchemy_url) as session:
        return session.execute(select(func.count()).select_from(table)).scalar_one()


@pytest.mark.parametrize(
    "ranks, problem",
    [
        (lambda rs: [copy.deepcopy(r) for _ in range(5_000) for r in rs], "holds 10000 entries, but strategy.world_size is 2"),
        (lambda rs: [rs[0], {**copy.deepcopy(rs[1]), "rank": 0}], "repeated: 0"),
        (lambda rs: [rs[0], {**copy.deepcopy(rs[1]), "rank": 5}], "outside: 5"),
        (lambda rs: rs[:1], "holds 1 entries"),
    ],
    ids=["repeated-x5000", "duplicate-id", "out-of-range", "too-few"],
)
def test_ranks_are_held_to_the_documents_world_size_and_nothing_is_stored(upload, settings, ranks, problem) -> None:
    doc = ci_document()  # small ranks: ×5,000 stays under the body limit, as the audit's did
    doc["ranks"] = ranks(doc["ranks"])
    before = (count(settings, Run), count(settings, RankMetric))
    response = upload(doc)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert [d["loc"] for d in detail][0] == ["body", "ranks"] and problem in detail[0]["msg"]
    assert (count(settings, Run), count(settings, RankMetric)) == before


def test_another_members_upload_for_the_same_repository_and_branch_starts_its_own_series(client, settings) -> None:
    """Member B names A's repository and branch at half A's throughput: B's results go to B's own
    series, A's series holds only A's, and A's next result is judged against A's baseline alone."""
    settings.security.allow_local_mode, settings.security.secret_key = False, "trust-test-secret"
    ada, bo = member(settings, "ada@lab.org"), member(settings, "bo@lab.org")
    own = [upload_as(client, ada, ci_document(tokens_per_s=tps, commit=f"a{i:06d}")) for i, tps in enumerate((1000.0, 1010.0, 990.0))]
    assert len({u["series_id"] for u in own}) == 1
    theirs = [upload_as(client, bo, ci_document(tokens_per_s=500.0, commit=f"b{i:06d}")) for i in range(3)]
    assert {u["series_id"] for u in theirs} != {own[0]["series_id"]} and len({u["series_id"] for u in theirs}) == 1
    with session_scope(settings.sqlalchemy_url) as session:
        on_ada = session.execute(select(SeriesVerdict.run_id).where(SeriesVerdict.series_id == own[0]["series_id"])).scalars().all()
        assert set(on_ada) == {u["id"] for u in own}
    nxt = upload_as(client, ada, ci_document(tokens_per_s=1000.0, commit="a999999"))
    judged = next(v for v in nxt["verdicts"] if v["metric"] == "tokens_per_s")
    assert nxt["series_id"] == own[0]["series_id"] and judged["baseline_n"] == 3 and judged["verdict"] == "unchanged"
    assert (
        client.get(f"/api/v1/series/{theirs[0]['series_id']}", headers=bo).json()["owner_id"]
        != client.get(f"/api/v1/series/{own[0]['series_id']}", headers=ada).json()["owner_id"]
    )
