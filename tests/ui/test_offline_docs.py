"""/docs and /redoc render in a real Chromium with every non-loopback request refused: the API
docs' assets come from the app itself (a lab network may have no internet)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium")


@pytest.fixture(scope="module")
def offline_page(live_server) -> Iterator:
    """A page whose every request off 127.0.0.1 is aborted, and the list of those it tried."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        blocked: list[str] = []

        def route(r) -> None:
            if urlsplit(r.request.url).hostname in ("127.0.0.1", "localhost"):
                r.continue_()
            else:
                blocked.append(f"{r.request.resource_type} {r.request.url}")
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.blocked = blocked  # type: ignore[attr-defined]
        yield page
        browser.close()


def test_swagger_ui_renders_the_operations_offline(offline_page, live_server) -> None:
    page = offline_page
    page.goto(live_server.url + "/docs")
    page.wait_for_selector(".opblock-summary-path")
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/v1/runs" in [p.strip() for p in paths]
    assert page.blocked == [], page.blocked


def test_redoc_renders_the_operations_offline(offline_page, live_server) -> None:
    page = offline_page
    page.goto(live_server.url + "/redoc")
    page.wait_for_selector("[data-section-id^='operation/']", state="attached")
    assert page.locator("[data-section-id^='operation/']").count() > 10
    # ReDoc's bundle links its own "powered by" logo from its CDN: the page's policy (images from
    # this host only) keeps the browser from asking for it, so no request at all leaves the host
    assert page.blocked == [], page.blocked


def test_the_docs_pages_name_no_cdn(client) -> None:
    for path in ("/docs", "/redoc"):
        html = client.get(path).text
        assert "cdn." not in html and "googleapis" not in html, path
        assert "/vendor/docs/" in html
    assert client.get("/vendor/docs/swagger-ui-bundle.js").status_code == 200
