"""Screenshots of every page, for docs/: real runs on this machine, shot with headless Chromium.

    python docs/screenshots.py --out DIR

Every run shown is measured: each job goes through torchrun (`workers.execute.run_and_collect`,
the path `parallab bench` and the worker take) and is stored by the same ingest as any run; the
failed run is a real job stopped by its wall-clock limit, the queued one a real submission that
no worker has taken. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.api.app import create_app  # noqa: E402
from backend.config import Settings, get_settings  # noqa: E402
from backend.db import session_scope  # noqa: E402
from backend.models import Run  # noqa: E402
from backend.services.ingest import attach_result  # noqa: E402
from backend.services.runs import create_run  # noqa: E402
from backend.store import runs as store  # noqa: E402
from parallab.core.jobs import ResolvedJob  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, LiveServer, make_settings  # noqa: E402
from workers.execute import run_and_collect  # noqa: E402

# (key, strategy, world size, options, trace)
JOBS = [
    ("single1", "single", 1, {}, False),
    ("ddp2", "ddp", 2, {}, False),
    ("ddp4", "ddp", 4, {}, True),
    ("fsdp2", "fsdp", 2, {}, False),
    ("fsdp4", "fsdp", 4, {}, False),
    ("tp2", "tp", 2, {}, False),
    ("pp2", "pp", 2, {"schedule": "gpipe"}, False),
    ("pp4", "pp", 4, {"schedule": "1f1b"}, True),
    ("moe2", "moe", 2, {}, False),
    ("ring2", "ring", 2, {"zigzag": True}, False),
    ("hybrid4", "hybrid", 4, {"tp": 2}, False),
]


def spec(name: str, strategy: str, world: int, options: dict, trace: bool, steps: int = 10) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "workload": {"model": "tiny", "steps": steps},
            "strategy": {"name": strategy, "world_size": world, "options": options},
            "trace": trace,
        }
    )


def real_lab(settings: Settings) -> dict[str, str]:
    """Run every job for real and store it as the worker would; returns key → run id."""
    ids: dict[str, str] = {}
    for key, strategy, world, options, trace in JOBS:
        with session_scope(settings.sqlalchemy_url) as session:
            run = create_run(
                session=session, spec=spec(f"{strategy} ×{world}", strategy, world, options, trace), settings=settings, source="form"
            )
            store.set_status(session, run, "running")
            ids[key] = run.id
            job = ResolvedJob.model_validate(run.job)  # frozen at submission, as the worker reads it
        collected = run_and_collect(job, settings.runs_dir / run.id, settings=settings)
        with session_scope(settings.sqlalchemy_url) as session:
            run = session.get(Run, ids[key])
            if collected.document is None:
                store.set_status(session, run, "failed", error=collected.error)
            else:
                attach_result(session, run=run, document=collected.document, traces=collected.traces)
        print(f"ran {key}: {'ok' if collected.document else collected.error}", flush=True)
    # A real failure: a long job stopped by a 10 s wall-clock limit, with its log tail.
    limited = settings.model_copy(update={"max_job_seconds": 10})
    with session_scope(settings.sqlalchemy_url) as session:
        run = create_run(
            session=session, spec=spec("ddp that ran out of time", "ddp", 2, {}, False, steps=5000), settings=limited, source="form"
        )
        store.set_status(session, run, "running")
        ids["failed"] = run.id
        job = ResolvedJob.model_validate(run.job)
    collected = run_and_collect(job, limited.runs_dir / run.id, settings=limited)
    with session_scope(settings.sqlalchemy_url) as session:
        store.set_status(session, session.get(Run, ids["failed"]), "failed", error=collected.error)
    with session_scope(settings.sqlalchemy_url) as session:
        ids["queued"] = create_run(
            session=session, spec=spec("fsdp waiting for a worker", "fsdp", 2, {}, False), settings=settings, source="form"
        ).id
    return ids


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    # No default: docs/screenshots holds the UI test lab's shots (tests/ui/test_screenshots.py).
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs (not docs/screenshots: the test lab's)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as home:
        settings = make_settings(Path(home))
        ids = real_lab(settings)
        app = create_app()
        app.dependency_overrides[get_settings] = lambda: settings
        shots = [
            ("index", "/", None),
            ("run-new", "/runs/new", None),
            ("run-new-error", "/runs/new", "tp3"),
            ("run-ddp", f"/runs/{ids['ddp4']}", None),
            ("run-pp", f"/runs/{ids['pp4']}", None),
            ("run-moe", f"/runs/{ids['moe2']}", None),
            ("run-failed", f"/runs/{ids['failed']}", None),
            ("run-queued", f"/runs/{ids['queued']}", None),
            ("compare", f"/compare?ids={ids['ddp2']},{ids['fsdp2']},{ids['tp2']},{ids['pp2']}", None),
            ("compare-diff-only", f"/compare?ids={ids['ddp4']},{ids['fsdp4']}&baseline={ids['fsdp4']}", "diff"),
            ("leaderboard", "/leaderboard", None),
            ("scaling", "/scaling", None),
        ]
        with LiveServer(app) as server, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for width, suffix in ((1280, ""), (390, "-narrow")):
                context = browser.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1)
                page = context.new_page()
                for name, path, action in shots:
                    if suffix and name not in ("index", "run-new", "run-ddp", "compare", "leaderboard"):
                        continue
                    page.goto(server.url + path)
                    if action == "tp3":
                        page.select_option("#f-strategy", "tp")
                        page.fill("#f-world_size", "3")
                        page.wait_for_selector('[data-errors-for="num_heads"] .field-error')
                    elif action == "diff":
                        page.check("#diff-only")
                    if page.locator("figure.chart").count():
                        page.wait_for_selector("figure.chart .main-svg")
                    page.wait_for_timeout(400 if name != "run-new" else 800)
                    target = args.out / f"{name}{suffix}.png"
                    page.screenshot(path=str(target), full_page=True)
                    print(target.relative_to(REPO))
                context.close()
            browser.close()


if __name__ == "__main__":
    main()
