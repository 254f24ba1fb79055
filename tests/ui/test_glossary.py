"""The glossary: one source for the page and docs/glossary.md, and every help icon on every page
lands on an entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backend.services.compare import METRICS
from backend.services.glossary import METRIC_TERMS, TERMS, markdown
from tests.ui.factories import lab_pages

REPO = Path(__file__).resolve().parents[2]
ANCHORS = {t.anchor for t in TERMS}
HELP_LINK = re.compile(r'href="/glossary#([a-z0-9-]+)"')


def test_docs_glossary_is_generated_from_the_terms() -> None:
    assert (REPO / "docs" / "glossary.md").read_text() == markdown(), "regenerate docs/glossary.md from backend.services.glossary"


def test_the_terms_have_one_anchor_each_and_every_help_icon_in_the_templates_names_one() -> None:
    assert len(ANCHORS) == len(TERMS), "two terms share an anchor"
    named = {
        (path.name, anchor)
        for path in (REPO / "frontend" / "templates").glob("*.html")
        for anchor in re.findall(r"""help\(\s*["']([^"']+)["']""", path.read_text())
    }
    assert named, "no help icon in any template"
    assert {a for _, a in named} <= ANCHORS, sorted(x for x in named if x[1] not in ANCHORS)
    assert set(METRIC_TERMS.values()) <= ANCHORS, set(METRIC_TERMS.values()) - ANCHORS
    assert set(METRIC_TERMS) <= {key for key, *_ in METRICS}, set(METRIC_TERMS) - {key for key, *_ in METRICS}


# page → the terms its help icons must include (beyond those, every icon must land on a term)
EXPECTED = {
    "run": {"tokens-per-s", "step-time", "mfu", "peak-memory", "comm-fraction", "exposed-comm", "loss-vs-reference", "gradient-check"},
    "run-pipeline": {"tokens-per-s"},  # the lab's pipeline has no per-stage actions: no bubble paragraph
    "compare": {"verdict", "median-interval", "tokens-per-s", "samples-per-s", "noisy-host", "replica-check", "wire-bytes"},
    "leaderboard": {"median-interval", "mfu", "peak-memory", "exposed-comm", "gradient-check", "replica-check"},
    "scaling": {"tokens-per-s", "scaling-efficiency"},
    "plan": {"prediction"},
    "sweep": {"spearman", "prediction", "median-interval", "peak-memory"},
}


@pytest.fixture()
def pages(client, lab) -> dict[str, str]:
    every = lab_pages(client, lab)
    return {name: every[name] for name in EXPECTED}


def test_every_help_icon_on_every_page_links_to_a_glossary_entry(client, pages) -> None:
    glossary = client.get("/glossary").text
    for anchor in ANCHORS:
        assert f'id="{anchor}"' in glossary, anchor
    for name, path in pages.items():
        response = client.get(path)
        assert response.status_code == 200, (name, response.status_code)
        linked = set(HELP_LINK.findall(response.text))
        assert linked <= ANCHORS, (name, linked - ANCHORS)
        assert EXPECTED[name] <= linked, (name, EXPECTED[name] - linked)
