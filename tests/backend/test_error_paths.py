"""A failed run's error and log tail, as each reader sees them: a viewer or member reads the
worker's traceback with every absolute path of the server shortened — the REST view, the runs
list, the run page and its live status alike — and an admin reads it as the worker wrote it. The
traceback is a real one, raised here: its frames name this checkout, the standard library and a
run directory."""

from __future__ import annotations

import html
import re
import traceback
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.api.deps import SESSION_COOKIE
from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.services import auth
from backend.services import runs as run_service
from backend.store import runs as store
from parallab.core.spec import JobSpec

ABSOLUTE = re.compile(r"(?<![\w.~:/-])/(?:[\w.@+-]+/)+")
"""An absolute path's directories (a URL's or a relative path's slashes are not)."""
RUN_DIR = "/srv/parallab/home/runs/0123abcd/job.json"


def worker_traceback() -> str:
    """What a rank that could not read its job prints: a traceback through this file and pathlib."""
    try:
        Path(RUN_DIR).read_text()
    except FileNotFoundError:
        return "exit code 1\n" + traceback.format_exc()
    raise AssertionError("the run directory exists")


@pytest.fixture
def lab(settings: Settings, tmp_path: Path) -> tuple[Settings, str, str, dict[str, str]]:
    """A lab-mode server with a viewer, a member and an admin, and one failed run: (settings, run id, raw error, cookies)."""
    lab_settings = settings.model_copy(update={"allow_local_mode": False, "secret_key": "error-paths-secret"})
    error = worker_traceback()
    cookies = {}
    with session_scope(lab_settings.sqlalchemy_url) as session:
        for role in ("viewer", "member", "admin"):
            user = auth.create_user(session=session, email=f"{role}@lab.org", password="a-long-password", role=role)
            cookies[role] = auth.start_session(session=session, user=user, max_age_s=3600)
        spec = JobSpec.model_validate({"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}})
        run = run_service.create_run(session=session, spec=spec, settings=lab_settings, source="api", user_id=user.id)
        store.set_status(session, run, "failed", error=error)
        store.set_progress(session, run.id, {"phase": "failed", "log": error})
        run_id = run.id
    return lab_settings, run_id, error, cookies


def reader(settings: Settings, cookie: str) -> TestClient:
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    client = TestClient(app)
    client.cookies.set(SESSION_COOKIE, cookie)
    return client


def pre_text(page: str, element_id: str) -> str:
    """The text of the run page's `<pre id=element_id>`."""
    found = re.search(rf'<pre[^>]*id="{element_id}"[^>]*>(.*?)</pre>', page, flags=re.S)
    assert found is not None, element_id
    return html.unescape(found.group(1))


def test_the_traceback_holds_the_paths_a_viewer_must_not_see() -> None:
    raw = worker_traceback()
    assert RUN_DIR in raw and str(Path(__file__).resolve()) in raw and "pathlib.py" in raw


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_a_viewer_or_member_reads_the_error_without_server_paths(lab, role: str) -> None:
    settings, run_id, raw, cookies = lab
    client = reader(settings, cookies[role])
    seen = {
        "REST": client.get(f"/api/v1/runs/{run_id}").json()["error"],
        "REST log": client.get(f"/api/v1/runs/{run_id}").json()["progress"]["log"],
        "list log": next(r for r in client.get("/api/v1/runs").json()["items"] if r["id"] == run_id)["progress"]["log"],
        "status": client.get(f"/runs/{run_id}/status.json").json()["error"],
        "status log": client.get(f"/runs/{run_id}/status.json").json()["progress"]["log"],
        "page": pre_text(client.get(f"/runs/{run_id}").text, "run-error"),
    }
    for where, text in seen.items():
        assert ABSOLUTE.search(text) is None, (where, ABSOLUTE.search(text))
        assert "FileNotFoundError" in text and "…/job.json" in text, where
    assert 'File "tests/backend/test_error_paths.py"' in seen["REST"], "this checkout's files keep their repository path"


def test_an_admin_reads_the_error_as_the_worker_wrote_it(lab) -> None:
    settings, run_id, raw, cookies = lab
    client = reader(settings, cookies["admin"])
    assert client.get(f"/api/v1/runs/{run_id}").json()["error"] == raw
    assert client.get(f"/runs/{run_id}/status.json").json()["error"] == raw
    assert pre_text(client.get(f"/runs/{run_id}").text, "run-error") == raw
