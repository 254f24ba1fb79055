"""Issue #11, done as a new user would: a shared server outside local mode, accounts, CI uploads,
regression verdicts — with real parts (Postgres, uvicorn over HTTP, `parallab` commands, torchrun).

The server binds to loopback but runs with local mode switched off by configuration
(PARALLAB_ALLOW_LOCAL_MODE=false), so it behaves exactly as a lab's shared server: every page
needs a login and every API call a session or a token. (Local mode is meant to follow the real
bind; this test states its intent through the setting, not through the address.)

The CI snippets' commands are read from docs/ci/ and run as written (a `parallab` on PATH that
is this checkout's). Two real `parallab bench` runs: the GitHub snippet's, whose result the test
then re-uploads with its step times scaled (the same path as a real slowdown), and the GitLab
snippet's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.backend.ci_documents import slowed
from workers.launcher import stop_process_group

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SNIPPETS = REPO / "docs" / "ci"
ADMIN, MEMBER = ("admin@lab.org", "admin-password-1"), ("member@lab.org", "member-password-1")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any CI's or parallab's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARALLAB_", "GITHUB_", "CI_", "GITLAB_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", COLUMNS="200", **extra)
    return env


@dataclass
class Server:
    url: str
    env: dict[str, str]
    """What a `parallab` command on the server's host sees (its database)."""
    log: Path


@pytest.fixture(scope="module")
def server(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("shared-server")
    env = clean_env(
        PARALLAB_DATABASE_URL=postgres_url,
        PARALLAB_HOME=str(home),
        PARALLAB_HOST="127.0.0.1",
        PARALLAB_ALLOW_LOCAL_MODE="false",  # a shared server, though on loopback: see the module's docstring
        PARALLAB_SECRET_KEY="e2e-accounts-secret",
    )
    port = free_port()
    log = home / "uvicorn.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)
    try:
        yield Server(url, env, log)
    finally:
        stop_process_group(proc)


def parallab(server: Server, *args: str, stdin: str = "", cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parallab", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**server.env, **env},
        cwd=cwd,
        timeout=300,
    )


def form_token(client: httpx.Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, (path, page.status_code)
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, path
    return match.group(1)


def log_in(server: Server, email: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=server.url, follow_redirects=False, timeout=30)
    response = client.post("/login", data={"csrf_token": form_token(client, "/login"), "email": email, "password": password})
    assert response.status_code == 303, response.text[-500:]
    return client


def snippet_commands(name: str) -> list[str]:
    """The `parallab bench` and `parallab upload` commands of a CI snippet in docs/ci, as written there
    (the report step, which comments on a pull request, is tested in tests/backend/test_ci_cli.py)."""
    doc = yaml.safe_load((SNIPPETS / name).read_text())
    if name.startswith("github"):
        lines = [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]
    else:
        lines = [line for job in doc.values() if isinstance(job, dict) and "script" in job for line in job["script"]]
    commands = [line.strip() for line in lines if line.strip().startswith(("parallab bench ", "parallab upload "))]
    assert [c.split()[1] for c in commands] == ["bench", "upload"], commands
    return commands


def run_snippet(server: Server, name: str, workdir: Path, token: str, ci_env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """Run a snippet's commands in `workdir` as its CI would: a shell, `parallab` on PATH, the CI's variables."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "parallab"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m parallab "$@"\n')
    shim.chmod(0o755)
    env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}", PARALLAB_SERVER=server.url, PARALLAB_TOKEN=token, **ci_env)
    env["PARALLAB_HOME"] = str(workdir / "home")
    done = []
    for command in snippet_commands(name):
        done.append(subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=600))
        assert done[-1].returncode == 0, f"{command}\n{done[-1].stdout[-3000:]}\n{done[-1].stderr[-3000:]}"
    return done


def test_a_lab_server_judges_ci_uploads_and_shows_who_did_what(server: Server, tmp_path: Path) -> None:
    anonymous = httpx.Client(base_url=server.url, follow_redirects=False)
    assert anonymous.get("/").status_code == 303 and anonymous.get("/api/v1/runs").status_code == 401, "outside local mode"

    # The first admin, on the server's host; the admin creates a member on the Users page.
    made = parallab(server, "user", "create", ADMIN[0], "--admin", "--password-stdin", stdin=ADMIN[1] + "\n")
    assert made.returncode == 0, made.stderr
    admin = log_in(server, *ADMIN)
    created = admin.post(
        "/users", data={"csrf_token": form_token(admin, "/users"), "email": MEMBER[0], "password": MEMBER[1], "role": "member"}
    )
    assert created.status_code == 200 and f'data-email="{MEMBER[0]}"' in created.text

    # The member logs in and makes an upload token on the Tokens page (shown once).
    member = log_in(server, *MEMBER)
    page = member.post("/tokens", data={"csrf_token": form_token(member, "/tokens"), "name": "ci", "scope": ["upload"]})
    token = re.search(r'id="new-token-value">(plb_[^<]+)<', page.text).group(1)

    # CI on main, as the GitHub snippet runs it: a real bench, uploaded (the series' first result).
    github = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_REPOSITORY": "lab/model",
        "GITHUB_REF": "refs/heads/main",
        "GITHUB_REF_NAME": "main",
        "GITHUB_REF_TYPE": "branch",
        "GITHUB_SHA": "1111111111111111111111111111111111111111",
        "GITHUB_SERVER_URL": "https://ci.example",
        "GITHUB_RUN_ID": "101",
    }
    work = tmp_path / "github"
    work.mkdir()
    bench, first = run_snippet(server, "github-actions.yml", work, token, github)
    assert "no baseline" in first.stdout
    result = json.loads((work / "result.json").read_text())

    # More results on main make the baseline: the real one again, its step times within ±1%.
    def upload(doc: dict, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return parallab(server, "upload", str(path), "--server", server.url, "--token", token, "--repository", "lab/model", *args)

    for i, factor in enumerate((0.99, 1.01, 1.0)):
        done = upload(slowed(result, factor), f"main-{i}.json", "--branch", "main", "--commit", f"{i + 2}" * 40)
        assert done.returncode == 0, done.stderr

    # A pull request's branch: the same speed passes --fail-on-regression; 20% slower fails it.
    same = upload(result, "pr-same.json", "--branch", "feature/x", "--commit", "a" * 40, "--pr", "7", "--fail-on-regression")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "unchanged" in same.stdout and "regressed" not in same.stdout
    slow = upload(slowed(result, 1.25), "pr-slow.json", "--branch", "feature/x", "--commit", "b" * 40, "--pr", "7", "--fail-on-regression")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "regressed" in slow.stdout and "-20.0%" in slow.stdout

    # The branch's series page shows both results, the slow one's alert marked; the run links to it.
    runs = member.get("/api/v1/runs", params={"user": MEMBER[0], "limit": 20}).json()["items"]
    by_commit = {r["commit"]: r for r in runs}
    slow_run, same_run = by_commit["b" * 40], by_commit["a" * 40]
    assert slow_run["series_id"] == same_run["series_id"] and slow_run["user"] == MEMBER[0] and slow_run["pr"] == 7
    series_page = member.get(f"/series/{slow_run['series_id']}").text
    assert f'data-run="{slow_run["id"]}"' in series_page and f'data-run="{same_run["id"]}"' in series_page
    assert re.search(r'<tr class="alert-row" data-alert="\d+"', series_page), "the alert is marked"
    assert f'href="/series/{slow_run["series_id"]}"' in member.get(f"/runs/{slow_run['id']}").text
    series = member.get(f"/api/v1/series/{slow_run['series_id']}").json()
    assert series["branch"] == "feature/x" and series["open_alerts"] >= 1

    # The leaderboard shows who uploaded each run.
    board = member.get("/leaderboard", params={"runs": "all", "user": MEMBER[0]}).text
    assert board.count(f'<td class="small uploader">{MEMBER[0]}</td>') >= 6

    # CI as the GitLab snippet runs it, for another project (a series of its own, no baseline yet).
    gitlab = {
        "GITLAB_CI": "true",
        "CI_PROJECT_PATH": "lab/other",
        "CI_COMMIT_REF_NAME": "main",
        "CI_COMMIT_BRANCH": "main",
        "CI_COMMIT_SHA": "c" * 40,
        "CI_JOB_URL": "https://ci.example/lab/other/-/jobs/5",
    }
    work = tmp_path / "gitlab"
    work.mkdir()
    _, uploaded = run_snippet(server, "gitlab-ci.yml", work, token, gitlab)
    stored = member.get("/api/v1/runs", params={"user": MEMBER[0], "limit": 1}).json()["items"][0]
    assert stored["repository"] == "lab/other" and stored["ci_url"] == gitlab["CI_JOB_URL"] and stored["commit"] == "c" * 40
    assert bench.returncode == 0 and uploaded.returncode == 0
