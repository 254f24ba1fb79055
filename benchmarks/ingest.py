"""Ingest: parallab's CI upload against MLflow's tracking server, both on Postgres, taking turns.

    pip install -e '.[bench]'   # mlflow (its server; or point --mlflow-python at another env's python)
    flock /tmp/parallab-heavy.lock python benchmarks/ingest.py [--json] [--clients 10] [--seconds 8] [--rounds 2]

Two servers on 127.0.0.1: parallab as `--workers` uvicorn processes (default 1; compose deploys 2),
MLflow with `--workers 1`, each on its own scratch Postgres database:

- parallab: `POST /api/v1/results`, one result document per request (Bearer token per client,
  a fresh Idempotency-Key each time, the per-token rate limit off). The server validates it,
  recomputes and checks its summary, judges it against its CI series and stores it in one
  transaction (run row, document, rank and comm rows).
- MLflow: the same document as MLflow users log it — `runs/create`, then `runs/log-batch` (its
  batch API: at most 1,000 metrics a request) with the workload and strategy as params and every
  number as a metric (summary, per-rank step times by step, memory, per-op communication, loss
  by step), then `runs/update` to FINISHED.

Documents (built by tests/ui/factories.py, consistent with themselves):
- wide: fsdp on 64 ranks, 100 measured steps (6,400 step times, 64 × 2 comm ops);
- small: ddp on 2 ranks, 10 steps (a real CI document's size).

Each phase runs `--clients` threads that upload back to back for `--seconds` (a document in
flight at the end still counts); docs/s is documents over the time to the last answer, p50 is
per document (MLflow: its create + batches + update). Phases alternate parallab, MLflow, for
each kind, `--rounds` times; the figures are the medians over rounds. While each phase runs, a
separate process polls the server's health endpoint (`/healthz`; MLflow's `/health`) every 10 ms
and reports p50/p99 — whether the server stays responsive during uploads.

Writes BENCHMARKS.md's section "Ingest: parallab against MLflow" unless `--no-write`; `--json`
prints one line: {"clients": N, "cases": {"wide": {"parallab": {...}, "mlflow": {...},
"ratio_docs_per_s": x}, "small": {...}}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.db import session_scope  # noqa: E402
from backend.services.tokens import create_token  # noqa: E402
from benchmarks.load import free_port, process, scratch_database, wait_until  # noqa: E402
from benchmarks.report import write_section  # noqa: E402

HEADING = "Ingest: parallab against MLflow"
KINDS = {"wide": {"strategy": "fsdp", "world_size": 64, "steps": 100}, "small": {"strategy": "ddp", "world_size": 2, "steps": 10}}
MLFLOW_BATCH = 1000


def documents(kind: str, n: int) -> list[dict[str, Any]]:
    """`n` distinct documents of one kind, as JSON-ready dicts."""
    from tests.ui.factories import make_document

    shape = KINDS[kind]
    return [
        make_document(**shape, tokens_per_s=10_000.0 + i, name=f"ingest {kind} {i}", seed=i, branch="main").model_dump(mode="json")
        for i in range(n)
    ]


# ---- MLflow: the document as params and metrics ----


def _flat(prefix: str, block: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in block.items():
        if isinstance(value, dict):
            out.update(_flat(f"{prefix}{key}.", value))
        elif value is not None:
            out[f"{prefix}{key}"] = str(value)[:6000]
    return out


def mlflow_entities(doc: dict[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, Any]], list[dict[str, str]]]:
    """(params, metrics, tags) of one result document, the way MLflow users log a benchmark."""
    params = _flat("workload.", doc["workload"]) | _flat("strategy.", doc["strategy"]) | _flat("hardware.", doc["hardware"])
    ts = int(time.time() * 1000)
    metrics: list[dict[str, Any]] = []

    def metric(key: str, value: Any, step: int = 0) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.append({"key": key, "value": float(value), "timestamp": ts, "step": step})

    for key, value in doc["summary"].items():
        if isinstance(value, dict):
            for sub, v in value.items():
                metric(f"summary.{key}.{sub}", v)
        else:
            metric(f"summary.{key}", value)
    for rank in doc["ranks"]:
        r = rank["rank"]
        for step, t in enumerate(rank["step_times_s"]):
            metric(f"rank{r}.step_time_s", t, step)
        for key in ("peak_allocated_bytes", "peak_rss_bytes", "comm_time_fraction", "exposed_comm_time_s"):
            metric(f"rank{r}.{key}", rank.get(key))
        for c in rank.get("comm") or []:
            for key in ("count", "bytes", "time_s", "busbw_gbps"):
                metric(f"rank{r}.comm.{c['op']}.{key}", c.get(key))
    for step, v in enumerate((doc.get("loss") or {}).get("values") or []):
        metric("loss", v, step)
    tags = [{"key": "mlflow.runName", "value": doc.get("name") or "run"}, {"key": "branch", "value": "main"}]
    return [{"key": k, "value": v} for k, v in list(params.items())[:100]], metrics, tags


class MlflowDoc:
    """One document's MLflow requests, serialised up front (the run id is filled in per upload)."""

    RUN_ID = "@@RUN_ID@@"

    def __init__(self, doc: dict[str, Any]) -> None:
        params, metrics, self.tags = mlflow_entities(doc)
        self.name = doc.get("name") or "run"
        first = MLFLOW_BATCH - len(params)  # at most 1,000 metrics, params and tags in one request
        chunks = [metrics[:first]] + [metrics[i : i + MLFLOW_BATCH] for i in range(first, len(metrics), MLFLOW_BATCH)]
        self.batches = [
            json.dumps({"run_id": self.RUN_ID, "metrics": chunk, "params": params if i == 0 else []}) for i, chunk in enumerate(chunks)
        ]
        self.requests = 2 + len(self.batches)

    def upload(self, client: httpx.Client, experiment_id: str) -> int:
        created = client.post(
            "/api/2.0/mlflow/runs/create",
            json={"experiment_id": experiment_id, "run_name": self.name, "start_time": int(time.time() * 1000), "tags": self.tags},
        )
        created.raise_for_status()
        run_id = created.json()["run"]["info"]["run_id"]
        for body in self.batches:
            r = client.post(
                "/api/2.0/mlflow/runs/log-batch", content=body.replace(self.RUN_ID, run_id), headers={"Content-Type": "application/json"}
            )
            if r.status_code != 200:
                raise SystemExit(f"MLflow log-batch answered {r.status_code}: {r.text[:1000]}")
        finished = {"run_id": run_id, "status": "FINISHED", "end_time": int(time.time() * 1000)}
        done = client.post("/api/2.0/mlflow/runs/update", json=finished)
        done.raise_for_status()
        return 200


# ---- a phase: clients uploading back to back, a prober polling health ----


def probe(url: str, stop: Any, out: Any) -> None:
    """In its own process: GET `url` every 10 ms until `stop` is set; send the latencies (s)."""
    latencies: list[float] = []
    with httpx.Client(timeout=30) as client:
        client.get(url).raise_for_status()
        out.put("ready")
        while not stop.is_set():
            start = time.perf_counter()
            client.get(url).raise_for_status()
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    out.put(latencies)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def phase(
    *, base: str, health: str, clients: int, seconds: float, upload: Callable[[httpx.Client, int, int], int], headers: list[dict[str, str]]
) -> dict[str, float]:
    """`clients` threads upload back to back for `seconds`; health polled from another process meanwhile."""
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    prober = ctx.Process(target=probe, args=(base + health, stop, out), daemon=True)
    prober.start()
    if out.get(timeout=120) != "ready":  # the prober is polling before the first upload
        raise SystemExit("the health prober did not start")
    barrier = threading.Barrier(clients)
    results: list[list[tuple[float, float]]] = [[] for _ in range(clients)]
    began = 0.0

    def client_loop(i: int) -> None:
        nonlocal began
        with httpx.Client(base_url=base, timeout=300, headers=headers[i]) as client:
            if barrier.wait() == 0:
                began = time.perf_counter()
            deadline = time.perf_counter() + seconds
            j = 0
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                status = upload(client, i, j)
                if status not in (200, 201):
                    raise SystemExit(f"upload answered {status}")
                end = time.perf_counter()
                results[i].append((end - start, end))
                j += 1

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client_loop, range(clients)))
    stop.set()
    latencies = out.get(timeout=60)
    prober.join(timeout=30)
    done = [r for rs in results for r in rs]
    wall = max(end for _, end in done) - began
    return {
        "docs": len(done),
        "docs_per_s": len(done) / wall,
        "p50_ms": statistics.median(s for s, _ in done) * 1000,
        "health_p50_ms": quantile(latencies, 0.50) * 1000,
        "health_p99_ms": quantile(latencies, 0.99) * 1000,
        "health_max_ms": max(latencies) * 1000,
        "health_polls": len(latencies),
    }


# ---- the two servers ----


def mlflow_database(admin_url: str) -> tuple[str, Callable[[], None]]:
    name = f"mlflow_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(drivername="postgresql+psycopg2", database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def parse_cost(body: bytes, n: int = 20) -> dict[str, float]:
    """In this process, ms per document: the old parse (json.loads, then validate the dict) and
    the upload's parse now (pydantic-core reads and validates the bytes in one pass)."""
    from parallab.core.result import ResultDocument

    def per_call(call: Callable[[], object]) -> float:
        call()
        start = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - start) / n * 1000

    return {
        "loads_then_validate_ms": per_call(lambda: ResultDocument.model_validate(json.loads(body))),
        "validate_json_ms": per_call(lambda: ResultDocument.model_validate_json(body)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    docs = {kind: documents(kind, args.clients) for kind in KINDS}
    bodies = {kind: [json.dumps(d).encode() for d in ds] for kind, ds in docs.items()}
    parsing = {kind: parse_cost(bodies[kind][0]) for kind in KINDS}
    mlflow_docs = {kind: [MlflowDoc(d) for d in ds] for kind, ds in docs.items()}
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {kind: {"parallab": [], "mlflow": []} for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="parallab-ingest-") as tmp, scratch_database(args.url) as url:
        home = Path(tmp)
        mlflow_url, drop_mlflow = mlflow_database(args.url)
        try:
            p_port, m_port = free_port(), free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
            env.update(
                PARALLAB_HOME=str(home),
                PARALLAB_DATABASE_URL=url,
                PARALLAB_SECRET_KEY=secrets.token_urlsafe(32),
                PARALLAB_UPLOAD_RATE_PER_MINUTE="0",
                OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO),
            )
            if args.upload_concurrency:
                env["PARALLAB_UPLOAD_CONCURRENCY"] = str(args.upload_concurrency)
            if args.switch_interval_ms:
                env["PARALLAB_GIL_SWITCH_INTERVAL_MS"] = str(args.switch_interval_ms)
            if args.no_gc_freeze:
                env["PARALLAB_GC_FREEZE"] = "false"
            p_args = [sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", "127.0.0.1", "--port", str(p_port)]
            p_args += ["--workers", str(args.workers)]
            m_args = [
                args.mlflow_python,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                mlflow_url,
                "--default-artifact-root",
                str(home / "mlruns"),
                "--host",
                "127.0.0.1",
                "--port",
                str(m_port),
                "--workers",
                "1",
            ]
            m_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            logs = Path(args.logs) if args.logs else home
            logs.mkdir(parents=True, exist_ok=True)
            with contextlib.ExitStack() as servers:
                servers.enter_context(process([*p_args, "--log-level", "warning"], env, logs / "uvicorn.log"))
                if not args.parallab_only:
                    servers.enter_context(process(m_args, m_env, logs / "mlflow.log"))
                p_base, m_base = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{m_port}"
                wait_until(lambda: httpx.get(f"{p_base}/healthz", timeout=2).status_code == 200, 120, "parallab")
                if not args.parallab_only:
                    wait_until(lambda: httpx.get(f"{m_base}/health", timeout=2).status_code == 200, 300, "the MLflow server")
                with session_scope(url) as session:
                    tokens = [create_token(session=session, name=f"ingest-{i}", scopes=["upload"]) for i in range(args.clients)]
                p_headers = [{"Authorization": f"Bearer {t}", "Content-Type": "application/json"} for t in tokens]
                experiment_id = ""
                if not args.parallab_only:
                    experiment = httpx.post(f"{m_base}/api/2.0/mlflow/experiments/create", json={"name": f"ingest-{uuid.uuid4().hex[:8]}"})
                    experiment.raise_for_status()
                    experiment_id = experiment.json()["experiment_id"]
                for r in range(args.rounds):
                    for kind in args.kinds:

                        def p_upload(client: httpx.Client, i: int, j: int, kind: str = kind, r: int = r) -> int:
                            key = f"{kind}-{r}-{i}-{j}"
                            r = client.post("/api/v1/results", content=bodies[kind][i], headers={"Idempotency-Key": key})
                            if r.status_code not in (200, 201):
                                print(f"parallab answered {r.status_code}: {r.text[:2000]}", file=sys.stderr)
                            return r.status_code

                        def m_upload(client: httpx.Client, i: int, j: int, kind: str = kind) -> int:
                            return mlflow_docs[kind][i].upload(client, experiment_id)

                        common = {"clients": args.clients, "seconds": args.seconds}
                        p = phase(base=p_base, health="/healthz", upload=p_upload, headers=p_headers, **common)
                        rounds[kind]["parallab"].append(p)
                        if args.parallab_only:
                            print(f"round {r + 1} {kind}: parallab {p}", file=sys.stderr)
                            continue
                        m = phase(base=m_base, health="/health", upload=m_upload, headers=[{}] * args.clients, **common)
                        rounds[kind]["mlflow"].append(m)
                        print(f"round {r + 1} {kind}: parallab {p}\n{'':>10}mlflow {m}", file=sys.stderr)
        finally:
            drop_mlflow()
    cases: dict[str, Any] = {}
    for kind in args.kinds:
        p = median_of(rounds[kind]["parallab"])
        if args.parallab_only:
            cases[kind] = {"parallab": p, "parse": parsing[kind]}
            continue
        m = median_of(rounds[kind]["mlflow"])
        cases[kind] = {
            "parse": parsing[kind],
            "parallab": p,
            "mlflow": m,
            "ratio_docs_per_s": p["docs_per_s"] / m["docs_per_s"],
            "mlflow_requests_per_doc": mlflow_docs[kind][0].requests,
            "bytes_per_doc": len(bodies[kind][0]),
        }
    return {
        "clients": args.clients,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "workers": args.workers,
        "upload_concurrency": args.upload_concurrency,
        "switch_interval_ms": args.switch_interval_ms,
        "gc_freeze": not args.no_gc_freeze,
        "cases": cases,
    }


def report(result: dict[str, Any], command: str) -> str:
    rows = []
    for kind, c in result["cases"].items():
        p, m = c["parallab"], c["mlflow"]
        shape = KINDS[kind]
        what = f"{kind} ({shape['strategy']} × {shape['world_size']} ranks, {shape['steps']} steps, {c['bytes_per_doc'] / 1024:.0f} KiB)"
        rows.append(
            f"| {what} | {p['docs_per_s']:.1f} | {p['p50_ms']:.0f} ms | {m['docs_per_s']:.2f} | {m['p50_ms']:.0f} ms "
            f"({c['mlflow_requests_per_doc']} requests) | **{c['ratio_docs_per_s']:.1f}×** | "
            f"{p['health_p50_ms']:.1f} / {p['health_p99_ms']:.1f} / {p['health_max_ms']:.0f} ms | "
            f"{m['health_p50_ms']:.1f} / {m['health_p99_ms']:.1f} ms |"
        )
    parse = "; ".join(
        f"{kind} {c['parse']['loads_then_validate_ms']:.2f} → {c['parse']['validate_json_ms']:.2f} ms"
        for kind, c in result["cases"].items()
    )
    target = "; ".join(
        f"{kind} {'met' if c['parallab']['health_p99_ms'] < 50 else 'not met'} ({c['parallab']['health_p99_ms']:.0f} ms)"
        for kind, c in result["cases"].items()
    )
    cpu = platform.processor() or platform.machine()
    return f"""
Measured by `{command}` on this machine ({os.cpu_count()} CPU cores, {cpu}, Python {platform.python_version()}),
{result["clients"]} concurrent clients, {result["seconds"]:.0f} s phases taking turns (parallab, MLflow, per kind), median of
{result["rounds"]} rounds. parallab runs {result["workers"]} uvicorn process(es), MLflow one, on 127.0.0.1,
each with its own Postgres database on 127.0.0.1;
MLflow gets each document as `runs/create`, `runs/log-batch` (≤ 1,000 metrics each) and `runs/update`.
Health latency is polled every 10 ms by a separate process while the uploads run.

| document | parallab docs/s | parallab p50 | MLflow docs/s | MLflow p50 | ratio | `/healthz` p50 / p99 / max | MLflow `/health` p50 / p99 |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Uploads parse, check and store in a bounded pool of `PARALLAB_UPLOAD_CONCURRENCY` threads
({result["upload_concurrency"] or 2} here) beside the event loop (issue #12), so `/healthz` waits for at most that many
CPU-bound threads, and answers on the loop itself. The API process hands the GIL over every
{result["switch_interval_ms"] or 0.5:g} ms (`PARALLAB_GIL_SWITCH_INTERVAL_MS`; Python's default is 5) and
{"freezes" if result["gc_freeze"] else "does not freeze"} its start-up objects (`PARALLAB_GC_FREEZE`): unfrozen, each
full collection walks them in one GIL hold (over 100 ms with the app loaded: `benchmarks/ingest_stalls.py`), the spikes behind the old p99.
Parsing a document, per document in this process, `json.loads` then validating the dict (before) → pydantic-core
reading and validating the bytes in one pass (now): {parse}. Target `/healthz` p99 < 50 ms during uploads: {target}.
The p99 moves between rounds (the rounds' values are printed on stderr).
The 2-core machine is shared by both
servers, Postgres and the client, and by other work on it: compare the two columns of one run, not runs on different days.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each phase.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mlflow-python", default=sys.executable, help="A python with mlflow (and psycopg2) installed.")
    parser.add_argument("--upload-concurrency", type=int, default=None, help="PARALLAB_UPLOAD_CONCURRENCY for the server.")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn --workers for parallab (compose deploys 2).")
    parser.add_argument("--switch-interval-ms", type=float, default=None, help="PARALLAB_GIL_SWITCH_INTERVAL_MS for the server.")
    parser.add_argument("--no-gc-freeze", action="store_true", help="PARALLAB_GC_FREEZE=false for the server.")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="Which documents.")
    parser.add_argument("--parallab-only", action="store_true", help="Skip MLflow's turns (to tune parallab alone; writes nothing).")
    parser.add_argument("--logs", default=None, help="Keep the two servers' logs in this directory.")
    parser.add_argument("--json", action="store_true", help="Print one JSON line.")
    parser.add_argument("--no-write", action="store_true", help="Leave BENCHMARKS.md alone.")
    args = parser.parse_args()
    if not args.parallab_only and subprocess.run([args.mlflow_python, "-c", "import mlflow"], capture_output=True).returncode:
        raise SystemExit(f"{args.mlflow_python} has no mlflow: pip install -e '.[bench]' (or pass --mlflow-python)")
    result = run(args)
    command = f"python benchmarks/ingest.py --clients {args.clients} --seconds {args.seconds:g} --rounds {args.rounds}"
    command += f" --workers {args.workers}"
    if args.upload_concurrency:
        command += f" --upload-concurrency {args.upload_concurrency}"
    if args.switch_interval_ms:
        command += f" --switch-interval-ms {args.switch_interval_ms:g}"
    if args.no_gc_freeze:
        command += " --no-gc-freeze"
    if args.json or args.parallab_only:
        print(json.dumps(result))
    else:
        print(report(result, command))
    if not args.no_write and not args.parallab_only:
        write_section(HEADING, report(result, command))


if __name__ == "__main__":
    main()
