"""A run page stays small whatever its document holds (issue #12): a traced run with 80,000 timeline
events (8 ranks × 10,000) makes a page under 500 KB; the timeline comes after, downsampled."""

from __future__ import annotations

import pytest

from tests.ui.factories import make_document, store_run, with_timeline

PAGE_LIMIT = 500_000


@pytest.fixture(scope="module")
def wide_run(session_factory):
    doc = with_timeline(make_document(strategy="fsdp", world_size=8, steps=2000), events_per_rank=10_000)
    assert len(doc.timeline) == 80_000
    with session_factory() as session:
        return store_run(session, doc)


def test_an_80k_event_run_page_is_small_and_loads_its_timeline_lazily(client, wide_run) -> None:
    page = client.get(f"/runs/{wide_run.id}")
    assert page.status_code == 200
    assert len(page.content) < PAGE_LIMIT, f"{len(page.content):,} bytes"
    assert f'data-src="/runs/{wide_run.id}/timeline.json"' in page.text and 'id="fig-timeline"' not in page.text
    assert "80,000 events" in page.text
    for fig in ("fig-memory", "fig-steps", "fig-comm", "fig-loss"):
        assert f'id="{fig}"' in page.text

    figure = client.get(f"/runs/{wide_run.id}/timeline.json")
    assert figure.status_code == 200 and len(figure.content) < PAGE_LIMIT
    bars = figure.json()["data"]
    assert {t["name"] for t in bars} == {"forward", "backward", "all_gather", "reduce_scatter"}
    assert sum(len(t["x"]) for t in bars) <= 5000
    assert "80,000 events shown as" in figure.json()["layout"]["title"]["text"]


def test_the_loss_curve_of_a_long_run_is_thinned_but_keeps_its_extremes(client, wide_run) -> None:
    from backend.figures.run import MAX_CURVE_POINTS, thin

    values = [float((i * 7919) % 1000) for i in range(50_000)]
    steps, shown = thin(values)
    assert len(shown) <= MAX_CURVE_POINTS + 4 and min(shown) == min(values) and max(shown) == max(values)
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 50_000
    assert thin([1.0, 2.0]) == ([1, 2], [1.0, 2.0])


def test_a_run_without_a_timeline_says_so_inline(client, lab) -> None:
    single = client.get(f"/runs/{lab['single1'].id}").text
    assert 'id="fig-timeline"' in single and "data-src=" not in single
