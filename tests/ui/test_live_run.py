"""The run page is live: a real run (tiny, world 2, traced) submitted to a real worker, watched
in Chromium from the moment it is queued — the phases pass in order, the live chart fills with
steps, the log tail shows, "Started" is set as soon as a worker claims the run, and "waiting for
a worker" shows only while it is queued."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, LiveServer, make_settings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium"),
]

REPO = Path(__file__).resolve().parents[2]
SPEC = {"workload": {"model": "tiny", "steps": 12, "warmup_steps": 3}, "strategy": {"name": "ddp", "world_size": 2}, "trace": True}

STATE = """() => ({
  status: document.querySelector('#run-status .badge') && document.querySelector('#run-status .badge').textContent,
  progress: document.querySelector('#run-progress') ? document.querySelector('#run-progress').textContent.trim() : '',
  started: document.querySelector('#run-started') ? document.querySelector('#run-started').textContent : '',
  current: Array.from(document.querySelectorAll('#run-phases li.current')).map(li => li.dataset.phase),
  done: Array.from(document.querySelectorAll('#run-phases li.done')).map(li => li.dataset.phase),
  points: (document.getElementById('chart-live') && document.getElementById('chart-live').data)
    ? document.getElementById('chart-live').data[0].x.length : 0,
  log: document.getElementById('run-log') ? document.getElementById('run-log').textContent : '',
})"""


def test_the_run_page_follows_a_real_run_through_its_phases(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    from backend.api.app import create_app
    from backend.config import get_settings
    from workers.launcher import stop_process_group

    settings = make_settings(tmp_path / "home")
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    env = dict(
        os.environ, PARALLAB_HOME=str(settings.resolved_home), PARALLAB_DATABASE_URL=settings.sqlalchemy_url, PARALLAB_HOST="127.0.0.1"
    )
    worker = None
    states: list[dict] = []
    try:
        with LiveServer(app) as server, sync_playwright() as p:
            run = httpx.post(server.url + "/api/v1/runs", json=SPEC, timeout=30).json()
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{server.url}/runs/{run['id']}")
            states.append(page.evaluate(STATE))
            # Queued, no worker yet: it says so, and nothing has started.
            assert states[0]["status"] == "queued" and "waiting for a worker" in states[0]["progress"], states[0]
            assert states[0]["started"] == "—"
            worker = subprocess.Popen(
                [sys.executable, "-m", "parallab", "worker", "--loglevel", "WARNING"],
                cwd=REPO,
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline:
                try:
                    state = page.evaluate(STATE)
                except Exception:  # the page reloads itself when the run ends
                    page.wait_for_load_state()
                    continue
                states.append(state)
                if state["status"] in ("succeeded", "failed"):
                    break
                time.sleep(0.25)
            final = page.evaluate(STATE)
            browser.close()
            assert final["status"] == "succeeded", (final, states[-3:])
            assert errors == []
    finally:
        if worker is not None:
            stop_process_group(worker, grace_s=30)

    running = [s for s in states if s["status"] == "running"]
    assert running, "the page never showed the run running"
    # "Started" is set while it runs, and "waiting for a worker" never shows beside "running".
    assert all(s["started"] != "—" for s in running), running[:2]
    assert not any("waiting for a worker" in s["progress"] for s in running)
    # The phases, in the order the page saw them become current.
    seen: list[str] = []
    for s in running:
        for phase in s["current"]:
            if not seen or seen[-1] != phase:
                seen.append(phase)
    passed = set(seen) | {d for s in running for d in s["done"]}
    assert {"warmup", "train", "profile", "reference", "gradcheck"} <= passed, seen
    order = [p for p in seen if p in ("warmup", "train", "reference")]
    assert order == sorted(order, key=["warmup", "train", "reference"].index), seen
    # The live chart filled: at least the timed steps (and warm-up) are points on it.
    assert max(s["points"] for s in running) >= SPEC["workload"]["steps"], max(s["points"] for s in running)
    # The log tail was shown while it ran (torchrun's own lines at least).
    assert any(s["log"].strip() for s in running)
