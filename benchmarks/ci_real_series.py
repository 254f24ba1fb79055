"""A real CI series on this machine, uploaded through a running server: `--jobs` jobs of one config, a code change planted at job `--plant`.

    python benchmarks/ci_real_series.py --dir /tmp/series [--jobs 32] [--plant 20] [--steps 5] [--extra 3]

What CI does, job by job: the lab's model file at that commit, `parallab bench` (its own
torchrun, tiny shape, ddp × 2, the `module` family with the entry point `ci_lab:build`), then
`parallab upload` of the result to a parallab server (uvicorn on a loopback port, a scratch
Postgres database, local mode off) with an upload token — the REST API, not the database.

The planted change is a real change of the lab's code, the same file and entry point (so the same
configuration and series): from job `--plant` on, each block's forward runs its MLP `--extra`
more times under no_grad (a per-step diagnostic someone left in), which costs compute and
nothing else — no parameter, collective or saved activation changes. Sized on this machine
(`--extra 3`: about +25–30 % step time in one process, −20 % tokens/s expected with the
all-reduce beside it).

Then the server's verdict: `parallab ci report` (Markdown and JSON) of the series — change
points over tokens/s with where they fall and their sizes, the between-job CV and the minimum
detectable change it reports — and the exact counters of each job against the one before (any
change before the plant is a false alarm; the plant should change none). Results already in
`--dir` are kept (an interrupted series goes on; jobs are uploaded again, the server's
Idempotency-Key makes that a replay).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from parallab.core.counters import counters, diff  # noqa: E402

ENTRY = "ci_lab:build"
BEFORE = '''"""The lab's model at the commits before the change: the example decoder as it is."""

from examples.lab_model import build

__all__ = ["build"]
'''
AFTER = '''"""The lab's model after the change: each block also runs its MLP {extra} more times under no_grad (a diagnostic left in)."""

from typing import Any

import torch

from examples.lab_model import build as _build


def _diagnostic(block: Any, _inputs: Any, output: torch.Tensor) -> None:
    with torch.no_grad():
        for _ in range({extra}):
            block.mlp(block.ln2(output))


def _gain(norm: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * norm.gain


def build(cfg: Any) -> Any:
    model, spec = _build(cfg)
    for block in model.blocks.values():
        block.register_forward_hook(_diagnostic)
    if {gain}:  # a later commit: a learned gain after the final norm (one more parameter of width h, one more all-reduced gradient)
        model.norm.gain = torch.nn.Parameter(torch.ones(cfg.hidden_size))
        model.norm.register_forward_hook(_gain)
        spec = {{**spec, "params": spec["params"] + cfg.hidden_size}}
    return model, spec
'''
ADMIN = "ci-admin@lab.org"
EXIT_CHANGE = 4
"""`parallab upload --fail-on-change`'s exit when an exact counter changed."""


def sh(args: Sequence[str], env: dict[str, str], *, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "parallab", *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode not in (0,):
        raise SystemExit(f"parallab {' '.join(args[:2])} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scratch_database(name: str) -> str:
    import sqlalchemy

    admin = sqlalchemy.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.execute(sqlalchemy.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first():
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def start_server(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.3)


def load_average() -> float:
    """The 1-minute load average (the machine's load is part of what a timing measured)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


TIMING_FIELDS = ("metric", "jobs", "status", "judged_on", "cv", "mdc_pct", "mdc_single_pct", "change_points")


def timing_summary(t: dict[str, Any]) -> dict[str, Any]:
    """One timing metric of the report, raw and (where the jobs carry the probe) normalised by the host's speed."""
    out = {k: t.get(k) for k in TIMING_FIELDS}
    if t.get("normalised"):
        out["normalised"] = {k: t["normalised"].get(k) for k in TIMING_FIELDS}
    return out


def commit_of(i: int) -> str:
    return f"{i + 1:04x}" + "c1" * 18


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--plant", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--extra", type=int, default=3)
    parser.add_argument(
        "--exact-plant", type=int, default=None, help="From this job on, the model also gains a parameter (an exact change)."
    )
    parser.add_argument("--database", default="parallab_ci_real_series")
    args = parser.parse_args(argv)
    work = args.dir.resolve()
    (work / "lab").mkdir(parents=True, exist_ok=True)
    home = work / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PARALLAB_", "GITHUB_", "CI_", "GITLAB_"))}
    env = {
        **base,
        "PYTHONPATH": f"{REPO}{os.pathsep}{work / 'lab'}",
        "PARALLAB_DATABASE_URL": scratch_database(args.database),
        "PARALLAB_HOME": str(home),
        "PARALLAB_HOST": "127.0.0.1",
        "PARALLAB_ALLOW_LOCAL_MODE": "false",
        "PARALLAB_SECRET_KEY": "ci-real-series",
        "PARALLAB_ALLOWED_MODULES": ENTRY,
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    sh(["db", "upgrade"], env)
    token_file = work / "token"
    if not token_file.exists():
        sh(["user", "create", ADMIN, "--admin", "--password-stdin"], env, stdin="ci-admin-password-1\n")
        made = sh(["token", "create", "--user", ADMIN, "--scope", "upload", "--name", "ci"], env)
        token_file.write_text(re.search(r"plb_\S+", made.stdout).group(0))  # type: ignore[union-attr]
    token = token_file.read_text().strip()
    proc, url = start_server(env, work / "server.log")
    try:
        paths = [work / f"job{i:03d}.json" for i in range(args.jobs)]
        series_file = work / "series.txt"
        exits: dict[int, int] = {}
        loads: dict[int, tuple[float, float]] = {}
        for i, path in enumerate(paths):
            gain = args.exact_plant is not None and i >= args.exact_plant
            (work / "lab" / "ci_lab.py").write_text(BEFORE if i < args.plant else AFTER.format(extra=args.extra, gain=gain))
            if not path.exists():
                before = load_average()
                bench = ["bench", "--family", "module", "--module", ENTRY, "--model", "tiny", "--strategy", "ddp", "--world-size", "2"]
                sh([*bench, "--steps", str(args.steps), "--out", str(path), "--run-dir", str(work / f"run{i:03d}")], env)
                loads[i] = (before, load_average())
            up = ["upload", str(path), "--server", url, "--token", token, "--repository", "lab/ci-series", "--branch", "main"]
            up += ["--commit", commit_of(i), "--series-file", str(series_file), "--fail-on-change", "all"]
            done = subprocess.run([sys.executable, "-m", "parallab", *up], capture_output=True, text=True, env=env, timeout=600)
            if done.returncode not in (0, EXIT_CHANGE):
                raise SystemExit(f"parallab upload exited {done.returncode}: {done.stderr[-2000:]}")
            exits[i] = done.returncode
            value = json.loads(path.read_text())["summary"]["tokens_per_s"]
            print(f"job {i} ({'after' if i >= args.plant else 'before'}): {value:,.0f} tokens/s, upload exit {done.returncode}", flush=True)
        sid = series_file.read_text().split()[0]
        markdown = sh(["ci", "report", sid, "--server", url, "--token", token], env).stdout
        report = json.loads(sh(["ci", "report", sid, "--server", url, "--token", token, "--json"], env).stdout)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    docs = [json.loads(p.read_text()) for p in paths]
    values = [d["summary"]["tokens_per_s"] for d in docs]
    changed = {i: [c.counter for c in diff(counters(docs[i - 1]), counters(docs[i]))] for i in range(1, len(docs))}
    timing = report["timing"]
    summary: dict[str, Any] = {
        "series": sid,
        "jobs": len(docs),
        "planted_at": args.plant,
        "planted_commit": commit_of(args.plant),
        "counters": len(counters(docs[0])),
        "exact_changes": {i: c for i, c in changed.items() if c},
        "exact_plant": args.exact_plant,
        "upload_exit_4": [i for i, code in exits.items() if code == EXIT_CHANGE],
        "mean_before": sum(values[: args.plant]) / args.plant,
        "mean_after": sum(values[args.plant :]) / max(1, len(values) - args.plant),
        "values": [round(v) for v in values],
        "timing": [timing_summary(t) for t in timing],
        "load_average": {i: loads[i] for i in sorted(loads)},
        "changed": report["changed"],
    }
    (work / "report.md").write_text(markdown)
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print(markdown)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
