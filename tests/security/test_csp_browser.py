"""The Content-Security-Policy in a real Chromium: every page still draws its plots with the
app's own plotly.js and static JS, and the browser reports no violation of the policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ui.conftest import CHROMIUM, LiveServer, make_settings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium"),
]

# Recorded before any page script runs, so nothing the page does can hide it.
WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', e =>
  window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline') + ' ' + (e.sourceFile || '')));
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict]]:
    from backend.api.app import create_app
    from backend.config import get_settings
    from backend.db import get_sessionmaker
    from tests.ui.factories import seed_lab

    settings = make_settings(tmp_path_factory.mktemp("csp"))
    with get_sessionmaker(settings.sqlalchemy_url)() as session:
        lab = {k: r.id for k, r in seed_lab(session).items()}
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with LiveServer(app) as live:
        yield live, lab


def pages(lab: dict) -> list[tuple[str, int]]:
    """(path, plots it must draw)."""
    return [
        (f"/runs/{lab['ddp2']}", 3),
        (f"/runs/{lab['pp4']}", 3),
        (f"/runs/{lab['moe2']}", 3),
        (f"/compare?ids={lab['ddp2']}&ids={lab['fsdp2']}", 3),
        ("/scaling", 2),
        ("/leaderboard", 0),
        ("/runs/new", 0),
        ("/", 0),
    ]


def test_pages_render_their_plots_with_no_csp_violation(server, browser) -> None:
    from playwright.sync_api import expect

    live, lab = server
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(WATCH_VIOLATIONS)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}") if msg.type in ("error", "warning") else None)
    page.on("pageerror", lambda exc: console.append(f"pageerror: {exc}"))
    page.set_default_timeout(20_000)
    try:
        for path, plots in pages(lab):
            response = page.goto(live.url + path)
            assert response is not None and "frame-ancestors 'none'" in response.headers["content-security-policy"], path
            if plots:
                page.wait_for_selector(".js-plotly-plot .main-svg")
                assert page.locator(".js-plotly-plot .main-svg").count() >= plots, path
            page.wait_for_load_state("networkidle")
            assert page.evaluate("window.__cspViolations") == [], path
        # The form's own script runs under the policy too: its live check fills in the prediction.
        page.goto(live.url + "/runs/new")
        page.select_option("#f-strategy", "tp")
        page.fill("#f-world_size", "3")  # tp on 3 ranks: the live check refuses and disables submit
        expect(page.locator("#submit-run")).to_be_disabled()  # locators, not eval: the CSP forbids eval
        page.fill("#f-world_size", "2")
        expect(page.locator("#submit-run")).to_be_enabled()
        assert page.evaluate("window.__cspViolations") == []
    finally:
        context.close()
    assert [m for m in console if "Content Security Policy" in m or "pageerror" in m or m.startswith("error")] == [], console
