"""Fixtures for the worker tests: launch real torchrun jobs (gloo, CPU) and read their results.

`harness_job` runs one job through the real entry point and returns (result document, run dir);
jobs are memoised for the session, so tests that assert different things about the same job share
one launch. All jobs share a reference cache directory, so the `single` curve of a workload is
computed in the first job that needs it (in-job path) and read from the cache after (cache path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from backend.schemas.result import ResultDocument
from backend.schemas.spec import JobSpec
from backend.services.validation import resolve_job
from workers.aggregate import build_result, read_rank_records

REPO = Path(__file__).resolve().parents[2]
THROUGHPUT: list[tuple[str, int, dict[str, Any], dict[str, Any], float]] = []
"""(strategy, world size, options, workload, tokens/s) of every job this session launched."""
# tiny, a few steps: seconds on 2 cores. lr 1e-2 so the curve moves enough for the comparison to bite.
TEST_WORKLOAD: dict[str, Any] = {"model": "tiny", "steps": 3, "warmup_steps": 1, "lr": 1e-2, "seed": 0}


def torchrun_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def torchrun(nproc: int, args: list[str], *, timeout: float = 400) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=REPO, env=torchrun_env(), capture_output=True, text=True, timeout=timeout)


def make_spec(strategy: str, world_size: int, options: dict[str, Any] | None = None, workload: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = JobSpec.model_validate({"workload": {**TEST_WORKLOAD, **(workload or {})}, "strategy": {"name": strategy, "world_size": world_size, "options": options or {}}})
    return resolve_job(spec, max_world_size=world_size).to_spec_dict()


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference-cache")


@pytest.fixture(scope="session")
def harness_job(tmp_path_factory: pytest.TempPathFactory, reference_cache: Path) -> Callable[..., tuple[ResultDocument, Path]]:
    done: dict[str, tuple[ResultDocument, Path]] = {}

    def run(strategy: str, world_size: int, options: dict[str, Any] | None = None, workload: dict[str, Any] | None = None) -> tuple[ResultDocument, Path]:
        spec = make_spec(strategy, world_size, options, workload)
        key = json.dumps(spec, sort_keys=True)
        if key not in done:
            run_dir = tmp_path_factory.mktemp(f"{strategy}{world_size}")
            (run_dir / "spec.json").write_text(json.dumps(spec))
            proc = torchrun(world_size, ["-m", "workers.harness.main", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir), "--cache-dir", str(reference_cache)])
            assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
            job = resolve_job(JobSpec.model_validate(spec), max_world_size=world_size)
            done[key] = (build_result(job, read_rank_records(run_dir, world_size)), run_dir)
            THROUGHPUT.append((strategy, world_size, spec["strategy"]["options"], spec["workload"], done[key][0].summary.tokens_per_s))
        return done[key]

    return run


@pytest.fixture(scope="session")
def ring_moe_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    """One 4-rank torchrun of ring_moe_driver.py: ring attention and EP MoE cases at n=4 and n=2."""
    out = tmp_path_factory.mktemp("ring-moe") / "results.json"
    proc = torchrun(4, [str(Path(__file__).with_name("ring_moe_driver.py")), "--out", str(out)])
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """tokens/s of each harness job (noisy on a shared 2-core machine: a figure, never asserted)."""
    if not THROUGHPUT:
        return
    terminalreporter.section("harness jobs: tokens/s (tiny)")
    for name, n, options, workload, tps in THROUGHPUT:
        recipe = {k: workload[k] for k in ("precision", "activation_checkpointing", "grad_accumulation_steps") if workload.get(k) not in ("fp32", "none", 1)}
        terminalreporter.write_line(f"{name:<12} N={n}  {tps:10.0f}  {options} {recipe or ''}")
