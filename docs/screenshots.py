"""Screenshots of every page, for docs/: a server on factory data, shot with headless Chromium.

    python docs/screenshots.py [--out docs/screenshots]
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
from backend.config import get_settings  # noqa: E402
from backend.db import get_sessionmaker  # noqa: E402
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, LiveServer, make_settings  # noqa: E402
from tests.ui.factories import seed_lab  # noqa: E402


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as home:
        settings = make_settings(Path(home))
        with get_sessionmaker(settings.sqlalchemy_url)() as session:
            lab = seed_lab(session)
            ids = {k: r.id for k, r in lab.items()}
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
            ("compare", f"/compare?ids={ids['ddp2']},{ids['ddp4']},{ids['fsdp4']},{ids['pp4']}", None),
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
