"""The glossary: one source for the page and docs/glossary.md, and every help icon lands on an entry."""

from __future__ import annotations

import re
from pathlib import Path

from backend.services.glossary import TERMS, markdown

REPO = Path(__file__).resolve().parents[2]


def test_docs_glossary_is_generated_from_the_terms() -> None:
    assert (REPO / "docs" / "glossary.md").read_text() == markdown(), "regenerate docs/glossary.md from backend.services.glossary"


def test_every_help_icon_on_a_run_page_links_to_a_glossary_entry(client, lab) -> None:
    anchors = {t.anchor for t in TERMS}
    html = client.get(f"/runs/{lab['ddp2'].id}").text
    linked = re.findall(r'href="/glossary#([a-z0-9-]+)"', html)
    assert len(linked) >= 7 and set(linked) <= anchors, set(linked) - anchors
    page = client.get("/glossary").text
    for anchor in linked:
        assert f'id="{anchor}"' in page
