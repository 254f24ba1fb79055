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

    flock /tmp/parallab-heavy.lock python benchmarks/load.py --scenario backpressure \
        [--uploaders 50] [--per-uploader 20] [--servers uvicorn2,up]

`--scenario backpressure`: CI uploads against each server in turn — `uvicorn --workers 2` in
network mode (accounts and tokens required) and the embedded `parallab up` (one process, with its
worker), both on a scratch Postgres database. `--uploaders` users, each with its own upload token,
upload `--per-uploader` distinct documents under distinct Idempotency-Keys at once; a 503 is
retried after its Retry-After under the same key, as `parallab upload` does (bounded). Then 20
uploads under one key at once. Checks: no 5xx but 503, every 503 carries Retry-After and is
followed by a successful retry, every upload ends 201, each stored exactly once (rows counted),
the one-key uploads store one run and all answer it. Writes "Load: CI uploads under back-pressure".
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
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.db import get_engine, session_scope  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.models import RankMetric, Run  # noqa: E402
from backend.services.auth import create_user  # noqa: E402
from backend.services.tokens import create_token  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from tests.ui.factories import make_document  # noqa: E402

HEADING = "Load: concurrent uploads and form submissions"
BACKPRESSURE_HEADING = "Load: CI uploads under back-pressure"
ONE_KEY = 20
"""Uploads sent at once under one Idempotency-Key."""
MAX_TRIES = 30
"""Tries of one upload (the first and its retries after 503) before the run fails."""
TINY_JOB = {
    "name": "load: the busy worker's job",
    "workload": {"model": "tiny", "steps": 30, "warmup_steps": 1},
    "strategy": {"name": "ddp", "world_size": 2},
}


def server_env(home: Path, url: str) -> dict[str, str]:
    """A server's environment: this process's, less any PARALLAB_ setting, on a scratch home and database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    env.update(
        PARALLAB_HOME=str(home),
        PARALLAB_DATABASE_URL=url,
        PARALLAB_SECRET_KEY=secrets.token_urlsafe(32),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
    )
    return env


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


@dataclass
class Upload:
    """One CI upload as its client saw it: each try's status and seconds, and the run it ended with."""

    tries: list[tuple[int, float]] = field(default_factory=list)
    run_id: str | None = None
    missing_retry_after: int = 0

    @property
    def final(self) -> int:
        return self.tries[-1][0]


def upload_with_retries(client: httpx.Client, document: dict, key: str, deadline: float) -> Upload:
    """POST until the answer is not a 503 (waiting out its Retry-After), as `parallab upload` does."""
    out = Upload()
    while True:
        seconds, response = timed(lambda: client.post("/api/v1/results", json=document, headers={"Idempotency-Key": key}))
        out.tries.append((response.status_code, seconds))
        if response.status_code != 503 or len(out.tries) >= MAX_TRIES or time.monotonic() > deadline:
            break
        told = response.headers.get("retry-after", "")
        out.missing_retry_after += not told.isdigit()
        time.sleep(min(30.0, float(told)) if told.isdigit() else 1.0)
    if out.final in (200, 201):
        out.run_id = response.json()["id"]
    return out


def uploaders(url: str, n: int, prefix: str) -> list[str]:
    """`n` users (members), each with an upload token of its own; their tokens."""
    with session_scope(url) as session:
        users = [
            create_user(session=session, email=f"{prefix}-{i}@load.example", password=secrets.token_urlsafe(16), role="member")
            for i in range(n)
        ]
        return [create_token(session=session, name="ci", scopes=["upload"], user=u) for u in users]


def stored_counts(url: str) -> tuple[int, int, int]:
    """(CI runs, distinct (owner, key) pairs, rank rows) in the database."""
    with session_scope(url) as session:
        runs = session.execute(select(func.count()).select_from(Run).where(Run.source == "ci")).scalar_one()
        keys = session.execute(
            select(func.count()).select_from(
                select(Run.idempotency_owner, Run.idempotency_key).where(Run.source == "ci").distinct().subquery()
            )
        ).scalar_one()
        rank_rows = session.execute(select(func.count()).select_from(RankMetric)).scalar_one()
    return runs, keys, rank_rows


def summarise(uploads: list[Upload], wall: float) -> dict[str, object]:
    tries = [t for u in uploads for t in u.tries]
    return {
        "uploads": len(uploads),
        "tries": len(tries),
        "codes": dict(sorted(Counter(c for c, _ in tries).items())),
        "final": dict(sorted(Counter(u.final for u in uploads).items())),
        "retried": sum(len(u.tries) > 1 for u in uploads),
        "try": percentiles([s for _, s in tries]),
        "upload": percentiles([sum(s for _, s in u.tries) for u in uploads]),
        "wall": wall,
    }


def problems_of(uploads: list[Upload]) -> list[str]:
    out = []
    codes = Counter(c for u in uploads for c, _ in u.tries)
    if errors := {c: n for c, n in codes.items() if c >= 500 and c != 503}:
        out.append(f"5xx other than 503: {errors}")
    if missing := sum(u.missing_retry_after for u in uploads):
        out.append(f"{missing} answers 503 without Retry-After")
    if unfinished := [u.tries for u in uploads if u.final not in (200, 201)]:
        out.append(f"{len(unfinished)} uploads never succeeded, e.g. {unfinished[0]}")
    if stored_then_503 := sum(u.final == 200 and any(c == 503 for c, _ in u.tries) for u in uploads):
        out.append(f"{stored_then_503} uploads were stored yet answered 503 (their retry replayed)")
    return out


def ci_phase(base: str, url: str, *, clients: int, per_client: int, timeout: float, prefix: str) -> dict[str, object]:
    """`clients` CI pipelines at once, each uploading `per_client` distinct documents under distinct keys."""
    tokens = uploaders(url, clients, prefix)
    documents = [
        [
            make_document(tokens_per_s=10_000.0 + i * per_client + j, name=f"{prefix} {i}.{j}", seed=j).model_dump(mode="json")
            for j in range(per_client)
        ]
        for i in range(clients)
    ]
    before = stored_counts(url)
    start = threading.Barrier(clients)
    deadline = time.monotonic() + timeout

    def pipeline(i: int) -> list[Upload]:
        with httpx.Client(base_url=base, timeout=timeout, headers={"Authorization": f"Bearer {tokens[i]}"}) as client:
            start.wait()
            return [upload_with_retries(client, doc, f"{prefix}-{i}-{j}", deadline) for j, doc in enumerate(documents[i])]

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        uploads = [u for us in pool.map(pipeline, range(clients)) for u in us]
    wall = time.perf_counter() - began
    runs, keys, rank_rows = (a - b for a, b in zip(stored_counts(url), before, strict=True))
    expected = clients * per_client
    problems = problems_of(uploads)
    if Counter(u.final for u in uploads)[201] != expected:
        problems.append(f"final answers {dict(Counter(u.final for u in uploads))}, expected {expected} × 201")
    if runs != expected or keys != expected or rank_rows != 2 * expected or len({u.run_id for u in uploads}) != expected:
        problems.append(f"stored {runs} runs under {keys} keys with {rank_rows} rank rows; expected {expected} once each")
    return {**summarise(uploads, wall), "stored": runs, "problems": problems}


def one_key_phase(base: str, url: str, *, timeout: float, prefix: str) -> dict[str, object]:
    """ONE_KEY uploads of one document under one key, all at once: one run, every answer that run."""
    (token,) = uploaders(url, 1, prefix)
    document = make_document(tokens_per_s=12_345.0, name=f"{prefix} one key").model_dump(mode="json")
    before = stored_counts(url)
    start = threading.Barrier(ONE_KEY)
    deadline = time.monotonic() + timeout

    def one(_: int) -> Upload:
        with httpx.Client(base_url=base, timeout=timeout, headers={"Authorization": f"Bearer {token}"}) as client:
            start.wait()
            return upload_with_retries(client, document, f"{prefix}-the-key", deadline)

    began = time.perf_counter()
    with ThreadPoolExecutor(ONE_KEY) as pool:
        uploads = list(pool.map(one, range(ONE_KEY)))
    wall = time.perf_counter() - began
    runs = stored_counts(url)[0] - before[0]
    problems = [p for p in problems_of(uploads) if "stored yet answered 503" not in p]  # here a retry's 200 is the point
    finals = Counter(u.final for u in uploads)
    if finals[201] != 1 or finals[201] + finals[200] != ONE_KEY or len({u.run_id for u in uploads}) != 1 or runs != 1:
        problems.append(f"one key: final answers {dict(finals)}, {len({u.run_id for u in uploads})} run ids, {runs} runs stored")
    return {**summarise(uploads, wall), "stored": runs, "problems": problems}


SERVERS = {
    "uvicorn2": "`uvicorn --workers 2`, network mode (tokens required)",
    "up": "`parallab up` (one API process and its worker)",
}


@contextmanager
def server(kind: str, env: dict[str, str], home: Path, timeout: float) -> Iterator[str]:
    """One of SERVERS on a free loopback port, gone at the end; its base URL."""
    port = free_port()
    if kind == "uvicorn2":
        env = {**env, "PARALLAB_ALLOW_LOCAL_MODE": "false"}
        args = [sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
        args += ["--log-level", "warning"]
    else:
        args = [sys.executable, "-m", "parallab", "up", "--host", "127.0.0.1", "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    with process(args, env, home / f"{kind}.log"):
        wait_until(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, timeout, kind)
        yield base


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def backpressure(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """The CI and one-key phases against each server of `--servers`; {server: results}."""
    out: dict[str, dict[str, object]] = {}
    for kind in args.servers.split(","):
        with tempfile.TemporaryDirectory(prefix="parallab-load-") as tmp, scratch_database(args.url) as url:
            home = Path(tmp)
            env = server_env(home, url)
            with server(kind, env, home, args.timeout) as base:
                load_before = load_average()
                ci = ci_phase(base, url, clients=args.uploaders, per_client=args.per_uploader, timeout=args.timeout, prefix=f"{kind}-ci")
                print(f"{kind}: {ci}")
                one = one_key_phase(base, url, timeout=args.timeout, prefix=f"{kind}-one")
                print(f"{kind} one key: {one}")
                out[kind] = {"ci": ci, "one": one, "load": f"{load_before} before, {load_average()} after"}
    return out


def codes_text(codes: object) -> str:
    return ", ".join(f"{n} × {c}" for c, n in dict(codes).items())  # type: ignore[call-overload]


def backpressure_report(results: dict[str, dict[str, object]], args: argparse.Namespace, command: str) -> str:
    cpu = platform.processor() or platform.machine()
    rows = []
    for kind, r in results.items():
        for phase, what in (
            ("ci", f"{args.uploaders} clients × {args.per_uploader} uploads, distinct keys"),
            ("one", f"{ONE_KEY} at once, one key"),
        ):
            p: dict = r[phase]  # type: ignore[assignment]
            rows.append(
                f"| {SERVERS[kind]} | {what} | {p['uploads']} | {codes_text(p['codes'])} | {p['retried']} | {codes_text(p['final'])} | "
                f"{p['stored']} | {ms(p['try']['p50'])} / {ms(p['try']['p95'])} | {ms(p['upload']['p50'])} / {ms(p['upload']['p95'])} | "
                f"{p['wall']:.1f} s |"
            )
    loads = "; ".join(f"{SERVERS[k]}: {r['load']}" for k, r in results.items())
    failed = [f"{k} {ph}: {pr}" for k, r in results.items() for ph in ("ci", "one") if (pr := r[ph]["problems"])]  # type: ignore[index]
    verdict = (
        "No answer was a 5xx other than 503; every 503 carried Retry-After and its retry (same key) succeeded; every upload "
        "ended 201 and was stored exactly once (rows counted), and the one-key uploads stored one run that every answer named."
        if not failed
        else "**Failed:** " + "; ".join(failed)
    )
    return f"""
Measured by `{command}` on this machine ({os.cpu_count()} CPU cores, {cpu}, Python {platform.python_version()}), client
threads, server and Postgres all on 127.0.0.1. Load average (1 / 5 / 15 min) while it ran — {loads}: the machine is
shared with other work, so latencies are a floor for a lab server, not its capacity. A client that gets 503 waits for
its Retry-After and retries under the same Idempotency-Key (as `parallab upload` does); "try" latency is one request,
"upload" is from the first try to the final answer. Server settings are the defaults (2 upload threads and a queue
of 16 per API process, a database pool of 8 + 8).

| server | uploads | n | answers to every try | uploads retried | final answers | runs stored | try p50 / p95 | upload p50 / p95 | wall |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{verdict}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--uploaders", type=int, default=50)
    parser.add_argument("--per-uploader", type=int, default=20)
    parser.add_argument("--forms", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds any one wait may take before the run fails.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave BENCHMARKS.md alone.")
    parser.add_argument("--scenario", choices=["forms", "backpressure"], default="forms")
    parser.add_argument("--servers", default="uvicorn2,up", help="backpressure: which servers, of " + ", ".join(SERVERS))
    args = parser.parse_args()
    if args.scenario == "backpressure":
        results = backpressure(args)
        command = (
            f"python benchmarks/load.py --scenario backpressure --uploaders {args.uploaders} "
            f"--per-uploader {args.per_uploader} --servers {args.servers}"
        )
        body = backpressure_report(results, args, command)
        print(body)
        if not args.no_write:
            write_section(BACKPRESSURE_HEADING, body)
        failed = [pr for r in results.values() for ph in ("ci", "one") if (pr := r[ph]["problems"])]  # type: ignore[index]
        if failed:
            raise SystemExit(f"back-pressure run failed: {failed}")
        return

    with tempfile.TemporaryDirectory(prefix="parallab-load-") as tmp, scratch_database(args.url) as url:
        home = Path(tmp)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = server_env(home, url)
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
