"""Reproduce an upload through the API and the pages (no worker here: the reproduction's result is
stored through the worker's own ingest path, `attach_result`; tests/e2e runs a real worker)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from backend.db import session_scope
from backend.models import Run
from backend.services.ingest import attach_result
from backend.services.reproduce import TOLERANCE
from backend.services.tokens import create_token
from tests.ui.factories import make_document, store_run


@pytest.fixture
def uploaded(client, settings) -> dict[str, Any]:
    """An upload of tiny ddp × 2 at 12,000 tokens/s."""
    with session_scope(settings.sqlalchemy_url) as session:
        headers = {"Authorization": f"Bearer {create_token(session=session, name='ci', scopes=['upload'])}"}
    doc = make_document(tokens_per_s=12_000.0, loss_noise=1e-7).model_dump(mode="json")
    response = client.post("/api/v1/results", json=doc, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


def finish(settings, run_id: str, tokens_per_s: float) -> None:
    """The reproduction's result, as a worker would store it."""
    with session_scope(settings.sqlalchemy_url) as session:
        run = session.get(Run, run_id)
        run.status = "running"
        attach_result(session, run=run, document=make_document(tokens_per_s=tokens_per_s, loss_noise=1e-7, seed=3))
        session.commit()


def test_reproduce_queues_the_uploads_own_spec_as_a_linked_lab_run(client, settings, uploaded) -> None:
    response = client.post(f"/api/v1/runs/{uploaded['id']}/reproduce")
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["status"] == "queued" and run["reproduces_id"] == uploaded["id"] and run["source"] == "api"
    assert run["spec"]["workload"]["model"] == uploaded["spec"]["workload"]["model"]
    assert run["spec"]["strategy"]["name"] == "ddp" and run["spec"]["strategy"]["world_size"] == 2 and run["spec"]["trace"] is True
    pending = client.get(f"/api/v1/runs/{uploaded['id']}/reproduction").json()
    assert pending["reproduction_id"] == run["id"] and pending["reproduced"] is None and pending["verdict"] == "reproduction queued"


def test_only_an_upload_is_reproduced(client, settings) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        lab_run = store_run(session, make_document(), source="form").id
    refused = client.post(f"/api/v1/runs/{lab_run}/reproduce")
    assert refused.status_code == 409 and "not an upload" in refused.json()["detail"]
    assert client.post("/api/v1/runs/0123456789abcdef0123456789abcdef/reproduce").status_code == 404
    assert client.get(f"/api/v1/runs/{lab_run}/reproduction").status_code == 404


@pytest.mark.parametrize(
    "measured, reproduced, verdict",
    [
        (12_000.0 * 1.03, True, r"^reproduced within \d+\.\d %$"),
        (6_000.0, False, r"^not reproduced: throughput measured 6,000 against 1\.2e\+04 stated \(-50\.0%\)"),
    ],
    ids=["within", "half"],
)
def test_the_verdict_holds_measured_against_stated(client, settings, uploaded, measured, reproduced, verdict) -> None:
    run = client.post(f"/api/v1/runs/{uploaded['id']}/reproduce").json()
    finish(settings, run["id"], measured)
    for side in (uploaded["id"], run["id"]):  # the same verdict from either run
        found = client.get(f"/api/v1/runs/{side}/reproduction").json()
        assert found["reproduced"] is reproduced and re.match(verdict, found["verdict"]), found["verdict"]
        tps = next(f for f in found["figures"] if f["key"] == "tokens_per_s")
        assert tps["stated"] == pytest.approx(12_000.0) and tps["measured"] == pytest.approx(measured)
        assert (abs(tps["rel_diff"]) <= TOLERANCE) is reproduced
    # both pages: the figures side by side and the verdict
    for side in (uploaded["id"], run["id"]):
        page = client.get(f"/runs/{side}").text
        assert f'data-reproduced="{"true" if reproduced else "false"}"' in page
        assert f'href="/runs/{uploaded["id"]}" id="reproduction-upload"' in page
        assert f'href="/runs/{run["id"]}" id="reproduction-run"' in page
        assert re.search(verdict.lstrip("^").split(r"\(")[0][:20], page)


def test_the_upload_page_has_a_reproduce_button_guarded_by_csrf(client, settings, uploaded) -> None:
    page = client.get(f"/runs/{uploaded['id']}").text
    assert 'id="reproduce-form"' in page and "uploaded: not verified" in page
    token = re.search(r'id="reproduce-form">\s*<input type="hidden" name="csrf_token" value="([^"]+)"', page).group(1)
    forged = client.post(f"/runs/{uploaded['id']}/reproduce", data={"csrf_token": "x"}, follow_redirects=False)
    assert forged.status_code == 403
    done = client.post(f"/runs/{uploaded['id']}/reproduce", data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303
    new_page = client.get(done.headers["location"]).text
    assert "verified: run by the lab's worker" in new_page and 'id="reproduction-verdict">reproduction queued' in new_page
    assert 'id="reproduce-form"' not in new_page, "a lab run has nothing to reproduce"
