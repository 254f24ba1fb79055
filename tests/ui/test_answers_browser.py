"""What a new user asks of the pages, in a real Chromium under the app's own Content-Security-Policy
(no bypass): a verdict that decides at 3 runs against 3 and says how many more 2 against 2 needs;
pages that wait for runs list them and fill in by themselves when they finish."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.db import session_scope
from backend.models import Run
from backend.services.ingest import attach_result
from tests.backend.test_repeats import _store as store_runs
from tests.core.hf_configs import TINY_LLAMA
from tests.ui.conftest import CHROMIUM, LiveServer, make_settings, polled_into_view
from tests.ui.factories import csrf_token, make_document

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
def answers_app(answers_settings):
    from backend.api.app import create_app
    from backend.config import get_settings

    app = create_app()
    app.dependency_overrides[get_settings] = lambda: answers_settings
    return app


@pytest.fixture(scope="module")
def server(answers_app) -> Iterator[LiveServer]:
    with LiveServer(answers_app) as live:
        yield live


@pytest.fixture()
def form_client(answers_app) -> Iterator[TestClient]:
    with TestClient(answers_app) as c:
        yield c


def finish(settings, run_ids: list[str], tokens_per_s: float = 9_000.0) -> None:
    """What a worker does when each run ends: its result document lands and the run succeeds."""
    with session_scope(settings.sqlalchemy_url) as session:
        for i, run_id in enumerate(run_ids):
            run = session.get(Run, run_id)
            document = make_document(strategy=run.strategy, world_size=run.world_size, tokens_per_s=tokens_per_s * (1 + i / 50), seed=i)
            attach_result(session, run=run, document=document)


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


def test_the_sweep_page_changes_to_finished_by_itself(page, server, form_client, answers_settings) -> None:
    form = {"csrf_token": csrf_token(form_client), "model": "tiny", "world_size": "2", "top": "2", "controls": "0", "steps": "2"}
    form.update({"precisions": "fp32", "checkpointing": "none", "accumulation": "1"})
    created = form_client.post("/sweeps/new", data=form, follow_redirects=False)
    assert created.status_code == 303, created.text[:500]
    url = created.headers["location"]
    with session_scope(answers_settings.sqlalchemy_url) as session:
        runs = [r.id for r in session.query(Run).filter(Run.sweep_id == url.rsplit("/", 1)[-1]).order_by(Run.created_at)]
    assert len(runs) >= 2
    page.clock.install()  # the polls run when polled_into_view moves the clock on
    page.goto(server.url + url)
    status = page.locator(".page-head .actions .badge").first
    assert status.inner_text() == "running"
    # the sweep's runs, behind the pool's calibrate run (this pool has no calibration yet)
    waiting = page.locator("#waiting")
    watched = (waiting.get_attribute("data-watch") or "").split(",")
    (calibrate,) = set(watched) - set(runs)
    assert set(runs) <= set(watched) and f"Waiting for {len(watched)} of {len(watched)}" in waiting.inner_text()
    assert all(waiting.locator(f'a[href="/runs/{i}"]').count() == 1 for i in watched), "each run it waits for is a link"
    with session_scope(answers_settings.sqlalchemy_url) as session:
        session.get(Run, calibrate).status = "cancelled"
    finish(answers_settings, runs[:1])  # one run lands: the page fills it in, the sweep still runs
    polled_into_view(page, page.locator(f'#waiting li[data-run="{runs[0]}"] .badge.status-succeeded'))
    assert f"Waiting for {len(runs) - 1} of {len(watched)}" in page.locator("#waiting").inner_text()
    assert page.locator(".page-head .actions .badge").first.inner_text() == "running"
    finish(answers_settings, runs[1:])
    polled_into_view(page, page.locator(".page-head .actions .badge.status-finished"))
    assert page.locator("#waiting").count() == 0 and page.locator("#sweep-table .badge.status-succeeded").count() == len(runs)


def test_compare_after_a_repeats_submit_lists_the_runs_and_fills_in_the_verdict(page, server, form_client, answers_settings) -> None:
    form = {"csrf_token": csrf_token(form_client), "model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "2", "repeats": "2"}
    created = form_client.post("/runs/new", data=form, follow_redirects=False)
    assert created.status_code == 303 and created.headers["location"].startswith("/compare?ids="), created.text[:500]
    a = created.headers["location"].split("ids=", 1)[1].split("&")[0].split(",")
    page.clock.install()  # the polls run when polled_into_view moves the clock on
    page.goto(server.url + created.headers["location"])
    waiting = page.locator("#waiting")
    assert "Waiting for 2 of 2 runs" in waiting.inner_text() and waiting.locator("a").count() == 2
    finish(answers_settings, a)
    # wait for what only the reloaded page draws (both runs in the row), not for #waiting to go: it
    # is also gone mid-reload, before the new page is there to read
    rows = page.locator("#configurations tbody tr")
    polled_into_view(page, page.locator("#configurations tbody tr:has(td:nth-child(2):text-is('2'))"))
    assert page.locator("#waiting").count() == 0
    assert rows.count() == 1 and rows.first.locator("td").nth(1).inner_text() == "2", "both runs filled in, one configuration"


def test_a_pasted_config_fills_the_shape_fields_and_names_the_run_and_run_again_renames(page, server, answers_settings) -> None:
    page.goto(server.url + "/runs/new")
    page.select_option("#f-strategy", "fsdp")
    page.fill("#f-world_size", "2")
    page.fill("#f-steps", "2")
    page.locator("details:has(#f-hf_config) > summary").click()
    page.fill("#f-hf_config", json.dumps(TINY_LLAMA))
    page.locator('[data-field="num_layers"].from-config').wait_for()
    assert page.get_attribute("#f-num_layers", "placeholder") == "2" and page.get_attribute("#f-hidden_size", "placeholder") == "64"
    assert page.get_attribute("#f-num_kv_heads", "placeholder") == "2" and page.get_attribute("#f-vocab_size", "placeholder") == "256"
    assert page.get_attribute("#f-name", "placeholder") == "llama L2·h64 · fsdp ×2"
    page.locator("#submit-run").wait_for()
    page.locator("#submit-run:not([disabled])").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]{32}$"))
    run_id = page.url.rsplit("/", 1)[-1]
    page.goto(server.url + "/")
    assert "llama L2·h64 · fsdp ×2" in page.locator(f'a[href="/runs/{run_id}"]').first.inner_text()

    # run again as ddp: the old name is not carried over, the new run is named for what it is
    page.goto(f"{server.url}/runs/new?from={run_id}")
    assert page.input_value("#f-name") == "" and "Run again of “llama L2·h64 · fsdp ×2”" in page.inner_text("#name-help")
    page.select_option("#f-strategy", "ddp")
    page.locator('#f-name[placeholder="hf L2·h64 · ddp ×2"]').wait_for()


def test_a_run_is_found_by_the_tag_set_on_its_page_and_by_search(page, server, answers_settings) -> None:
    (mine,) = store_runs(answers_settings, "fsdp", [7_000], repeats=False)
    (other,) = store_runs(answers_settings, "fsdp", [7_100], repeats=False)  # one neither filter may list
    with session_scope(answers_settings.sqlalchemy_url) as session:
        session.get(Run, mine).name = "zero3 study · fsdp ×2"
        session.get(Run, other).name = "zero2 study · fsdp ×2"
    page.goto(f"{server.url}/runs/{mine}")
    assert page.inner_text("#run-tag-list").strip() == "none"
    page.fill("#f-run-tags", "fsdp-study, reshard")
    page.click("#tags-form button[type=submit]")
    page.locator('#run-tag-list a.tag:text-is("fsdp-study")').wait_for()
    assert page.locator("#run-tag-list a.tag").all_inner_texts() == ["fsdp-study", "reshard"]

    page.click('#run-tag-list a.tag:text-is("fsdp-study")')  # a tag links to the list filtered by it
    page.wait_for_url(re.compile(r"/\?tag=fsdp-study$"))
    listed = page.locator("table.runs-table tbody tr a[href^='/runs/']")
    assert listed.count() == 1 and listed.first.get_attribute("href") == f"/runs/{mine}"
    assert page.locator("#run-tag-filter").input_value() == "fsdp-study"

    page.goto(server.url + "/")
    page.fill("#run-search", "ZERO3")
    page.click("#run-filters button[type=submit]")
    page.wait_for_url(re.compile(r"q=ZERO3"))
    listed = page.locator("table.runs-table tbody tr a[href^='/runs/']")
    assert listed.count() == 1 and listed.first.get_attribute("href") == f"/runs/{mine}"
    page.goto(server.url + "/?q=no-such-run-name")
    assert page.locator("#no-match").count() == 1


def test_refusals_land_on_their_field_before_submit_and_a_refused_submit_is_the_form(page, server, form_client, answers_settings) -> None:
    """Runs last in this module: it registers a CPU worker, which the earlier tests' placement does not expect."""
    from backend.services import workers as fleet
    from backend.services.workers import WorkerInfo

    worker = WorkerInfo(
        id="cpu-worker", host="bench", machine="bench", address="127.0.0.1", pid=1, pool="cpu", device="cpu",
        device_name="a test cpu", device_count=8, memory_per_device_bytes=64 << 30, interconnect="cpu",
    )  # fmt: skip
    with session_scope(answers_settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=worker)

    page.goto(server.url + "/runs/new")
    page.select_option("#f-strategy", "ddp")
    page.fill("#f-world_size", "2")
    page.locator("details:has(#f-precision) > summary").click()
    page.select_option("#f-precision", "fp8")
    precision = page.locator('[data-field="precision"]')
    precision.locator(".field-error").wait_for()
    assert "invalid" in (precision.get_attribute("class") or "") and "fp8 training needs" in precision.inner_text()
    assert page.locator("#run-form button[type=submit]").is_disabled()

    # an N-D layout whose degrees do not make the world size: the world size field says so
    page.select_option("#f-precision", "fp32")
    page.select_option("#f-strategy", "layout")
    page.fill("#f-opt\\.layout\\.tp", "3")
    world = page.locator('[data-field="world_size"]')
    world.locator(".field-error").wait_for()
    assert "make 3 ranks, not the world size 2" in world.inner_text()

    # the submit refuses the same, as the form with the message on its field, never a JSON page
    form = {"csrf_token": csrf_token(form_client), "model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "2", "precision": "fp8"}
    refused = form_client.post("/runs/new", data=form, follow_redirects=False)
    assert refused.status_code == 422 and refused.headers["content-type"].startswith("text/html")
    assert re.search(r'data-errors-for="precision">\s*<p[^>]*>[^<]*fp8 training needs', refused.text), refused.text[:300]


def test_dark_mode_follows_the_system_setting_pages_and_figures(browser, server, answers_settings) -> None:
    (run_id,) = store_runs(answers_settings, "ddp", [9_500], repeats=False)
    looks = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
        page = context.new_page()
        page.goto(f"{server.url}/runs/{run_id}")
        page.locator("figure.chart .main-svg").first.wait_for()
        looks[scheme] = page.evaluate(
            """() => ({
              body: getComputedStyle(document.body).backgroundColor,
              ink: getComputedStyle(document.body).color,
              card: getComputedStyle(document.querySelector('.card')).backgroundColor,
              font: getComputedStyle(document.querySelector('figure.chart .main-svg text')).fill,
            })"""
        )
        context.close()
    light, dark = looks["light"], looks["dark"]
    assert light["body"] == "rgb(246, 247, 249)" and dark["body"] == "rgb(11, 17, 32)"
    assert dark["ink"] == "rgb(229, 231, 235)" and dark["card"] == "rgb(17, 24, 39)"
    assert dark["font"] == "rgb(229, 231, 235)" and light["font"] != dark["font"], looks
