"""Load on a real server: concurrent CI uploads, and form submissions while a job runs.

    flock /tmp/parallab-heavy.lock python benchmarks/load.py \
        [--url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--uploaders 50] [--per-uploader 20] [--forms 20]

1. Uploads: `--uploaders` threads, each a CI pipeline with its own token, upload `--per-uploader`
   result documents each (distinct documents, each with its own Idempotency-Key) at once, through
   uvicorn on 127.0.0.1 into a scratch Postgres database. Checks that every upload got 201, that
   exactly uploaders × per-uploader runs were stored, each once (one per key), with their rank
   rows, and that no answer was a 5xx.
2. Forms: a worker (the embedded SQLite broker under a temp home) runs one tiny job; while it
   runs, `--forms` browsers each load /runs/new and submit it at once. Checks no 5xx and that
   every submission was stored and queued; the queued runs are cancelled afterwards.

Prints p50/p95/max latencies and writes them to BENCHMARKS.md under "Load: concurrent uploads
and form submissions" (its own section only). Loopback only; the scratch database, the server
and the worker are gone at the end. Bounded: a stuck phase fails after `--timeout` seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.db import get_engine, session_scope  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.models import RankMetric, Run  # noqa: E402
from backend.services.tokens import create_token  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from tests.ui.factories import make_document  # noqa: E402

HEADING = "Load: concurrent uploads and form submissions"
TINY_JOB = {
    "name": "load: the busy worker's job",
    "workload": {"model": "tiny", "steps": 30, "warmup_steps": 1},
    "strategy": {"name": "ddp", "world_size": 2},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    name = f"parallab_load_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A child in its own process group, stopped (the whole group) on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"n": len(ordered), "p50": q[49], "p95": q[94], "max": ordered[-1]}


def timed(call: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    response = call()
    return time.perf_counter() - start, response


def upload_phase(base: str, url: str, *, uploaders: int, per_uploader: int, timeout: float) -> dict[str, float]:
    with session_scope(url) as session:
        tokens = [create_token(session=session, name=f"load-{i}", scopes=["upload"]) for i in range(uploaders)]
    documents = [
        [
            make_document(tokens_per_s=10_000.0 + i * per_uploader + j, name=f"load {i}.{j}", seed=j).model_dump(mode="json")
            for j in range(per_uploader)
        ]
        for i in range(uploaders)
    ]
    start = threading.Barrier(uploaders)

    def pipeline(i: int) -> list[tuple[float, int]]:
        out = []
        with httpx.Client(base_url=base, timeout=timeout, headers={"Authorization": f"Bearer {tokens[i]}"}) as client:
            start.wait()
            for j, doc in enumerate(documents[i]):
                seconds, response = timed(lambda: client.post("/api/v1/results", json=doc, headers={"Idempotency-Key": f"load-{i}-{j}"}))  # noqa: B023
                out.append((seconds, response.status_code))
        return out

    began = time.perf_counter()
    with ThreadPoolExecutor(uploaders) as pool:
        results = [r for rs in pool.map(pipeline, range(uploaders)) for r in rs]
    wall = time.perf_counter() - began
    codes = [c for _, c in results]
    expected = uploaders * per_uploader
    with session_scope(url) as session:
        stored = session.execute(select(func.count()).select_from(Run).where(Run.source == "ci")).scalar_one()
        keys = session.execute(select(func.count(func.distinct(Run.idempotency_key)))).scalar_one()
        rank_rows = session.execute(select(func.count()).select_from(RankMetric)).scalar_one()
    problems = []
    if any(c >= 500 for c in codes):
        problems.append(f"{sum(c >= 500 for c in codes)} answers were 5xx")
    if codes.count(201) != expected:
        problems.append(f"{codes.count(201)} of {expected} uploads got 201: {sorted(set(codes))}")
    if stored != expected or keys != expected:
        problems.append(f"stored {stored} runs under {keys} keys, expected {expected} each")
    if rank_rows != 2 * expected:
        problems.append(f"{rank_rows} rank rows, expected {2 * expected}")
    if problems:
        raise SystemExit("upload phase failed: " + "; ".join(problems))
    return {**percentiles([s for s, _ in results]), "wall": wall, "rate": expected / wall}


CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def form_phase(base: str, *, forms: int, timeout: float) -> dict[str, float]:
    with httpx.Client(base_url=base, timeout=timeout) as api:
        job = api.post("/api/v1/runs", json=TINY_JOB)
        job.raise_for_status()
        job_id = job.json()["id"]
        wait_until(lambda: api.get(f"/api/v1/runs/{job_id}").json()["status"] != "queued", timeout, "the worker to start the tiny job")
        if api.get(f"/api/v1/runs/{job_id}").json()["status"] != "running":
            raise SystemExit(f"the tiny job ended before the forms were sent: {api.get(f'/api/v1/runs/{job_id}').json()['error']}")
        start = threading.Barrier(forms)

        def browser(i: int) -> tuple[float, int, str]:
            with httpx.Client(base_url=base, timeout=timeout) as client:
                page = client.get("/runs/new")
                token = CSRF.search(page.text)
                if token is None:
                    raise SystemExit(f"/runs/new has no CSRF token ({page.status_code})")
                form = {
                    "csrf_token": token.group(1),
                    "model": "tiny",
                    "strategy": "ddp",
                    "world_size": "2",
                    "steps": "2",
                    "name": f"load form {i}",
                }
                start.wait()
                seconds, response = timed(lambda: client.post("/runs/new", data=form, headers={"origin": base}))
                return seconds, response.status_code, response.headers.get("location", "")

        with ThreadPoolExecutor(forms) as pool:
            results = list(pool.map(browser, range(forms)))
        still_running = api.get(f"/api/v1/runs/{job_id}").json()["status"] == "running"
        submitted = [loc.rsplit("/", 1)[-1] for _, code, loc in results if code == 303]
        for run_id in [*submitted, job_id]:
            api.post(f"/api/v1/runs/{run_id}/cancel")  # queued ones at once; the running job by its worker
        wait_until(lambda: api.get(f"/api/v1/runs/{job_id}").json()["status"] != "running", timeout, "the tiny job to stop")
    codes = [c for _, c, _ in results]
    if any(c >= 500 for c in codes) or codes.count(303) != forms:
        raise SystemExit(f"form phase failed: answers {sorted(codes)}")
    return {**percentiles([s for s, _, _ in results]), "job_running_throughout": float(still_running)}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def row(what: str, stats: dict[str, float], other: str) -> str:
    return f"| {what} | {stats['n']:.0f} | {ms(stats['p50'])} | {ms(stats['p95'])} | {ms(stats['max'])} | {other} |"


def report(uploads: dict[str, float], forms: dict[str, float], args: argparse.Namespace, command: str) -> str:
    cpu = platform.processor() or platform.machine()
    total = args.uploaders * args.per_uploader
    upload_row = row(
        f"uploads: {args.uploaders} pipelines × {args.per_uploader} results at once",
        uploads,
        f"{uploads['rate']:.1f} uploads/s over {uploads['wall']:.1f} s",
    )
    form_row = row(
        f"form submissions while the worker runs a job: {args.forms} at once",
        forms,
        f"job running throughout: {'yes' if forms['job_running_throughout'] else 'no'}",
    )
    return f"""
Measured by `{command}` on this machine ({os.cpu_count()} CPU cores, {cpu}, Python {platform.python_version()}),
against uvicorn (one process) on 127.0.0.1 and Postgres on 127.0.0.1. Latency is per request, seen by the client.

| phase | requests | p50 | p95 | max | other |
|---|---|---|---|---|---|
{upload_row}
{form_row}

Every upload was answered 201 and stored exactly once ({total} runs, one per Idempotency-Key, two rank rows
each); every form submission was answered 303 and queued; no answer was a 5xx. The 2-core machine is shared
by the server, Postgres, the client threads and (in the second phase) the worker's two ranks, so these are a
floor for a lab server, not its capacity.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--uploaders", type=int, default=50)
    parser.add_argument("--per-uploader", type=int, default=20)
    parser.add_argument("--forms", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds any one wait may take before the run fails.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave BENCHMARKS.md alone.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="parallab-load-") as tmp, scratch_database(args.url) as url:
        home = Path(tmp)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
        env.update(
            PARALLAB_HOME=str(home),
            PARALLAB_DATABASE_URL=url,
            PARALLAB_SECRET_KEY=secrets.token_urlsafe(32),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
        )
        server_args = [
            sys.executable,
            "-m",
            "uvicorn",
            "backend.api.app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        with process(server_args, env, home / "uvicorn.log"):
            wait_until(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, args.timeout, "uvicorn")
            uploads = upload_phase(base, url, uploaders=args.uploaders, per_uploader=args.per_uploader, timeout=args.timeout)
            print(f"uploads: {uploads}")
            with process([sys.executable, "-m", "parallab", "worker", "--loglevel", "WARNING"], env, home / "worker.log"):
                forms = form_phase(base, forms=args.forms, timeout=args.timeout)
                print(f"forms: {forms}")
    command = "python benchmarks/load.py" + "".join(
        f" --{k.replace('_', '-')} {v}"
        for k, v in (("uploaders", args.uploaders), ("per_uploader", args.per_uploader), ("forms", args.forms))
    )
    body = report(uploads, forms, args, command)
    print(body)
    if not args.no_write:
        write_section(HEADING, body)


if __name__ == "__main__":
    main()
