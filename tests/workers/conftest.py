"""Fixtures for the worker tests: launch real torchrun jobs (gloo, CPU) and read their results.

`harness_job` resolves a job once, runs it through the real launcher (which writes the frozen job
to the run directory for the ranks) and returns (result document, run dir); jobs are memoised for
the session, so tests that assert different things about the same job share one launch.
`harness_jobs` runs a list of jobs, those of one world size in one launch (jobs_driver.py: each
rank imports the harness once, not once a job), into the same memo. The files of the `tiny-runs`
group (tests/conftest.py) declare the folded jobs they read (`HARNESS_JOBS`); the first miss on
one of them launches every declared job of its world size that this session will read, whichever
file comes first, so the group's 2-rank jobs go in one launch and its 4-rank ones in another. All jobs
share a reference cache directory, so the `single` curve of a workload is computed in the first
job that needs it (in-job path) and read from the cache after (cache path).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.config import ServerSettings
from parallab.core.families.module import ALLOW_LIST_ENV
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.result import ResultDocument
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from tests.conftest import THROUGHPUT, TINY_RUNS
from tests.workers.declared import fake_tp_group
from workers.aggregate import build_result, read_rank_records
from workers.launcher import launch

REPO = Path(__file__).resolve().parents[2]
# tiny, a few steps: seconds on 2 cores. lr 1e-2 so the curve moves enough for the comparison to bite.
TEST_WORKLOAD: dict[str, Any] = {"model": "tiny", "steps": 3, "warmup_steps": 1, "lr": 1e-2, "seed": 0}


def _builds(path: Path) -> list[str]:
    """The public functions a module file defines (read, not imported: it imports torch)."""
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]


TEST_ALLOWED_MODULES = frozenset(
    {
        "examples.lab_model:build",
        "tests.workers.lab_builds:no_such_function",  # listed, yet not there: the rank says so
        *(f"tests.workers.lab_builds:{name}" for name in _builds(Path(__file__).with_name("lab_builds.py"))),
    }
)
"""The entry points these tests put on the allow-list: the shipped example and each wrong build."""
TRACE_CAP_BYTES: int = ServerSettings.model_fields["max_trace_bytes"].default
"""The worker's default cap on a stored trace."""


def torchrun_env() -> dict[str, str]:
    env = dict(os.environ)
    env[ALLOW_LIST_ENV] = ",".join(sorted(TEST_ALLOWED_MODULES))  # what an engine hands its ranks
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def torchrun(nproc: int, args: list[str], *, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=REPO, env=torchrun_env(), capture_output=True, text=True, check=False, timeout=timeout)


def run_driver(tmp_path_factory: pytest.TempPathFactory, driver: str, *, nproc: int = 2, timeout: float = 400) -> Any:
    """Run the test driver `driver` (a script beside this file) under torchrun on `nproc` ranks and
    return the JSON it wrote to `--out`; a failed launch fails the fixture with the ranks' stderr."""
    import json

    out = tmp_path_factory.mktemp(Path(driver).stem) / "results.json"
    proc = torchrun(nproc, [str(Path(__file__).with_name(driver)), "--out", str(out)], timeout=timeout)
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def make_job(
    strategy: str,
    world_size: int,
    options: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    *,
    trace: bool = True,
) -> ResolvedJob:
    """The test workload with `workload` on top, resolved once as the API would."""
    spec = JobSpec.model_validate(
        {
            "workload": {**TEST_WORKLOAD, **(workload or {})},
            "strategy": {"name": strategy, "world_size": world_size, "options": options or {}},
            "trace": trace,
        }
    )
    return resolve_job(spec, Limits(max_world_size=max(world_size, 8), allowed_modules=TEST_ALLOWED_MODULES))


def run_job(job: ResolvedJob, run_dir: Path, *, cache_dir: Path | None, trace_cap_bytes: int = TRACE_CAP_BYTES) -> ResultDocument:
    """Launch `job` as the worker does and merge its ranks' records."""
    files = RunDir(run_dir)
    outcome = launch(job, files, timeout_s=600, trace_cap_bytes=trace_cap_bytes, cache_dir=cache_dir, allowed_modules=TEST_ALLOWED_MODULES)
    assert outcome.ok, f"torchrun failed ({outcome.reason}):\n{outcome.log_tail}"
    return build_result(job, read_rank_records(files, job.world_size))


@pytest.fixture(scope="module")
def fake_tp_mesh() -> Iterator[Any]:
    """Two tensor-parallel ranks in this process on torch's fake process group (the 1-D "tp" mesh)."""
    with fake_tp_group() as mesh:
        yield mesh


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference-cache")


Launched = tuple[ResultDocument, Path]
"""A harness job's result document and its run directory."""


def run_jobs_together(jobs: list[ResolvedJob], run_dirs: list[Path], *, cache_dir: Path, trace_cap_bytes: int) -> list[ResultDocument]:
    """Several jobs of one world size in one torchrun of jobs_driver.py (the harness's own
    `run_training` for each, in turn) and each job's ranks' records merged as the worker merges
    them: one agent and one import of the harness a rank, however many jobs."""
    (world,) = {job.world_size for job in jobs}
    files = [RunDir(d).create() for d in run_dirs]
    for job, run_dir in zip(jobs, files, strict=True):
        run_dir.write_atomic(run_dir.job, job.model_dump_json(indent=2).encode())
    args = ["--runs", *map(str, run_dirs), "--cache-dir", str(cache_dir), "--trace-cap-bytes", str(trace_cap_bytes)]
    proc = torchrun(world, [str(Path(__file__).with_name("jobs_driver.py")), *args], timeout=1500)
    assert proc.returncode == 0, f"jobs driver failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return [build_result(job, read_rank_records(f, world)) for job, f in zip(jobs, files, strict=True)]


HarnessSpec = tuple[str, int, dict[str, Any], dict[str, Any]] | tuple[str, int, dict[str, Any], dict[str, Any], bool]
"""(strategy, world size, options, workload[, traced]): one job `harness_jobs` folds (traced unless said)."""


def _spec_job(spec: HarnessSpec, *, trace: bool = True) -> ResolvedJob:
    """The spec's job, traced as its fifth item says, else as `trace` does."""
    name, n, options, workload, *traced = spec
    return make_job(name, n, options, workload, trace=traced[0] if traced else trace)


@pytest.fixture(scope="session")
def declared_jobs(request: pytest.FixtureRequest) -> dict[tuple[str, int], ResolvedJob]:
    """The folded jobs the collected files of the `tiny-runs` group declare (`HARNESS_JOBS`), by
    `harness_runs` key: what the group reads from `harness_job`, known before any test asks. Only
    that group's files count (an xdist worker collects every file, and runs the group's all)."""
    modules = {
        item.module for item in request.session.items if item.nodeid.split("::", 1)[0] in TINY_RUNS and getattr(item, "module", None)
    }
    jobs = (_spec_job(spec) for module in sorted(modules, key=lambda m: m.__name__) for spec in getattr(module, "HARNESS_JOBS", ()))
    return {_key(job, TRACE_CAP_BYTES): job for job in jobs}


def _key(job: ResolvedJob, trace_cap_bytes: int) -> tuple[str, int]:
    return job.model_dump_json(), trace_cap_bytes


@pytest.fixture(scope="session")
def harness_runs() -> dict[tuple[str, int], Launched]:
    """Every harness job this session ran, by (job, trace cap): what `harness_job` and
    `harness_jobs` share, so a job either asked for is launched once."""
    return {}


@pytest.fixture(scope="session")
def harness_job(
    tmp_path_factory: pytest.TempPathFactory,
    reference_cache: Path,
    harness_runs: dict[tuple[str, int], Launched],
    harness_jobs: Callable[[list[HarnessSpec]], list[Launched]],
) -> Callable[..., Launched]:
    """One job, launched once a session: a declared one (`declared_jobs`) with the rest of its world
    size through `harness_jobs`, any other alone through the worker's launcher."""

    def run(
        strategy: str,
        world_size: int,
        options: dict[str, Any] | None = None,
        workload: dict[str, Any] | None = None,
        *,
        trace: bool = True,
        trace_cap_bytes: int = TRACE_CAP_BYTES,
    ) -> Launched:
        if trace_cap_bytes == TRACE_CAP_BYTES:
            (launched,) = harness_jobs([(strategy, world_size, options or {}, workload or {}, trace)])
            return launched
        job = make_job(strategy, world_size, options, workload, trace=trace)
        key = _key(job, trace_cap_bytes)
        if key not in harness_runs:
            run_dir = tmp_path_factory.mktemp(f"{strategy}{world_size}")
            doc = run_job(job, run_dir, cache_dir=reference_cache, trace_cap_bytes=trace_cap_bytes)
            harness_runs[key] = (doc, run_dir)
            _note_throughput(job, doc)
        return harness_runs[key]

    return run


@pytest.fixture(scope="session")
def harness_jobs(
    tmp_path_factory: pytest.TempPathFactory,
    reference_cache: Path,
    harness_runs: dict[tuple[str, int], Launched],
    declared_jobs: dict[tuple[str, int], ResolvedJob],
) -> Callable[..., list[Launched]]:
    """`harness_job` for a list of (strategy, world size, options, workload[, traced]) at the
    default trace cap, traced unless the spec or `trace=False` says not (a test that reads no
    profiled step spares each job its profiled window): the ones not yet run go in one launch per world size (`run_jobs_together`),
    with every declared job of that world size not yet run when one of them is asked for; a job
    alone in its world size goes through the worker's own launcher. All are memoised with
    `harness_job`'s."""

    def run(specs: list[HarnessSpec], *, trace: bool = True) -> list[Launched]:
        jobs = [_spec_job(spec, trace=trace) for spec in specs]
        keys = [_key(job, TRACE_CAP_BYTES) for job in jobs]
        todo = {key: job for key, job in zip(keys, jobs, strict=True) if key not in harness_runs}
        for world in sorted({job.world_size for job in todo.values()}):
            if any(key in declared_jobs for key, job in todo.items() if job.world_size == world):
                todo.update((key, job) for key, job in declared_jobs.items() if job.world_size == world and key not in harness_runs)
            batch = [(key, job) for key, job in todo.items() if job.world_size == world]
            dirs = [tmp_path_factory.mktemp(f"{job.strategy}{world}") for _, job in batch]
            if len(batch) == 1:  # alone: through the worker's own launcher
                docs = [run_job(batch[0][1], dirs[0], cache_dir=reference_cache)]
            else:
                docs = run_jobs_together([job for _, job in batch], dirs, cache_dir=reference_cache, trace_cap_bytes=TRACE_CAP_BYTES)
            for (key, job), doc, run_dir in zip(batch, docs, dirs, strict=True):
                harness_runs[key] = (doc, run_dir)
                _note_throughput(job, doc)
        return [harness_runs[key] for key in keys]

    return run


def _note_throughput(job: ResolvedJob, doc: ResultDocument) -> None:
    THROUGHPUT.append((job.strategy, job.world_size, job.strategy_document()["options"], job.workload_document(), doc.summary.tokens_per_s))


@pytest.fixture(scope="session")
def ring_moe_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    """One 4-rank torchrun of ring_moe_driver.py: ring attention and EP MoE cases at n=4 and n=2."""
    results: dict[str, dict[str, float]] = run_driver(tmp_path_factory, "ring_moe_driver.py", nproc=4)
    return results
