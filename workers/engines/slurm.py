"""The Slurm engine: a job is an `sbatch` of `srun torchrun`, run by the cluster's scheduler.

`launch` writes the frozen job into the run's directory on the cluster's shared filesystem (every
node reads it there, and every rank writes its record there) and submits a batch script: one
`srun` task per node, each a torchrun with `--nnodes $SLURM_NNODES --rdzv-backend c10d` whose
rendezvous is the job's first node — the same rank code (`workers.harness.main`) as a worker runs.

The job is named `parallab-<run id>` and commented with its pool, so an agent that restarts finds
its jobs again in `squeue` (`reconcile`). `state` reads `squeue --states=all` (finished jobs stay
there for the cluster's MinJobAge), then `sacct` when the cluster keeps accounting; a job neither
knows has vanished. Slurm's states map onto a run's: PENDING → queued (with Slurm's reason),
RUNNING → running, COMPLETED → succeeded, CANCELLED → cancelled, and every other end → failed,
saying which.

Only the `sbatch`, `squeue`, `sacct`, `scancel` and `scontrol` commands of the login node are
used: no inbound connection to the cluster, no SSH.
"""

from __future__ import annotations

import logging
import math
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from parallab.core.families.module import ALLOW_LIST_ENV
from parallab.core.jobs import ResolvedJob
from parallab.core.noise import HostNoise
from parallab.core.pools import SlurmPool
from parallab.core.rundir import RunDir
from workers import extras
from workers.engines.base import EngineFacts, EngineState, LaunchRefused, PoolEngine, Records
from workers.engines.outputs import failure_message, hang_report, kept_flight, node_records, read_traces
from workers.launcher import harness_args, read_log_tail

log = logging.getLogger(__name__)

NAME_PREFIX = "parallab-"
COMMAND_TIMEOUT_S = 60
RDZV_PORT_BASE = 29500
"""Each job's c10d store listens on its first node at this + (job id mod 20000): two jobs sharing a node never collide."""

QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
FAILURES = {
    "FAILED": "a task exited non-zero",
    "NODE_FAIL": "a node it ran on failed",
    "OUT_OF_MEMORY": "it ran out of memory",
    "TIMEOUT": "it ran past its time limit",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "it reached its deadline",
    "PREEMPTED": "it was preempted",
    "REVOKED": "it was revoked",
}


UNREACHABLE = ("Unable to contact", "Socket timed out", "Connection refused", "Zero Bytes were transmitted")
"""Words of a Slurm command that could not reach slurmctld (nothing was refused: try again later)."""


def read_noise(path: Path) -> HostNoise | None:
    """The host noise the batch script sampled, or None where it wrote none or nothing readable:
    the run's result stands without it (`noise` is optional), never fails for it."""
    try:
        return HostNoise.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        if path.exists():
            log.warning("ignoring the host noise in %s: %s", path, exc)
        return None


class SlurmUnavailable(RuntimeError):
    """The scheduler did not answer (slurmctld down, a command missing): nothing can be concluded now."""


@dataclass(frozen=True)
class SlurmJob:
    """One line of `squeue` about one of our jobs."""

    job_id: str
    name: str
    state: str
    reason: str | None
    nodes: str | None
    comment: str | None
    time_limit: str | None = None

    @property
    def run_id(self) -> str | None:
        return self.name[len(NAME_PREFIX) :] if self.name.startswith(NAME_PREFIX) else None


def slurm_time(seconds: int) -> str:
    """`seconds` as a Slurm `--time` in whole minutes (Slurm's granularity), at least one."""
    return str(max(1, math.ceil(seconds / 60)))


def map_state(job_id: str, state: str, reason: str | None, *, time_limit: str | None = None) -> EngineState:
    """A Slurm job state as a run's status, with the reason the run page shows."""
    state = state.split()[0].rstrip("+") if state else "UNKNOWN"  # "CANCELLED by 0", "CANCELLED+"
    words = f"Slurm job {job_id}"
    if state in QUEUED_STATES:
        return EngineState("queued", f"{words} {state}" + (f" ({reason})" if reason and reason != "None" else ""))
    if state in RUNNING_STATES:
        return EngineState("running", f"{words} {state}")
    if state == "COMPLETED":
        return EngineState("succeeded", f"{words} COMPLETED")
    if state == "CANCELLED":
        return EngineState("cancelled", f"{words} CANCELLED")
    why = FAILURES.get(state, "it ended")
    if state == "TIMEOUT" and time_limit:
        why += f" ({time_limit})"
    detail = f" — {reason}" if reason and reason != "None" else ""
    return EngineState("failed", f"{words} {state}: {why}{detail}")


@dataclass(frozen=True)
class SlurmHandle:
    """A run's job in Slurm."""

    run_id: str
    job_id: str


class SlurmEngine(PoolEngine[SlurmHandle]):
    """One Slurm pool's jobs."""

    name = "slurm"

    def __init__(
        self, pool: str, settings: SlurmPool, *, max_job_seconds: int, trace_cap_bytes: int, allowed_modules: frozenset[str] = frozenset()
    ):
        self.pool, self.settings = pool, settings
        self.max_job_seconds, self.trace_cap_bytes = max_job_seconds, trace_cap_bytes
        self.allowed_modules = allowed_modules
        """This agent's allow-list of entry points: checked before `sbatch`, and handed to the ranks."""

    # ---- where a run's files live on the cluster ----

    def run_dir(self, run_id: str) -> RunDir:
        return RunDir(Path(self.settings.run_root) / run_id)

    @property
    def device(self) -> str:
        """What the ranks train on (the key of the lab's reference curves)."""
        return "cuda" if self.settings.gpus_per_node else "cpu"

    def cache_dir(self) -> Path:
        """Reference curves the ranks compute once per workload, shared by every node of the pool."""
        return Path(self.settings.run_root) / "cache" / "reference"

    def comment(self) -> str:
        return f"parallab:pool={self.pool}"

    # ---- launch ----

    def sbatch_args(self, job: ResolvedJob, run_id: str) -> list[str]:
        """`sbatch`'s options for `job`: the pool's settings, one task per node, output into the run directory."""
        s = self.settings
        args = [
            f"--job-name={NAME_PREFIX}{run_id}",
            f"--comment={self.comment()}",
            f"--nodes={job.nodes}",
            "--ntasks-per-node=1",
            f"--output={self.run_dir(run_id).log}",
            "--open-mode=append",
            "--no-requeue",
            f"--time={s.time_limit or slurm_time(self.max_job_seconds)}",
        ]
        args += [f"--{flag}={value}" for flag, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos)) if value]
        if s.gpus_per_node:
            args.append(f"--gpus-per-node={s.gpus_per_node}")
        return args

    def batch_script(self, job: ResolvedJob, run_id: str) -> str:
        """The batch script: `srun` starts one torchrun per node, all meeting at the first node's c10d store."""
        files = self.run_dir(run_id)
        torchrun = [
            self.settings.python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            '"$SLURM_NNODES"',
            "--nproc-per-node",
            str(job.ranks_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            '"$head:$port"',
            "--rdzv-id",
            run_id,
        ]
        harness = harness_args(files, trace_cap_bytes=self.trace_cap_bytes, cache_dir=self.cache_dir())
        line = " ".join(part if part.startswith('"$') else shlex.quote(part) for part in torchrun + harness)
        python, state = shlex.quote(self.settings.python), shlex.quote(str(files.path / ".noise-start.json"))
        noise = f"{python} -m workers.noise"  # the first node around the srun, as a worker samples its host (never fails the job)
        return "\n".join(
            [
                "#!/bin/bash",
                f"# parallab run {run_id}: {job.strategy} x {job.world_size} over {job.nodes} node(s)",
                "set -euo pipefail",
                'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"port=$(({RDZV_PORT_BASE} + SLURM_JOB_ID % 20000))",
                "export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
                f"export {ALLOW_LIST_ENV}={shlex.quote(','.join(sorted(self.allowed_modules)))}",
                'echo "parallab: Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous $head:$port"',
                f"{noise} start {state} --ranks {job.ranks_per_node} || true",
                f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {line}",
                f"{noise} stop {state} --out {shlex.quote(str(files.noise))} || true",
                "",
            ]
        )

    def launch(self, job: ResolvedJob, run_id: str) -> SlurmHandle:
        """Submit the job, once this agent's own allow-list holds its entry point (whatever the
        submitting side allowed: a refusal is LaunchRefused, and nothing reaches Slurm)."""
        if (refused := extras.refused_module(job.model, self.allowed_modules)) is not None:
            raise LaunchRefused(refused)
        files = self.run_dir(run_id).create()
        files.write_atomic(files.job, job.model_dump_json(indent=2).encode())
        self.cache_dir().mkdir(parents=True, exist_ok=True)
        script = files.path / "job.sbatch"
        script.write_text(self.batch_script(job, run_id))
        done = self._command(["sbatch", "--parsable", *self.sbatch_args(job, run_id), str(script)], refuse=True)
        return SlurmHandle(run_id, done.stdout.strip().split(";")[0])

    # ---- state ----

    def jobs(self) -> dict[str, SlurmJob]:
        """Every job of this pool that `squeue` still knows (finished ones too), by job id."""
        fmt = "%i|%j|%T|%r|%N|%k|%l"
        done = self._command(["squeue", "--me", "--noheader", "--states=all", f"--format={fmt}"])
        found = {}
        for line in done.stdout.splitlines():
            parts = line.split("|")
            if len(parts) != 7:
                continue
            job_id, name, state, reason, nodes, comment, limit = (p.strip() for p in parts)
            if name.startswith(NAME_PREFIX) and comment == self.comment():
                said = reason if reason not in ("", "None") else None
                found[job_id] = SlurmJob(job_id, name, state, said, nodes or None, comment, limit or None)
        return found

    def accounting(self, job_id: str) -> SlurmJob | None:
        """What `sacct` recorded of a job `squeue` forgot; None without accounting or a record."""
        try:
            done = subprocess.run(
                ["sacct", "--noheader", "--parsable2", "-X", "-j", job_id, "--format=JobID,JobName,State,NodeList,Timelimit"],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in done.stdout.splitlines() if done.returncode == 0 else []:
            parts = line.split("|")
            if len(parts) == 5 and parts[0] == job_id:
                return SlurmJob(job_id, parts[1], parts[2], None, parts[3] or None, None, parts[4] or None)
        return None

    def states(self, handles: list[SlurmHandle]) -> dict[SlurmHandle, EngineState]:
        """The state of each job (one `squeue` for all of them); raises SlurmUnavailable when Slurm does not answer."""
        known = self.jobs() if handles else {}
        out = {}
        for handle in handles:
            job_id = handle.job_id
            found = known.get(job_id) or self.accounting(job_id)
            if found is None:
                out[handle] = EngineState(
                    "failed", f"Slurm job {job_id} vanished from Slurm: neither squeue nor accounting knows it", {"slurm_job_id": job_id}
                )
                continue
            state = map_state(job_id, found.state, found.reason, time_limit=found.time_limit)
            detail = {"slurm_job_id": job_id, "slurm_state": found.state, "slurm_reason": found.reason, "slurm_nodes": found.nodes}
            out[handle] = EngineState(state.status, state.reason, detail)
        return out

    def state(self, handle: SlurmHandle) -> EngineState:
        return self.states([handle])[handle]

    def log_tail(self, handle: SlurmHandle) -> str:
        """The end of the job's output file (torchrun's and every rank's output)."""
        return read_log_tail(self.run_dir(handle.run_id).log)

    def failure(self, handle: SlurmHandle, state: EngineState) -> str:
        """Why a job failed: Slurm's state and reason, a rank's own failure record if one wrote it
        (else led by the hang every node's ranks' dumps show, when they show one), and the log tail."""
        files = self.run_dir(handle.run_id)
        if files.failure.exists():
            return f"{state.reason}\n{failure_message(files, state.reason or '', self.log_tail(handle))}"
        report = hang_report(files)
        lead = f"{report.sentence}\n" if report is not None and report.sentence else ""
        return f"{lead}{state.reason}\n--- log tail ---\n{self.log_tail(handle)}"

    def flight(self, handle: SlurmHandle, job: ResolvedJob, others: Mapping[int, str] | None = None) -> dict[str, Any] | None:
        """The ranks' flight-recorder dumps on the shared filesystem (every node's ranks wrote there)."""
        return kept_flight(self.run_dir(handle.run_id), job.world_size, others)

    def hostnames(self, nodes: str) -> list[str]:
        """A Slurm node list (`node[01-02]`) as host names, in order."""
        try:
            return self._command(["scontrol", "show", "hostnames", nodes]).stdout.split() or [nodes]
        except SlurmUnavailable:
            return [nodes]

    def facts(self, handle: SlurmHandle, state: EngineState) -> EngineFacts:
        """The job's hosts (its Slurm node list), the host noise the batch script sampled on the
        first node, and its Slurm job id, nodes and pool for the document's `hardware`."""
        nodes = state.detail.get("slurm_nodes")
        return EngineFacts(
            hosts=self.hostnames(nodes) if nodes else None,
            noise=read_noise(self.run_dir(handle.run_id).noise),
            hardware={"slurm_job_id": handle.job_id, "slurm_nodes": nodes, "slurm_pool": self.pool},
        )

    # ---- cancel, collect, reconcile ----

    def cancel(self, handle: SlurmHandle, reason: str = "cancelled") -> None:
        self._command(["scancel", handle.job_id])

    def collect(self, handle: SlurmHandle, job: ResolvedJob) -> Records:
        """Every rank's record from the run's directory on the shared filesystem (all nodes wrote there)."""
        files = self.run_dir(handle.run_id)
        records = node_records(files, job, expected=job.world_size, log_tail=self.log_tail(handle))
        traces = read_traces(files, job.world_size, self.trace_cap_bytes) if job.spec.trace else {}
        return Records(records, traces)

    def reconcile(self) -> dict[str, SlurmHandle]:
        """This pool's jobs that Slurm still knows, by run id (the newest job of a run, if it has two)."""
        found: dict[str, SlurmHandle] = {}
        for job in sorted(self.jobs().values(), key=lambda j: int(re.sub(r"\D", "", j.job_id) or 0)):
            if job.run_id:
                found[job.run_id] = SlurmHandle(job.run_id, job.job_id)
        return found

    # ---- the commands ----

    def _command(self, cmd: list[str], *, refuse: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command; a non-zero exit raises LaunchRefused (`refuse`: Slurm refused the
        job, the message is its own) or SlurmUnavailable."""
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmUnavailable(f"{cmd[0]}: {exc}") from exc
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
            if refuse and not any(word in message for word in UNREACHABLE):
                raise LaunchRefused(f"Slurm refused the job: {message}")
            raise SlurmUnavailable(f"{cmd[0]} failed: {message}")
        return done
