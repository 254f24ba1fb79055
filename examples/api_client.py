"""A parallab API client in plain httpx: submit two strategies, wait for both, fetch their
results, compare them.

    python examples/api_client.py --server http://127.0.0.1:8000 --strategies ddp,fsdp --world-size 2

Outside local mode, pass a token with scope `submit` (`parallab token create --user you@lab.org
--scope submit`) as --token or in PARALLAB_TOKEN. Every call is a plain HTTP request; the REST
reference is the server's own /docs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import httpx

FINISHED = {"succeeded", "failed", "cancelled"}


def submit(client: httpx.Client, *, strategy: str, world_size: int, model: str, steps: int) -> str:
    """POST /api/v1/runs with a job spec; the answer (202) is the queued run."""
    spec = {"workload": {"model": model, "steps": steps}, "strategy": {"name": strategy, "world_size": world_size}}
    response = client.post("/api/v1/runs", json=spec)
    if response.status_code == 422:  # the spec was refused: the detail names the field at fault
        raise SystemExit(f"{strategy}: refused: {response.json()['detail']}")
    response.raise_for_status()
    return str(response.json()["id"])


def wait(client: httpx.Client, run_id: str, *, timeout_s: float, poll_s: float = 2.0) -> dict[str, Any]:
    """GET /api/v1/runs/{id} until the run has finished; the run, with its result document."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.get(f"/api/v1/runs/{run_id}").raise_for_status().json()
        if run["status"] in FINISHED:
            return dict(run)
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} still {run['status']} after {timeout_s:.0f} s")
        progress = run.get("progress") or {}
        print(f"  {run_id[:8]} {run['status']} {progress.get('phase', '')} {progress.get('step', '')}", file=sys.stderr)
        time.sleep(poll_s)


def compare(client: httpx.Client, run_ids: list[str]) -> dict[str, Any]:
    """GET /api/v1/compare?ids=a,b: every metric side by side, relative to the first run."""
    return dict(client.get("/api/v1/compare", params={"ids": ",".join(run_ids)}).raise_for_status().json())


def binary_bytes(n: float | None) -> str:
    """Byte counts in binary units, as parallab shows them everywhere."""
    if n is None:
        return "—"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default=os.environ.get("PARALLAB_TOKEN"))
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=args.server, headers=headers, timeout=30) as client:
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
        ids = [submit(client, strategy=s, world_size=args.world_size, model=args.model, steps=args.steps) for s in strategies]
        print(f"submitted {', '.join(f'{s} → {i}' for s, i in zip(strategies, ids, strict=True))}", file=sys.stderr)
        runs = [wait(client, i, timeout_s=args.timeout) for i in ids]
        failed = [r for r in runs if r["status"] != "succeeded"]
        for r in failed:
            print(f"{r['id']} {r['status']}: {(r.get('error') or '').splitlines()[:1]}", file=sys.stderr)

        print(f"{'run':<10} {'strategy':<8} {'tokens/s':>10} {'step (median)':>14} {'peak memory':>12}")
        for strategy, run in zip(strategies, runs, strict=True):
            summary = (run.get("result") or {}).get("summary") or {}
            step = (summary.get("step_time_s") or {}).get("median")
            tps = summary.get("tokens_per_s")
            print(
                f"{run['id'][:8]:<10} {strategy:<8} {tps or 0:>10,.0f} {(step or 0) * 1e3:>11.1f} ms "
                f"{binary_bytes(summary.get('peak_allocated_bytes_max')):>12}"
            )
        if not failed:
            comparison = compare(client, ids)
            tokens = next(m for m in comparison["metrics"] if m["key"] == "tokens_per_s")
            rel = tokens["relative_to_baseline"][-1]
            print(f"{strategies[-1]} against {strategies[0]}: tokens/s {rel * 100:+.1f}%" if rel is not None else "no relative value")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
