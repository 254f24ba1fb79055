"""The one handler for the domain errors: an error with a page title answers a page route with the
HTML error page and the API with JSON, each with the error's own status and message."""

from __future__ import annotations

import pytest

from backend.services.auth import Forbidden
from backend.services.errors import DomainError
from backend.services.quotas import QuotaExceeded


@pytest.mark.parametrize(
    ("error", "status", "title"),
    [
        (Forbidden("viewers may not cancel runs"), 403, "Not allowed"),
        (QuotaExceeded("at most 3 runs <b>queued</b>"), 429, "Over the quota"),
    ],
)
def test_a_page_route_gets_the_error_page_and_the_api_gets_json(client, error: DomainError, status: int, title: str) -> None:
    def boom() -> None:
        raise error

    client.app.add_api_route("/api/v1/_boom", boom)
    client.app.add_api_route("/_boom", boom)
    api = client.get("/api/v1/_boom")
    assert api.status_code == status and api.headers["content-type"].startswith("application/json")
    assert api.json() == {"detail": str(error)}
    page = client.get("/_boom")
    assert page.status_code == status and page.headers["content-type"].startswith("text/html")
    assert title in page.text and "<b>queued</b>" not in page.text  # the message is escaped
    assert str(error).split("<")[0] in page.text
