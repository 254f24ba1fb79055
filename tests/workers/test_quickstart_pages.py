"""docs/quickstart.md's walk-through, kept current: the pages it shows, rendered in Chromium from
real runs, say what its text quotes, and its screenshots are of those pages.

The runs are the shared DDP and FSDP runs on `tiny` (`harness_job`: the same two that
test_strategies reads, folded into the group's one 2-rank launch, so no torchrun of its own),
stored as a worker stores its result, served by the real app. Each screenshot is one element of
a page (small PNGs), written to a temporary folder; `PARALLAB_UPDATE_SCREENSHOTS=1` writes them
over docs/img/ instead, for a doc change. Without it the test checks that every image the doc
names exists, is a PNG of a sane size, and that every phrase the doc quotes is on the element its
screenshot shows.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from backend.db import session_scope
from tests.ui.conftest import CHROMIUM, LiveServer, make_settings
from tests.ui.factories import store_run

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing")]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "quickstart.md"
IMAGES = REPO / "docs" / "img"
UPDATE = os.environ.get("PARALLAB_UPDATE_SCREENSHOTS") == "1"
MAX_IMAGE_BYTES = 250_000
"""One element's screenshot; the walk-through's images stay under 1 MB together."""

# (image, page, selector of the element shot, phrases the doc quotes from that element)
SHOTS = [
    ("quickstart-form.png", "form", "#prediction", ["memory per rank", "all_gather", "reduce_scatter"]),
    ("quickstart-memory.png", "compare", "#memory-answer-card", ["less memory per rank than", "allocated at the peak on the busiest rank"]),
    ("quickstart-verdict.png", "compare", "#decision", ["not decided", "more each", "exposed communication", "compute", "idle"]),
    ("quickstart-steps.png", "compare", ".chart-card:has(#chart-steps)", ["compute", "exposed"]),
]


HARNESS_JOBS = [("ddp", 2, {}, {}), ("fsdp", 2, {}, {})]
"""The two runs the walk-through submits, declared to the `tiny-runs` group's folded launches
(tests/workers/conftest.py): launched with the group's other 2-rank jobs, whichever file asks first."""


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def check_quoted(image: str, phrases: list[str], text: str, prose: str) -> None:
    """Every phrase is on the element its screenshot shows and in the doc's prose."""
    for phrase in phrases:
        assert phrase.lower() in text.lower(), f"{image}: the page no longer says {phrase!r}: {text[:600]}"
        assert phrase.lower() in prose, f"docs/quickstart.md no longer quotes {phrase!r} (shown in {image})"


@pytest.mark.parametrize(
    ("text", "prose"),
    [("not decided: run 2 more each", "the verdict is decided"), ("1.2x faster", "it is not decided: run 2 more each")],
    ids=["doc-stale", "page-changed"],
)
def test_the_quote_check_fails_when_the_doc_or_the_page_moves_on(text: str, prose: str) -> None:
    with pytest.raises(AssertionError):
        check_quoted("quickstart-verdict.png", ["not decided", "more each"], text, prose)


@pytest.fixture(scope="module")
def quickstart_runs(harness_job, tmp_path_factory: pytest.TempPathFactory):
    """The two runs the walk-through submits (DDP and FSDP, 2 ranks, tiny), in a fresh lab."""
    ddp, _ = harness_job("ddp", 2)
    fsdp, _ = harness_job("fsdp", 2)
    settings = make_settings(tmp_path_factory.mktemp("quickstart"))
    with session_scope(settings.sqlalchemy_url) as session:
        ids = {
            name: store_run(session, doc.model_copy(update={"name": f"{name} tiny"}), source="form").id
            for name, doc in (("ddp", ddp), ("fsdp", fsdp))
        }
    return settings, ids


def test_the_quickstart_shows_what_its_pages_say(quickstart_runs, browser, tmp_path: Path) -> None:
    settings, ids = quickstart_runs
    doc = DOC.read_text()
    prose = " ".join(doc.split()).lower()  # the doc's lines wrap anywhere
    from backend.api.app import create_app
    from backend.config import get_settings

    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    out = IMAGES if UPDATE else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    with LiveServer(app) as server:
        context = browser.new_context(viewport={"width": 1000, "height": 900}, color_scheme="light", device_scale_factor=1)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(30_000)

        def show(where: str) -> None:
            if where == "form":
                page.goto(server.url + "/runs/new")
                page.select_option("#f-strategy", "fsdp")
                page.fill("#f-world_size", "2")
                # FSDP's prediction, not the default DDP's still on screen (no string eval: the app's CSP forbids it)
                page.locator("#prediction-body", has_text="reduce_scatter").wait_for()
                expect(page.locator("#submit-run")).to_be_enabled()
            else:
                page.goto(f"{server.url}/compare?ids={ids['ddp']},{ids['fsdp']}&baseline={ids['ddp']}")
                page.wait_for_selector("#chart-steps .main-svg")

        shown = None
        for image, where, selector, phrases in SHOTS:
            if where != shown:
                show(where)
                shown = where
            element = page.locator(selector).first
            text = " ".join(element.evaluate("e => e.textContent").split())
            check_quoted(image, phrases, text, prose)
            element.scroll_into_view_if_needed()
            element.screenshot(path=str(out / image), animations="disabled")
            fresh = (out / image).read_bytes()
            width, height = png_size(fresh)
            assert 100 < width <= 1000 and 20 < height <= 1400, (image, width, height)
            assert len(fresh) <= MAX_IMAGE_BYTES, (image, len(fresh))
        context.close()
    assert errors == []

    named = re.findall(r"!\[[^\]]*\]\(img/([\w.-]+\.png)\)", doc)
    assert sorted(named) == sorted(image for image, *_ in SHOTS), "the doc shows exactly the screenshots this test renders"
    for image in named:
        kept = (IMAGES / image).read_bytes()
        assert len(kept) <= MAX_IMAGE_BYTES and png_size(kept)[0] > 100, f"docs/img/{image}: run with PARALLAB_UPDATE_SCREENSHOTS=1"
    assert sum((IMAGES / image).stat().st_size for image in named) < 1_000_000
