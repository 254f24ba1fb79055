"""The routing and end-of-run checks in an uploaded document: the uploader's word, labelled so,
held to their own verdicts, and flagged (on the run page and in the run's failed checks) when
they fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from backend.db import session_scope
from backend.services.tokens import create_token
from tests.ui.factories import make_document

ROUTING: dict[str, Any] = {
    "passed": True,
    "tolerance": 0.01,
    "near_tie_gap": 1e-2,
    "tokens": 2048,
    "disagreements": 7,
    "near_ties": 7,
    "unexplained_rate": 0.0,
}
FROZEN: dict[str, Any] = {
    "passed": False,
    "tolerance": 1e-6,
    "min_motion": 0.0,
    "least_moved": "layers.0.attention.wo.weight (rank 0)",
    "params_checked": 78,
    "frozen": ["layers.0.attention.wo.weight (rank 0)", "layers.0.attention.wo.weight (rank 1)"],
    "from_step": 0,
    "to_step": 4,
}


@pytest.fixture
def upload(client, settings):
    with session_scope(settings.sqlalchemy_url) as session:
        headers = {"Authorization": f"Bearer {create_token(session=session, name='ci', scopes=['upload'])}"}
    return lambda doc: client.post("/api/v1/results", json=doc, headers=headers)


def document(**checks: dict[str, Any]) -> dict[str, Any]:
    doc = make_document(strategy="ddp", world_size=2, tokens_per_s=12_000.0).model_dump(mode="json")
    doc["summary"].update(checks)
    return doc


def test_uploaded_routing_and_end_of_run_checks_are_stated_and_a_frozen_parameter_is_flagged(upload, client) -> None:
    response = upload(document(routing_check=ROUTING, frozen_check=FROZEN))
    assert response.status_code == 201, response.text
    run = response.json()
    summary = run["result"]["summary"]
    assert {"routing_check", "frozen_check"} <= set(summary["checks_stated"]), summary["checks_stated"]
    assert "frozen_check.min_motion" in {f["metric"] for f in run["result"]["flags"]}
    assert "routing_check.unexplained_rate" not in {f["metric"] for f in run["result"]["flags"]}
    page = client.get(f"/runs/{run['id']}").text
    for card in ("routing-check", "frozen-check"):
        section = page[page.index(f'id="{card}"') :]
        assert "stated by the uploader" in section[: section.index("</h2>")], card
    frozen = page[page.index('id="frozen-check"') :]
    assert 'data-passed="false"' in page[page.index('id="frozen-check"') - 200 :][:400]
    assert "layers.0.attention.wo.weight (rank 1)" in frozen and "step 0" in frozen and "step 4" in frozen
    gradient = page[page.index('id="gradient-step"') :]
    assert gradient[: gradient.index("</dd>")].endswith("not stated"), "a document from before the step was stated"
    metrics = {m["key"]: m["values"] for m in client.get(f"/compare.json?ids={run['id']}").json()["metrics"]}
    assert metrics["frozen_check"] == ["failed ⚑ (stated by the uploader)"], metrics["frozen_check"]
    assert metrics["routing_check"] == ["passed (stated by the uploader)"], metrics["routing_check"]


@pytest.mark.parametrize(
    ("check", "altered", "field"),
    [
        ("routing_check", {**ROUTING, "unexplained_rate": 0.5}, "routing_check"),  # passed over a failing rate
        ("routing_check", {**ROUTING, "near_ties": 9}, "routing_check"),  # more near-ties than disagreements
        ("frozen_check", {**FROZEN, "passed": True}, "frozen_check"),  # passed over a parameter that never moved
    ],
)
def test_a_stated_check_that_contradicts_its_own_numbers_is_refused(upload, check, altered, field) -> None:
    response = upload(document(**{check: altered}))
    assert response.status_code == 422, response.text
    assert any(field in ".".join(str(x) for x in p["loc"]) for p in response.json()["detail"]), response.text
