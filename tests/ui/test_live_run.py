"""The run page is live: a real run (tiny, world 2, traced) submitted to a real worker, watched
in Chromium from the moment it is queued — the phases pass in order, the live chart fills with
steps, the log tail shows, "Started" is set as soon as a worker claims the run, and "waiting for
a worker" shows only while it is queued. Then the API client example (examples/api_client.py)
runs against the same server and worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
  traces: (document.getElementById('chart-live') && document.getElementById('chart-live').data)
    ? Array.from(document.getElementById('chart-live').data).map(t => ({
        name: t.name, values: Array.from(t.y || []).filter(v => v !== null && v !== undefined).length}))
    : [],
  drawn: document.querySelectorAll('#chart-live .scatterlayer .trace path.js-line').length,
  log: document.getElementById('run-log') ? document.getElementById('run-log').textContent : '',
})"""


RECORD_STATUSES = """(() => {
  // Every status the page's poll receives, kept in sessionStorage (it survives the reload when the
  // run ends) before the page gets it: the page renders each one, and the last, finished one is
  // only on screen for the instant before the reload.
  const fetch0 = window.fetch;
  window.fetch = function (url) {
    return fetch0.apply(this, arguments).then(function (response) {
      if (!String(url).endsWith('/status.json') || !response.ok) return response;
      return response.clone().json().then(function (s) {
        const seen = JSON.parse(sessionStorage.getItem('statuses') || '[]');
        const p = s.progress || {};
        seen.push({status: s.status, phase: p.phase || null, phases: p.phases || [], finished: s.finished});
        sessionStorage.setItem('statuses', JSON.stringify(seen));
        return response;
      });
    });
  };
})();"""


class Bench:
    """A real server (uvicorn, this app) and, once started, a real worker on one SQLite home."""

    def __init__(self, home: Path) -> None:
        from backend.api.app import create_app
        from backend.config import get_settings

        self.settings = make_settings(home)
        self.app = create_app()
        self.app.dependency_overrides[get_settings] = lambda: self.settings
        self.env = dict(
            os.environ,
            PARALLAB_HOME=str(self.settings.resolved_home),
            PARALLAB_DATABASE_URL=self.settings.sqlalchemy_url,
            PARALLAB_HOST="127.0.0.1",
        )
        self.worker: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start_worker(self) -> None:
        if self.worker is None:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "parallab", "worker", "--loglevel", "WARNING"],
                cwd=REPO,
                env=self.env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    from workers.launcher import stop_process_group

    lab = Bench(tmp_path_factory.mktemp("live") / "home")
    try:
        with LiveServer(lab.app) as server:
            lab.url = server.url
            yield lab
    finally:
        if lab.worker is not None:
            stop_process_group(lab.worker, grace_s=30)


def state_after_reload(page: Any, tries: int = 5) -> dict:
    """The page's state once it has settled: a finished run's page reloads itself, and a read
    that lands during that navigation finds no page to evaluate in, or the new document before
    its body is parsed (no status badge yet: status None, seen once in a whole suite)."""
    for _ in range(tries - 1):
        try:
            page.wait_for_selector("#run-status .badge", state="attached", timeout=10_000)
            state = page.evaluate(STATE)
            if state["status"] is not None:
                return state
        except Exception:  # playwright's Error: the execution context went with the navigation
            pass
        page.wait_for_load_state()
    return page.evaluate(STATE)


def test_the_run_page_follows_a_real_run_through_its_phases(bench: Bench) -> None:
    from playwright.sync_api import sync_playwright

    states: list[dict] = []
    with sync_playwright() as p:
        run = httpx.post(bench.url + "/api/v1/runs", json=SPEC, timeout=30).json()
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.add_init_script(RECORD_STATUSES)
        page.goto(f"{bench.url}/runs/{run['id']}")
        states.append(page.evaluate(STATE))
        # Queued, no worker yet: it says so, and nothing has started.
        assert states[0]["status"] == "queued" and "waiting for a worker" in states[0]["progress"], states[0]
        assert states[0]["started"] == "—"
        bench.start_worker()
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
        final = state_after_reload(page)
        polled = page.evaluate("() => JSON.parse(sessionStorage.getItem('statuses') || '[]')")
        browser.close()
        assert final["status"] == "succeeded", (final, states[-3:])
        assert errors == []

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
    assert {"warmup", "train", "profile", "reference", "gradcheck", "storing"} <= passed, seen
    order = [p for p in seen if p in ("warmup", "train", "reference", "storing")]
    assert order == sorted(order, key=["warmup", "train", "reference", "storing"].index), seen
    assert seen[-1] == "storing", seen
    # Storing is on screen for seconds (the ranks write the record, torchrun ends, the worker
    # ingests it: 26 of 194 reads, 0.25 s apart, on the 2-core development machine). The statuses
    # the page received, recorded as it got them, hold it too, through the last one (finished),
    # which is on screen only for the instant before the page reloads.
    storing = [s for s in polled if s["phase"] == "storing"]
    assert storing and polled[-1]["finished"] and polled[-1]["phase"] == "storing", [(s["status"], s["phase"]) for s in polled[-5:]]
    assert storing[-1]["phases"][-1] == "storing" and {"warmup", "train", "profile", "reference", "gradcheck"} <= set(
        storing[-1]["phases"]
    ), storing[-1]
    # The live chart filled: at least the timed steps (and warm-up) are points on it.
    assert max(s["points"] for s in running) >= SPEC["workload"]["steps"], max(s["points"] for s in running)
    # ... and draws all three series: loss, tokens/s and memory, each with points, each a drawn line.
    fullest = max(running, key=lambda s: s["points"])
    counts = {t["name"]: t["values"] for t in fullest["traces"]}
    assert set(counts) == {"loss", "tokens/s", "memory (MiB)"}, counts
    assert all(n >= SPEC["workload"]["steps"] for n in counts.values()), counts
    assert fullest["drawn"] == 3, fullest
    # The log tail was shown while it ran (torchrun's own lines at least).
    assert any(s["log"].strip() for s in running)


def test_the_api_client_example_submits_waits_fetches_and_compares(bench: Bench) -> None:
    bench.start_worker()
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "api_client.py"), "--server", bench.url, "--strategies", "ddp,fsdp", "--steps", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["run", "strategy", "tokens/s"]
    assert [line.split()[1] for line in lines[1:3]] == ["ddp", "fsdp"]
    assert all(("MiB" in line or "GiB" in line or "KiB" in line) for line in lines[1:3])  # binary units
    assert lines[3].startswith("fsdp against ddp: tokens/s ") and lines[3].endswith("%")
