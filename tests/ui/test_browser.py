"""The pages in a real headless Chromium (Debian's package, driven by Playwright's Python API)
against a real uvicorn server: the form, live status, comparison charts, leaderboard filters —
and no JavaScript errors on any page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backend.models import Run
from tests.core.hf_configs import TINY_LLAMA
from tests.ui.conftest import CHROMIUM, LiveServer, make_settings, polled_into_view

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def page(browser):
    """A fresh page that records console errors and uncaught exceptions; the test fails on any."""
    # bypass_csp: Playwright's wait_for_function polls a string predicate with eval, which the app's
    # CSP forbids; the policy itself is checked in tests/security/test_csp_browser.py.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.set_default_timeout(20_000)
    yield page
    context.close()
    assert errors == [], errors


def test_index_lists_runs_and_ticks_open_compare(page, live_server, lab):
    page.goto(live_server.url + "/")
    assert page.title().startswith("Runs")
    assert page.locator("table.runs-table tbody tr").count() >= 10
    button = page.locator("#compare-button")
    assert button.is_disabled()
    page.locator(f'input.compare-tick[value="{lab["ddp2"].id}"]').check()
    page.locator(f'input.compare-tick[value="{lab["fsdp2"].id}"]').check()
    assert button.is_enabled()
    button.click()
    page.wait_for_url(re.compile(r"/compare\?"))
    page.wait_for_selector(".js-plotly-plot .main-svg")
    assert page.locator("figure.chart.js-plotly-plot").count() == 8  # with exposed comm, the gradient check and the memory timeline
    assert page.locator("figure.chart .main-svg").count() >= 7


def test_form_shows_options_for_the_chosen_strategy_and_refuses_what_cannot_divide(page, live_server, session_factory):
    page.goto(live_server.url + "/runs/new")
    pp = page.locator('.strategy-options[data-strategy="pp"]')
    assert pp.is_hidden()
    page.select_option("#f-strategy", "pp")
    assert pp.is_visible() and page.locator('.strategy-options[data-strategy="ddp"]').is_hidden()
    # tp on 3 ranks: the live check puts the reason beside the field and holds the submit button.
    page.select_option("#f-strategy", "tp")
    page.fill("#f-world_size", "3")
    page.wait_for_selector('[data-errors-for="num_heads"] .field-error')
    assert "not divisible by 3" in page.inner_text('[data-errors-for="num_heads"]')
    assert page.locator("#submit-run").is_disabled()
    assert page.locator("details:has(#f-num_heads) .field.invalid").count() >= 1
    # Fixed: the error goes, the prediction shows, and the run is submitted from the form.
    page.fill("#f-world_size", "2")
    page.wait_for_function("!document.querySelector('#submit-run').disabled")
    assert page.locator('[data-errors-for="num_heads"] .field-error').count() == 0
    assert "memory per rank" in page.inner_text("#prediction").lower()
    page.fill("#f-name", "<b>browser</b> run")
    page.fill("#f-steps", "3")
    page.click("#submit-run")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]{32}$"))
    assert page.inner_text("h1") == "<b>browser</b> run"
    assert page.locator("#run-status .badge").inner_text() in ("queued", "running", "failed")
    run_id = page.url.rsplit("/", 1)[-1]
    with session_factory() as s:
        run = s.get(Run, run_id)
        assert run.source == "form" and run.strategy == "tp" and run.world_size == 2


def test_a_pasted_config_json_is_checked_live_beside_its_box(page, live_server):
    page.goto(live_server.url + "/runs/new")
    page.click("details:has(#f-hf_config) > summary")
    page.fill("#f-hf_config", json.dumps({**TINY_LLAMA, "num_hidden_layers": 10**6}, indent=2))
    page.wait_for_selector('[data-errors-for="hf_config"] .field-error')
    assert "num_hidden_layers: num_layers 1000000" in page.inner_text('[data-errors-for="hf_config"]')
    assert page.locator("#submit-run").is_disabled()
    page.fill("#f-hf_config", json.dumps(TINY_LLAMA, indent=2))
    page.wait_for_function("!document.querySelector('#submit-run').disabled")
    assert page.locator('[data-errors-for="hf_config"] .field-error').count() == 0


def add_running_run(session_factory, *, name: str, strategy: str, step: int) -> str:
    """A 2-rank run on `tiny` that a worker is running, at measured step `step` of 20."""
    with session_factory() as s:
        run = Run(
            name=name,
            status="running",
            source="form",
            strategy=strategy,
            world_size=2,
            model="tiny",
            spec={"workload": {"model": "tiny"}, "strategy": {"name": strategy, "world_size": 2, "options": {}}, "trace": False},
            progress={"phase": "train", "step": step, "steps": 20, "loss": 5.5},
        )
        s.add(run)
        s.commit()
        return run.id


def test_run_page_follows_progress_live_then_shows_results(page, live_server, session_factory):
    from backend.services.ingest import attach_result
    from tests.ui.factories import make_document

    run_id = add_running_run(session_factory, name="live", strategy="ddp", step=1)
    page.goto(f"{live_server.url}/runs/{run_id}")
    assert "step 1 of 20" in page.inner_text("#run-progress")
    with session_factory() as s:
        s.get(Run, run_id).progress = {"phase": "train", "step": 7, "steps": 20, "loss": 4.25}
        s.commit()
    page.wait_for_function("document.querySelector('#run-progress').textContent.includes('step 7 of 20')")
    with session_factory() as s:
        attach_result(s, run=s.get(Run, run_id), document=make_document(strategy="ddp", world_size=2, tokens_per_s=17_000.0))
        s.commit()
    page.wait_for_selector("#run-status .status-succeeded", timeout=20_000)
    page.wait_for_selector("#chart-memory .main-svg")
    assert page.locator("figure.chart.js-plotly-plot").count() >= 5
    assert "17,000" in page.inner_text(".cards")


def test_index_follows_unfinished_runs_live(page, live_server, session_factory):
    from backend.services.ingest import attach_result
    from tests.ui.factories import make_document

    run_id = add_running_run(session_factory, name="index live", strategy="fsdp", step=2)
    row = f'tr[data-live-run="{run_id}"]'
    page.clock.install()  # index.js's polls run when polled_into_view moves the clock on
    page.goto(f"{live_server.url}/")
    assert page.inner_text(f"{row} .live-progress") == "step 2/20"
    with session_factory() as s:
        s.get(Run, run_id).progress = {"phase": "train", "step": 9, "steps": 20, "loss": 4.0}
        s.commit()
    polled_into_view(page, page.locator(f"{row} .live-progress", has_text=re.compile(r"^step 9/20$")))
    with session_factory() as s:
        attach_result(s, run=s.get(Run, run_id), document=make_document(strategy="fsdp", world_size=2, tokens_per_s=12_345.0))
        s.commit()
    # Finished: the page reloads and the row shows the measured throughput, no longer live.
    polled_into_view(page, page.locator(f'a[href="/runs/{run_id}"]:not(tr[data-live-run] a)'))
    assert "12,345" in page.inner_text("table.runs-table")


def test_compare_toggle_and_baseline(page, live_server, lab):
    ids = [lab["ddp2"].id, lab["ddp4"].id, lab["fsdp4"].id]
    page.goto(f"{live_server.url}/compare?ids={','.join(ids)}")
    page.wait_for_selector("#chart-throughput .main-svg")
    model_row = page.locator('tr[data-metric="model"]')
    assert model_row.is_visible()
    page.check("#diff-only")
    assert model_row.is_hidden() and page.locator('tr[data-metric="tokens_per_s"]').is_visible()
    page.select_option("#baseline-select", ids[2])
    page.wait_for_url(re.compile(f"baseline={ids[2]}"))
    assert "baseline" in page.locator("th.baseline").inner_text()
    assert page.locator('tr[data-metric="tokens_per_s"] td').nth(2).inner_text().startswith("25,000")
    page.check("#diff-only") if not page.is_checked("#diff-only") else None


def test_plan_rank_without_a_change_keeps_the_device_the_results_are_for(page, live_server):
    """The device was named by an alias (h100): the form shows the entry it ranked on, and "Rank"
    pressed as it stands ranks on that device again, not on the list's first (a100-40gb)."""
    page.goto(f"{live_server.url}/plan?model=tiny&device=h100&nodes=1&gpus_per_node=8")
    assert page.input_value('#plan-form select[name="device"]') == "h100-sxm"
    before = page.locator("#ranking-table tbody tr").count()
    page.click('#plan-form button[type="submit"]')
    page.wait_for_url(re.compile(r"device=h100-sxm"))
    assert page.input_value('#plan-form select[name="device"]') == "h100-sxm"
    assert "NVIDIA H100 SXM5" in page.content() and page.locator("#ranking-table tbody tr").count() == before


def test_run_page_draws_the_step_and_memory_splits_and_the_gradient_check(page, live_server, lab):
    page.goto(f"{live_server.url}/runs/{lab['pp4'].id}")
    page.wait_for_selector("#chart-steps .main-svg")
    page.wait_for_selector("#chart-memory .main-svg")
    steps = page.evaluate("() => document.getElementById('chart-steps').data.map(t => [t.name, t.x])")
    assert [name for name, _ in steps] == ["compute", "overlapped comm", "exposed comm", "idle / bubble"]
    assert all(len(x) == 4 for _, x in steps)  # one bar per rank
    memory = page.evaluate("() => document.getElementById('chart-memory').data.map(t => [t.name, t.x])")
    assert ["activations", ["rank 0", "rank 1", "rank 2", "rank 3"]] in memory
    assert ["activations (predicted)", ["predicted (busiest rank)"]] in memory
    # drawn, with the hatched patterns, as SVG paths in every figure
    for chart in ("steps", "memory", "volume", "bubble"):
        assert page.locator(f"#chart-{chart} .main-svg .bars path").count() > 0, chart
    # the timeline is fetched after the page (issue #12) and drawn like the others
    page.wait_for_selector("#chart-timeline .main-svg")
    lanes = page.evaluate("() => document.getElementById('chart-timeline').data.map(t => t.name).sort()")
    assert lanes == ["recv", "send"]
    assert page.locator("#chart-timeline .main-svg .bars path").count() > 0
    assert page.locator("#gradient-check .badge").inner_text() == "passed"
    assert page.locator("#volume-table tbody tr").count() == 2  # send, recv


def test_leaderboard_filters(page, live_server, lab):
    page.goto(live_server.url + "/leaderboard")
    assert page.locator("tr.group-head").count() >= 2
    assert page.locator("tr.best").count() == page.locator("tr.group-head").count()
    page.select_option('select[name="strategy"]', "fsdp")
    page.wait_for_url(re.compile(r"strategy=fsdp"))
    strategies = set(page.locator("#leaderboard-table tbody tr[data-strategy]").evaluate_all("rs => rs.map(r => r.dataset.strategy)"))
    assert strategies == {"fsdp"}
    page.click('th a:has-text("Tokens/s")')
    page.wait_for_url(re.compile(r"sort=tokens_per_s"))


def test_scaling_draws_the_ideal_line(page, live_server, lab):
    page.goto(live_server.url + "/scaling")
    page.wait_for_selector("#chart-throughput .main-svg")
    assert page.locator("#scaling-table tbody tr").count() >= 5


def test_narrow_window_has_no_horizontal_page_scroll(browser, live_server, lab):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    for path in ("/", "/runs/new", "/leaderboard", f"/runs/{lab['ddp2'].id}"):
        page.goto(live_server.url + path)
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"{path} scrolls sideways by {overflow}px in a narrow window"
    context.close()


def test_the_two_fsdp_variants_are_separate_leaderboard_rows(page, live_server, lab, session_factory):
    """ZeRO-3 (resharding after forward) and ZeRO-2 runs of one workload: two rows, each its own median and n, labelled."""
    from tests.ui.factories import make_document, store_run

    with session_factory() as session:
        for i, (reshard, tps) in enumerate(((True, 30_000.0), (True, 32_000.0), (True, 34_000.0), (False, 40_000.0), (False, 44_000.0))):
            doc = make_document(strategy="fsdp", world_size=2, tokens_per_s=tps, seed=100 + i)
            options = {"reshard_after_forward": reshard}
            store_run(session, doc.model_copy(update={"strategy": doc.strategy.model_copy(update={"options": options})}))
        session.commit()
    page.goto(live_server.url + "/leaderboard?strategy=fsdp")
    rows = page.locator("#leaderboard-table tbody tr:has([data-options])")
    found = {
        rows.nth(i).locator("[data-options]").inner_text(): rows.nth(i).locator(".interval").inner_text().split("n=")[-1]
        for i in range(rows.count())
    }
    assert found == {"reshard_after_forward=true": "3", "reshard_after_forward=false": "2"}


# ---- the whole path with a real worker and torchrun ----

HARNESS = REPO / "workers" / "harness" / "main.py"


@pytest.mark.slow
@pytest.mark.skipif(not HARNESS.exists(), reason="the training harness (workers/harness/main.py) is not there yet")
def test_end_to_end_submit_watch_compare_leaderboard(browser, tmp_path):
    """As a new user: submit DDP and FSDP from the form, watch them finish, compare, see both ranked."""
    settings = make_settings(tmp_path / "home")
    env = dict(
        os.environ, PARALLAB_HOME=str(settings.resolved_home), PARALLAB_DATABASE_URL=settings.sqlalchemy_url, PARALLAB_HOST="127.0.0.1"
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "parallab", "worker", "--loglevel", "WARNING"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    from backend.api.app import create_app
    from backend.config import get_settings

    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    try:
        with LiveServer(app) as server:
            context = browser.new_context(bypass_csp=True)  # wait_for_function's eval (see `page`)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            run_urls = []
            for strategy in ("ddp", "fsdp"):
                page.goto(server.url + "/runs/new")
                page.select_option("#f-strategy", strategy)
                page.fill("#f-world_size", "2")
                page.fill("#f-steps", "3")
                page.fill("#f-name", f"e2e {strategy}")
                page.wait_for_function("!document.querySelector('#submit-run').disabled")
                page.click("#submit-run")
                page.wait_for_url(re.compile(r"/runs/[0-9a-f]{32}$"))
                run_urls.append(page.url)
            for url in run_urls:
                page.goto(url)
                page.wait_for_selector("#run-status .status-succeeded, #run-status .status-failed", timeout=300_000)
                assert page.locator("#run-status .status-succeeded").count() == 1, page.inner_text("#live")
                page.wait_for_selector("#chart-memory .main-svg")
            ids = [u.rsplit("/", 1)[-1] for u in run_urls]
            page.goto(f"{server.url}/compare?ids={','.join(ids)}")
            page.wait_for_selector("#chart-throughput .main-svg")
            page.goto(server.url + "/leaderboard")
            shown = set(page.locator("#leaderboard-table tbody tr[data-strategy]").evaluate_all("rs => rs.map(r => r.dataset.strategy)"))
            assert {"ddp", "fsdp"} <= shown
            assert page.locator("tr.best").count() == 1
            context.close()
            assert errors == []
    finally:
        from workers.launcher import stop_process_group

        stop_process_group(worker, grace_s=30)


def test_run_page_and_compare_draw_the_memory_timeline_and_hover_names_phase_and_categories(page, live_server, lab, session_factory):
    from tests.ui.factories import make_document, store_run, with_memory_timeline

    with session_factory() as session:
        ddp = store_run(session, with_memory_timeline(make_document(strategy="ddp", name="ddp traced")))
        fsdp = store_run(session, with_memory_timeline(make_document(strategy="fsdp", name="fsdp traced"), gathered=True))
        ids = [ddp.id, fsdp.id]
    page.goto(f"{live_server.url}/runs/{ids[1]}")
    page.wait_for_selector("#chart-memory_timeline .main-svg")
    names = page.evaluate("() => document.getElementById('chart-memory_timeline').data.map(t => t.name)")
    assert names == [
        "params",
        "grads",
        "optimizer",
        "activations",
        "comm_buffers",
        "temporaries",
        "other",
        "predicted (planner's memory model)",
        "process RSS (includes the Python heap, libraries, gloo buffers)",
        "peak",
    ]
    legend = page.locator("#chart-memory_timeline .legend").text_content() or ""
    assert "predicted (planner's memory model)" in legend and "process RSS" in legend, legend
    # the predicted curve is drawn (a dashed path of its own), and the title names the largest gap's phase
    assert page.locator("#chart-memory_timeline .scatterlayer .trace path.js-line[style*='dasharray']").count() >= 1
    title = page.locator("#chart-memory_timeline .gtitle").text_content() or ""
    gap = page.locator("#memory-gap")
    assert "largest gap:" in title and gap.get_attribute("data-phase") in title, title
    assert "largest gap:" in gap.inner_text()
    drag = page.locator("#chart-memory_timeline .nsewdrag").first
    drag.scroll_into_view_if_needed()
    box = drag.bounding_box()
    drag.hover(position={"x": box["width"] * 0.08, "y": box["height"] * 0.5})  # inside forward layers.0
    page.wait_for_function("() => document.querySelector('#chart-memory_timeline .hoverlayer').textContent.length > 0")
    label = page.locator("#chart-memory_timeline .hoverlayer").text_content()
    assert "forward layers.0" in label and "comm_buffers" in label and "params" in label, label
    assert "predicted:" in label and "process RSS:" in label, label
    # what is live at the peak: a table per rank whose rows add up to the peak
    table = page.locator("#peak-table-0")
    assert table.is_visible()
    rows = [int(b) for b in table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.bytes)")]
    total = int(table.locator("tfoot [data-bytes]").get_attribute("data-bytes"))
    assert rows and sum(rows) == total, (rows, total)
    assert "comm_buffers" in table.locator("tbody").inner_text()
    page.goto(f"{live_server.url}/runs/{lab['ddp2'].id}")  # not traced: said, not an empty chart
    page.wait_for_selector("#chart-memory_timeline .main-svg")
    assert "no memory timeline: the run was not traced" in page.locator("#chart-memory_timeline").inner_text()
    assert page.locator("#memory-peak").count() == 0  # and no peak table to show
    page.goto(f"{live_server.url}/compare?ids={','.join(ids)}")
    page.wait_for_selector("#chart-memory_timeline .main-svg")
    lines = page.evaluate("() => document.getElementById('chart-memory_timeline').data.map(t => t.name)")
    assert [name.split(" (")[0] for name in lines[:2]] == ["ddp traced", "fsdp traced"]
    assert lines[2:] == [f"{name}, predicted" for name in lines[:2]]  # each run's planner curve beside it
    assert "comm_buffers" in (page.locator("#chart-memory_timeline .gtitle").text_content() or "")


def test_the_example_sweep_fills_the_form_shows_its_measurements_and_submits(page, live_server, session_factory):
    page.goto(f"{live_server.url}/sweeps/new")
    page.click('#sweep-examples a[href="/sweeps/new?example=tp-across-nodes"]')
    page.wait_for_url(re.compile(r"example=tp-across-nodes"))
    rows = page.locator("#lesson-table tbody tr")
    assert rows.count() >= 6
    assert "tp across nodes (FSDP inside)" in page.locator("#lesson-table").inner_text()
    assert page.input_value('#sweep-form input[name="pool"]') == "emulated"
    assert page.input_value('#sweep-form select[name="model"]') == "tiny"
    page.click('#sweep-form button[type="submit"]')
    page.wait_for_url(re.compile(r"/sweeps/[0-9a-f-]+$"))
    sweep_id = page.url.rsplit("/", 1)[-1]
    with session_factory() as session:
        runs = session.query(Run).filter(Run.sweep_id == sweep_id).all()
    assert runs and {r.pool for r in runs} == {"emulated"} and {r.strategy for r in runs} <= {"ddp", "fsdp", "hybrid", "tp"}
