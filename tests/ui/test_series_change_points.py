"""The series page in a real headless Chromium marks a timing change point on the chart and names the
first commit after it, with the series' between-job CV and smallest detectable change; the change
point of the metric normalised by the host-speed probe is drawn beside the raw one, dotted, and the
one the verdict reads is labelled so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ui.conftest import CHROMIUM, LiveServer

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium")

DROP_AT = 14
JOBS = 20


@pytest.fixture(scope="module")
def drop_series(session_factory) -> tuple[str, str]:
    """A series of JOBS CI uploads of ddp × 4 on main, each with the host-speed probe (the host's
    speed steady), tokens/s 20 % lower from the DROP_AT-th on: (its id, that commit)."""
    from backend.services.auth import LOCAL
    from backend.services.uploads import upload_results
    from parallab.core.hostspeed import from_samples
    from tests.ui.factories import make_document

    sid, commits = None, []
    with session_factory() as session:
        for i in range(JOBS):
            tps = 9_000.0 * (1 + 0.02 * ((i * 7) % 5 - 2)) * (0.8 if i >= DROP_AT else 1.0)
            doc = make_document(strategy="ddp", world_size=4, tokens_per_s=tps, name=f"ddp ×4 (CI {i})", branch="main", seed=500 + i)
            assert doc.source is not None
            doc.source.commit = f"{i:04x}beadfeed"  # each job its own commit
            speed = 2e7 * (1 + 0.01 * ((i * 3) % 5 - 2))
            doc.host_speed = from_samples([speed], [speed], lanes=4, where="steps")
            (uploaded,) = upload_results(session=session, documents=[doc], batch=False, idempotency_key=None, principal=LOCAL)
            session.commit()
            sid = uploaded.run.series_id
            commits.append(uploaded.run.commit)
    assert sid is not None and len(set(commits)) == JOBS, commits
    return sid, commits[DROP_AT]


def test_the_series_page_marks_the_change_point_and_names_its_commit(browser, app, drop_series) -> None:
    sid, commit = drop_series
    errors: list[str] = []
    with LiveServer(app) as server:
        context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/series/{sid}")
        page.wait_for_function("() => document.getElementById('chart-series-tokens_per_s')?._fullLayout !== undefined")
        marks = page.evaluate(
            "() => { const l = document.getElementById('chart-series-tokens_per_s')._fullLayout;"
            " return {shapes: l.shapes.map(s => [s.type, s.x0, s.line.dash]), notes: l.annotations.map(a => a.text)}; }"
        )
        row = page.locator("#change-points-table tr[data-metric='tokens_per_s']").inner_text()
        judged = page.locator("#change-points-table tr[data-judged]").evaluate_all("rows => rows.map(r => r.dataset.metric)")
        context.close()
    assert errors == [], errors
    assert ["line", DROP_AT + 0.5, "dash"] in marks["shapes"], marks  # before the first result after the drop (x is 1-based)
    assert ["line", DROP_AT + 0.5, "dot"] in marks["shapes"], "the normalised change point, beside the raw one"
    raw = [n for n in marks["notes"] if n.startswith("change at")]
    normalised = [n for n in marks["notes"] if n.startswith("÷ host speed: change at")]
    assert any(commit[:8] in note and "-2" in note for note in raw), marks
    assert len(normalised) == 1 and commit[:8] in normalised[0] and "the verdict's" in normalised[0], marks
    assert not any("the verdict's" in note for note in raw), "every job is probed: the verdict reads the normalised metric"
    assert commit[:10] in row and "bisect" in row and "%" in row, row
    assert judged == ["tokens_per_s/host", "step_time_p50/host"], judged
