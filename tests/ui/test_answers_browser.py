"""What a new user asks of the pages, in a real Chromium under the app's own Content-Security-Policy
(no bypass): a verdict that decides at 3 runs against 3 and says how many more 2 against 2 needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backend.test_repeats import _store as store_runs
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, LiveServer, make_settings

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium")

WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation',
  e => window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline')));
"""


@pytest.fixture(scope="module")
def answers_settings(tmp_path_factory: pytest.TempPathFactory):
    return make_settings(tmp_path_factory.mktemp("answers"))


@pytest.fixture(scope="module")
def server(answers_settings) -> Iterator[LiveServer]:
    from backend.api.app import create_app
    from backend.config import get_settings

    app = create_app()
    app.dependency_overrides[get_settings] = lambda: answers_settings
    with LiveServer(app) as live:
        yield live


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser):
    """A page under the app's CSP that fails the test on any console error or policy violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(WATCH_VIOLATIONS)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.set_default_timeout(20_000)
    yield page
    errors += page.evaluate("window.__cspViolations || []")
    context.close()
    assert errors == [], errors


def test_three_separated_runs_against_three_decide_and_two_against_two_say_how_many_more(page, server, answers_settings) -> None:
    fsdp = store_runs(answers_settings, "fsdp", [5_800, 6_000, 5_900])
    ddp = store_runs(answers_settings, "ddp", [14_100, 14_500, 14_300])
    page.goto(f"{server.url}/compare?ids={','.join(fsdp + ddp)}&baseline={fsdp[0]}")
    line = page.locator("#decision p.verdict").inner_text()
    assert line.startswith("ddp ×2 is 2.4") and "× faster than fsdp ×2 (95% CI" in line and "n = 3 and 3" in line, line
    assert page.locator("#decision p.verdict.significant").count() == 1
    # every interval says its coverage: 3 runs' range covers the median 75 % of the time
    assert "75.0% coverage with 3 runs" in page.locator("#configurations").inner_text()

    fsdp2 = store_runs(answers_settings, "fsdp", [9_000, 12_500])
    ddp2 = store_runs(answers_settings, "ddp", [11_000, 15_000])
    page.goto(f"{server.url}/compare?ids={','.join(fsdp2 + ddp2)}&baseline={fsdp2[0]}")
    line = page.locator("#decision p.verdict").inner_text()
    assert "not decided" in line and "n = 2 and 2" in line and "more each" in line, line
    assert page.locator("#decision p.verdict.not-significant").count() == 1
    assert "50.0% coverage with 2 runs" in page.locator("#configurations").inner_text()
