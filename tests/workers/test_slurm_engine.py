"""The Slurm engine's pieces: Slurm's states as a run's, the batch script and sbatch's options,
and, against the test Slurm, what Slurm refuses and what it no longer knows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from parallab.core.jobs import Limits, resolve_job
from parallab.core.pools import SlurmPool
from parallab.core.spec import JobSpec
from workers.engines.base import LaunchRefused
from workers.engines.slurm import SlurmEngine, SlurmHandle, map_state

RUN_ID = "ab" * 16


def engine(tmp_path: Path, **fields: object) -> SlurmEngine:
    pool = SlurmPool.model_validate({"python": sys.executable, "run_root": str(tmp_path / "shared"), **fields})
    return SlurmEngine("gpu-slurm", pool, max_job_seconds=150, trace_cap_bytes=1000)


def job(nodes: int = 2, world_size: int = 4):
    spec = {
        "workload": {"model": "tiny", "steps": 2},
        "strategy": {"name": "ddp", "world_size": world_size},
        "placement": {"pool": "gpu-slurm", "nodes": nodes},
    }
    return resolve_job(JobSpec.model_validate(spec), Limits(max_world_size=8))


@pytest.mark.parametrize(
    ("state", "reason", "status", "words"),
    [
        ("PENDING", "Resources", "queued", "PENDING (Resources)"),
        ("PENDING", "Priority", "queued", "PENDING (Priority)"),
        ("RUNNING", None, "running", "RUNNING"),
        ("COMPLETING", None, "running", "COMPLETING"),
        ("COMPLETED", None, "succeeded", "COMPLETED"),
        ("FAILED", "NonZeroExitCode", "failed", "FAILED: a task exited non-zero"),
        ("NODE_FAIL", None, "failed", "NODE_FAIL: a node it ran on failed"),
        ("OUT_OF_MEMORY", None, "failed", "OUT_OF_MEMORY: it ran out of memory"),
        ("TIMEOUT", None, "failed", "TIMEOUT: it ran past its time limit (1:00)"),
        ("CANCELLED by 0", None, "cancelled", "CANCELLED"),
        ("CANCELLED+", None, "cancelled", "CANCELLED"),
    ],
)
def test_slurm_states_map_onto_a_runs_with_their_reason(state: str, reason: str | None, status: str, words: str) -> None:
    mapped = map_state("42", state, reason, time_limit="1:00")
    assert mapped.status == status
    assert mapped.reason is not None and mapped.reason.startswith(f"Slurm job 42 {words}")


def test_the_batch_script_runs_srun_torchrun_over_every_node_meeting_at_the_first(tmp_path: Path) -> None:
    script = engine(tmp_path, python="/cluster/envs/parallab/bin/python").batch_script(job(), RUN_ID)
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert '--nnodes "$SLURM_NNODES"' in srun and "--nproc-per-node 2" in srun
    assert "--rdzv-backend c10d" in srun and '--rdzv-endpoint "$head:$port"' in srun and f"--rdzv-id {RUN_ID}" in srun
    assert f"-m workers.harness.main --job {tmp_path}/shared/{RUN_ID}/job.json" in srun
    assert srun.split()[3:6] == ["/cluster/envs/parallab/bin/python", "-m", "torch.distributed.run"]  # the pool's Python
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    # The first node's load around the srun, as a worker samples its host; neither command can fail the job.
    lines = script.splitlines()
    at = lines.index(srun)
    noise = "/cluster/envs/parallab/bin/python -m workers.noise"
    assert lines[at - 1] == f"{noise} start {tmp_path}/shared/{RUN_ID}/.noise-start.json --ranks 2 || true"
    assert lines[at + 1] == f"{noise} stop {tmp_path}/shared/{RUN_ID}/.noise-start.json --out {tmp_path}/shared/{RUN_ID}/noise.json || true"


def test_sbatch_carries_the_pools_settings(tmp_path: Path) -> None:
    args = engine(tmp_path, partition="a100", account="lab", qos="high", gpus_per_node=4, time_limit="02:00:00").sbatch_args(job(), RUN_ID)
    assert {"--partition=a100", "--account=lab", "--qos=high", "--gpus-per-node=4", "--time=02:00:00", "--nodes=2"} <= set(args)
    assert f"--job-name=parallab-{RUN_ID}" in args and "--comment=parallab:pool=gpu-slurm" in args
    assert f"--output={tmp_path}/shared/{RUN_ID}/torchrun.log" in args
    plain = engine(tmp_path).sbatch_args(job(), RUN_ID)
    assert "--time=3" in plain  # no time limit of its own: the deployment's job limit, in whole minutes
    assert not any(a.startswith(("--partition", "--account", "--qos", "--gpus")) for a in plain)


@pytest.mark.parametrize(
    ("field", "value"),
    [("time_limit", "an hour"), ("python", "venv/bin/python"), ("partition", "a b"), ("gpus_per_node", -1)],
)
def test_a_bad_pool_setting_is_refused_naming_the_field(tmp_path: Path, field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        SlurmPool.model_validate({"python": "/usr/bin/python3", "run_root": "/shared", field: value})
    assert info.value.errors()[0]["loc"] == (field,)


def test_slurm_refuses_an_unknown_partition_in_its_own_words(tmp_path: Path, slurm_conf: str) -> None:
    with pytest.raises(LaunchRefused, match="(?i)invalid partition"):
        engine(tmp_path, partition="no-such-partition").launch(job(nodes=1, world_size=2), RUN_ID)


def test_a_job_slurm_does_not_know_has_vanished(tmp_path: Path, slurm_conf: str) -> None:
    state = engine(tmp_path).state(SlurmHandle(RUN_ID, "987654"))
    assert state.status == "failed" and "vanished from Slurm" in (state.reason or "")


def test_the_agent_reads_the_batch_scripts_noise_and_does_without_a_bad_one(tmp_path: Path) -> None:
    from workers.engines.slurm import read_noise

    path = tmp_path / "noise.json"
    assert read_noise(path) is None, "none written: none recorded"
    path.write_text('{"load_avg_1m_start": 0.5, "load_avg_1m_end": 2.5, "logical_cpus": 2, "ranks_on_host": 2}')
    noise = read_noise(path)
    assert noise is not None and noise.load_avg_1m_end == 2.5 and noise.ranks_on_host == 2
    path.write_text('{"load_avg_1m_start": -1}')  # cut short, or out of range: the result stands without it
    assert read_noise(path) is None


def module_job(entry: str):
    spec = {
        "workload": {"model": "tiny", "steps": 2, "num_layers": 2, "family": "module", "module": entry},
        "strategy": {"name": "ddp", "world_size": 2},
        "placement": {"pool": "gpu-slurm", "nodes": 1},
    }
    return resolve_job(JobSpec.model_validate(spec), Limits(max_world_size=8, allowed_modules=frozenset({entry})))


def test_the_engine_refuses_an_entry_point_its_own_list_lacks_before_anything_reaches_slurm(tmp_path: Path) -> None:
    """Listed where it was submitted, not on this agent: refused before sbatch (none is on this host's path)."""
    agent = engine(tmp_path)
    agent.allowed_modules = frozenset({"examples.lab_model:build"})
    with pytest.raises(LaunchRefused, match="entry point 'examples.lab_model:param_count' is not on this worker's allow-list"):
        agent.launch(module_job("examples.lab_model:param_count"), RUN_ID)
    assert not agent.run_dir(RUN_ID).path.exists(), "nothing was written for Slurm to run"


def test_the_batch_script_hands_the_ranks_the_engines_allow_list_and_a_rank_holds_to_it(tmp_path: Path) -> None:
    """The script's export, run by bash, is what a rank checks its entry point against."""
    import subprocess

    agent = SlurmEngine(
        "gpu-slurm",
        SlurmPool.model_validate({"python": sys.executable, "run_root": str(tmp_path / "shared")}),
        max_job_seconds=150,
        trace_cap_bytes=1000,
        allowed_modules=frozenset({"examples.lab_model:build", "mylab.models:gpt"}),
    )
    script = agent.batch_script(module_job("examples.lab_model:build"), RUN_ID)
    [export] = [line for line in script.splitlines() if "PARALLAB_ALLOWED_MODULES" in line]
    check = "from workers.harness.module import entry_point as e; import sys; e(sys.argv[1]); print('imported')"
    repo = str(Path(__file__).resolve().parents[2])

    def rank(entry: str) -> subprocess.CompletedProcess[str]:
        line = f'{export}; {sys.executable} -c "{check}" {entry}'
        return subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, env={"PYTHONPATH": repo, "PATH": "/usr/bin:/bin"}, check=False
        )

    assert rank("examples.lab_model:build").stdout.strip() == "imported"
    refused = rank("examples.lab_model:param_count")
    assert refused.returncode != 0 and "is not on this rank's allow-list" in refused.stderr, refused.stderr[-2000:]
