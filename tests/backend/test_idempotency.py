"""Idempotency-Key under concurrency, on Postgres: one stored run, whoever wins the race, and the
same key with a different document refused (409)."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import update

from backend.db import session_scope
from backend.models import Run
from tests.backend.test_api_results import DOCUMENT, count, token

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

UPLOADERS = 20


def test_twenty_parallel_uploads_with_one_key_store_one_run(client, settings) -> None:
    settings.server.upload_queue = UPLOADERS  # room for all of them: none is turned away
    headers = {**token(settings, "upload"), "Idempotency-Key": "ci-build-race"}
    start = threading.Barrier(UPLOADERS)

    def upload(_: int):
        start.wait()  # all twenty requests in flight at once
        return client.post("/api/v1/results", json=DOCUMENT, headers=headers)

    with ThreadPoolExecutor(UPLOADERS) as pool:
        responses = list(pool.map(upload, range(UPLOADERS)))

    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * (UPLOADERS - 1) + [201], [r.text[:200] for r in responses if r.status_code >= 300]
    assert len({r.json()["id"] for r in responses}) == 1
    assert count(settings, Run) == 1


def test_twenty_parallel_uploads_with_one_key_over_a_short_queue_answer_the_run_or_a_clean_503(client, settings) -> None:
    """Those turned away get 503 with Retry-After and nothing stored; their retries get the one run."""
    settings.server.upload_concurrency, settings.server.upload_queue = 2, 3
    headers = {**token(settings, "upload"), "Idempotency-Key": "ci-build-busy"}
    start = threading.Barrier(UPLOADERS)

    def upload(_: int):
        start.wait()
        return client.post("/api/v1/results", json=DOCUMENT, headers=headers)

    with ThreadPoolExecutor(UPLOADERS) as pool:
        responses = list(pool.map(upload, range(UPLOADERS)))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 201, 503} and codes.count(201) == 1, [r.text[:200] for r in responses]
    busy = [r for r in responses if r.status_code == 503]
    assert busy and all(int(r.headers["retry-after"]) >= 1 for r in busy)
    run_id = next(r.json()["id"] for r in responses if r.status_code == 201)
    assert {r.json()["id"] for r in responses if r.status_code < 300} == {run_id}
    retries = [client.post("/api/v1/results", json=DOCUMENT, headers=headers) for _ in busy]
    assert {(r.status_code, r.json()["id"]) for r in retries} == {(200, run_id)}
    assert count(settings, Run) == 1


def test_the_same_key_with_a_different_document_is_409(client, settings) -> None:
    headers = {**token(settings, "upload"), "Idempotency-Key": "ci-build-8"}
    first = client.post("/api/v1/results", json=DOCUMENT, headers=headers)
    assert first.status_code == 201
    other = copy.deepcopy(DOCUMENT)
    other["summary"]["tokens_per_s"] = 999.0
    response = client.post("/api/v1/results", json=other, headers=headers)
    assert response.status_code == 409
    assert "ci-build-8" in response.json()["detail"] and "different result document" in response.json()["detail"]
    assert count(settings, Run) == 1


def test_the_same_document_reformatted_is_the_same_upload(client, settings) -> None:
    """Key order and whitespace are not content: a CI retry that re-serialises replays."""
    import json

    headers = {**token(settings, "upload"), "Idempotency-Key": "ci-build-9", "content-type": "application/json"}
    assert client.post("/api/v1/results", content=json.dumps(DOCUMENT), headers=headers).status_code == 201
    reordered = json.dumps(dict(reversed(list(DOCUMENT.items()))), indent=2)
    assert client.post("/api/v1/results", content=reordered, headers=headers).status_code == 200


def test_a_run_stored_before_body_hashes_replays_as_before(client, settings) -> None:
    headers = {**token(settings, "upload"), "Idempotency-Key": "ci-build-legacy"}
    run_id = client.post("/api/v1/results", json=DOCUMENT, headers=headers).json()["id"]
    with session_scope(settings.sqlalchemy_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(idempotency_body_sha256=None))
    other = copy.deepcopy(DOCUMENT)
    other["name"] = "renamed"
    again = client.post("/api/v1/results", json=other, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == run_id


def test_two_users_may_use_the_same_key_and_neither_gets_the_others_run(client, settings) -> None:
    """Keys belong to the token's owner: a predictable key (a build number) taken by one team does not
    turn another team's upload into a replay of the first team's run, nor into a 409."""
    from tests.backend.test_series import member

    alice, bob = member(settings, "alice@lab.example"), member(settings, "bob@lab.example")
    key = {"Idempotency-Key": "build-42"}
    first = client.post("/api/v1/results", json=DOCUMENT, headers={**alice, **key})
    same_doc = client.post("/api/v1/results", json=DOCUMENT, headers={**bob, **key})
    assert (first.status_code, same_doc.status_code) == (201, 201), same_doc.text
    assert same_doc.json()["id"] != first.json()["id"]
    other = copy.deepcopy(DOCUMENT)
    other["name"] = "bob's other build"
    assert client.post("/api/v1/results", json=other, headers={**member(settings, "carol@lab.example"), **key}).status_code == 201
    # each owner's own retry still replays their own run, and a different document under it is still 409
    assert client.post("/api/v1/results", json=DOCUMENT, headers={**alice, **key}).json()["id"] == first.json()["id"]
    assert client.post("/api/v1/results", json=DOCUMENT, headers={**bob, **key}).json()["id"] == same_doc.json()["id"]
    assert client.post("/api/v1/results", json=other, headers={**alice, **key}).status_code == 409
    assert count(settings, Run) == 3
