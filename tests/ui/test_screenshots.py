"""Every page at 1400 px and at 700 px in a real Chromium: no sideways page scroll, every table
scrolls inside its own card; and, when PARALLAB_SCREENSHOTS names a folder, a screenshot of each
(docs/screenshots holds the committed set: PARALLAB_SCREENSHOTS=docs/screenshots python -m pytest
tests/ui/test_screenshots.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.ui.conftest import CHROMIUM
from tests.ui.factories import lab_pages

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium")

WIDTHS = (1400, 700)
TABS = 5
"""Pages loading at once, each in its own tab of one context (the same viewport)."""

LAYOUT = """() => {
  const doc = document.documentElement;
  const main = document.querySelector('main') || document.body;
  const limit = main.getBoundingClientRect().right + 1;
  const escaped = Array.from(document.querySelectorAll('table')).filter(t => {
    const box = (t.closest('.table-wrap') || t).getBoundingClientRect();
    return box.right > limit;
  }).map(t => t.id || t.className);
  const unwrapped = Array.from(document.querySelectorAll('table.data:not(.compact)'))
    .filter(t => !t.closest('.table-wrap')).map(t => t.id || t.className);
  return {overflow: doc.scrollWidth - doc.clientWidth, escaped, unwrapped};
}"""


@pytest.fixture(scope="module")
def pages(live_server, lab, lab_series, app) -> dict[str, str]:
    """Name → path of every page, with a sweep made through its form so its page has content."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        return _pages(client, lab, lab_series)


def _pages(client, lab, series_id: str) -> dict[str, str]:
    out = lab_pages(client, lab, series_id)
    assert f'href="{out["series"]}"' in client.get("/series").text, "the series list links to the series"
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_its_width_and_tables_scroll_in_their_card(browser, live_server, pages, width) -> None:
    # Screenshots only when asked for: they are for docs/screenshots, and nothing here reads them.
    out = Path(os.environ["PARALLAB_SCREENSHOTS"]) if os.environ.get("PARALLAB_SCREENSHOTS") else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": width, "height": 900})
    problems: list[tuple[str, object]] = []
    names = list(pages)
    for start in range(0, len(names), TABS):
        # Each page waits for its own network to go idle (500 ms without a request), but the
        # waits of a batch overlap instead of adding up: one after another they were half the test.
        opened = []
        for name in names[start : start + TABS]:
            page = context.new_page()
            opened.append((name, page, page.goto(live_server.url + pages[name], wait_until="commit")))
        for name, page, response in opened:
            if response is None or not response.ok:
                problems.append((name, response.status if response else "no response"))
            page.wait_for_load_state("networkidle")
            if page.locator("figure.chart[data-figure]").count():
                page.wait_for_selector("figure.chart .main-svg")
            layout = page.evaluate(LAYOUT)
            if layout["overflow"] > 1 or layout["escaped"] or (layout["unwrapped"] and name != "api-docs"):
                problems.append((name, layout))
            if out is not None:
                page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=True)
            page.close()
    context.close()
    assert problems == [], problems
