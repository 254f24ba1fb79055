"""Launch one job's ranks with torchrun as a subprocess in its own process group.

Shared by the Celery task and `parallab bench`: the same command, the same limits, the same
run directory (`parallab.core.rundir.RunDir`). The launcher writes the frozen `ResolvedJob` to
`RunDir.job` and the ranks load it from there — they never resolve a spec themselves. The
caller's process never imports torch or forks ranks itself; a crash, a timeout or a cancel takes
the whole process group down and nothing else, and the death of the caller takes the agent and
its ranks with it (`workers.lifeline`).

A multi-node job runs one torchrun per host (`NodeLaunch`): `--nnodes N --node-rank r
--rdzv-backend c10d --rdzv-endpoint <node 0>:<port>`, node 0 hosting the rendezvous store.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parallab.core.families.module import ALLOW_LIST_ENV
from parallab.core.hostspeed import HostSpeed
from parallab.core.jobs import ResolvedJob
from parallab.core.noise import HostNoise
from parallab.core.rundir import RunDir
from workers import extras, lifeline
from workers.hostspeed import SpeedProbe
from workers.noise import NoiseSampler

LOG_TAIL_LINES = 60


@dataclass(frozen=True)
class NodeLaunch:
    """One host's part of a multi-node job."""

    nnodes: int
    node_rank: int
    endpoint: str
    """node 0's `address:port`, where the c10d rendezvous store listens."""
    rdzv_id: str
    """The same on every node of one job (the run id)."""
    join_timeout_s: int = 600
    """How long a node waits at the rendezvous for the others (the reservation's timeout)."""
    local_addr: str | None = None
    """This node's own address, told to torchrun where its hostname would lead the other nodes
    astray (an emulated node: every namespace resolves the machine's hostname to its own loopback,
    and the rendezvous winner's ranks' MASTER_ADDR is that name)."""

    @property
    def is_host(self) -> bool:
        """Node 0 hosts the rendezvous store (said outright: on one machine every node would match the address)."""
        return self.node_rank == 0


@dataclass(frozen=True)
class LaunchOutcome:
    returncode: int | None
    reason: str | None
    """None on success; else 'exit code N', 'timed out after S s', 'cancelled' or what `should_stop` said."""
    log_tail: str
    noise: HostNoise | None = None
    """The host around the run (`workers.noise`): load, CPU steal, other jobs."""
    host_speed: HostSpeed | None = None
    """The host-speed probe's rate right before and after the ranks (`workers.hostspeed`)."""

    @property
    def ok(self) -> bool:
        return self.reason is None


def torchrun_command(
    job: ResolvedJob, run_dir: RunDir, *, trace_cap_bytes: int, cache_dir: Path | None, node: NodeLaunch | None = None
) -> list[str]:
    """torchrun running `workers.harness.main` on the job file of `run_dir`, one process per rank of
    this host: the whole job on one host, or this node's share over a c10d rendezvous."""
    if node is None:
        where = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(job.world_size)]
    else:
        where = [
            "--nnodes",
            str(node.nnodes),
            "--node-rank",  # informative: c10d numbers the nodes itself; the ranks of one node stay contiguous
            str(node.node_rank),
            "--nproc-per-node",
            str(job.ranks_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            node.endpoint,
            "--rdzv-id",
            node.rdzv_id,
            "--rdzv-conf",
            f"is_host={str(node.is_host).lower()},join_timeout={node.join_timeout_s}",
        ]
        if node.local_addr:
            where += ["--local-addr", node.local_addr]
    harness = harness_args(run_dir, trace_cap_bytes=trace_cap_bytes, cache_dir=cache_dir)
    return [sys.executable, "-m", "torch.distributed.run", *where, *harness]


def harness_args(run_dir: RunDir, *, trace_cap_bytes: int, cache_dir: Path | None) -> list[str]:
    """What torchrun runs in each rank — the same on a worker's host and in a Slurm job."""
    args = ["-m", "workers.harness.main", "--job", str(run_dir.job), "--run-dir", str(run_dir.path)]
    args += ["--trace-cap-bytes", str(trace_cap_bytes)]
    if cache_dir is not None:
        args += ["--cache-dir", str(cache_dir)]
    return args


COLLECTIVE_TIMEOUT_ENV = "PARALLAB_COLLECTIVE_TIMEOUT_S"
FLIGHT_RECORDER_ENTRIES = 2000
"""Collectives each rank's flight recorder keeps (torch's ring; `workers.harness.flight` dumps it
when the rank fails or is stopped). Its cost is measured in BENCHMARKS.md ("Flight recorder")."""
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""torch 2.13's name for the recorder's size, and the older NCCL-only one."""


def rank_environment(
    job: ResolvedJob, allowed_modules: frozenset[str] = frozenset(), *, collective_timeout_s: float | None = None
) -> dict[str, str]:
    """The ranks' environment: this process's, with their threads, this checkout on the path, this
    worker's allow-list of entry points (the rank checks its entry point against it again), the
    flight recorder on (unless the environment sizes it itself; 0 turns it off) and, when set, how
    long a rank waits in one collective of its world group."""
    env = dict(os.environ)
    for name in FLIGHT_RECORDER_ENV:
        env.setdefault(name, str(FLIGHT_RECORDER_ENTRIES))
    env[ALLOW_LIST_ENV] = ",".join(sorted(allowed_modules))
    if collective_timeout_s is not None:
        env[COLLECTIVE_TIMEOUT_ENV] = str(collective_timeout_s)
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // job.ranks_per_node)))
    env["PYTHONUNBUFFERED"] = "1"
    # The ranks import workers/ and parallab/ from wherever this process found them.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 64 * 1024))
        text = fh.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None: JSON columns (JSONB) refuse them, and a
    progress line from a diverging run must not crash the write that records it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


class ProgressTail:
    """Follows the ranks' progress file (`RunDir.progress`) from where it last stopped, keeping the
    newest line, the step lines so far (thinned to at most `max_points`) and the phases seen, and
    the log beside it: what the live run page draws."""

    def __init__(self, path: Path, *, log: Path | None = None, max_points: int = 400, log_lines: int = 40, every_s: float = 2.0):
        self.path, self.log = path, log
        self.offset = 0
        self.latest: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.phases: list[str] = []
        self.max_points, self.log_lines, self.every_s = max_points, log_lines, every_s
        self._log_size = -1
        self._sent_at = 0.0

    def poll(self) -> dict[str, Any] | None:
        """The newest complete line, if any arrived since the last poll."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n")
        if end < 0:
            return None  # nothing new, or a line still being written
        self.offset += end + 1
        fresh = None
        for line in chunk[:end].splitlines():
            try:
                fresh = finite(json.loads(line))
            except json.JSONDecodeError:
                continue
            self._remember(fresh)
        if fresh is not None:
            self.latest = fresh
        return fresh

    def _remember(self, line: dict[str, Any]) -> None:
        phase = line.get("phase")
        if isinstance(phase, str) and (not self.phases or self.phases[-1] != phase):
            self.phases.append(phase)
        if line.get("step_time_s") is None:
            return  # a phase mark, not a step
        self.history.append({k: line.get(k) for k in ("phase", "step", "loss", "tokens_per_s", "memory_bytes", "t")})
        if len(self.history) > self.max_points:  # thin the older half, keep the newest points whole
            half = len(self.history) // 2
            self.history = self.history[:half:2] + self.history[half:]

    def mark(self, phase: str) -> None:
        """A phase the launcher itself enters (the ranks have no line for it)."""
        line = {**(self.latest or {}), "phase": phase}
        self._remember({"phase": phase})
        self.latest = line

    def live(self, *, force: bool = False) -> dict[str, Any] | None:
        """The live view when something changed: at once for new progress lines, at most every
        `every_s` for log output alone (or whatever changed, with `force`); None otherwise."""
        fresh = self.poll() is not None
        log_size = self.log.stat().st_size if self.log is not None and self.log.exists() else -1
        grew = log_size != self._log_size
        now = time.monotonic()
        if not (fresh or force or (grew and now - self._sent_at >= self.every_s)):
            return None
        self._log_size, self._sent_at = log_size, now
        log = read_log_tail(self.log, lines=self.log_lines) if self.log is not None else ""
        return {**(self.latest or {}), "phases": list(self.phases), "history": list(self.history), "log": log}


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM the process group `proc` leads, then SIGKILL it if it has not exited in `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(
    job: ResolvedJob,
    run_dir: RunDir,
    *,
    timeout_s: float,
    trace_cap_bytes: int,
    cache_dir: Path | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    should_stop: Callable[[], str | None] | None = None,
    on_start: Callable[[int], None] | None = None,
    node: NodeLaunch | None = None,
    netns: str | None = None,
    collective_timeout_s: float | None = None,
    poll_s: float = 0.5,
    allowed_modules: frozenset[str] = frozenset(),
) -> LaunchOutcome:
    """Run the job's ranks to completion (or until the limit, a cancel or a stop) and say how it ended.

    `should_stop` returns why the ranks must stop now (a cancel, another node's fault, a lapsed
    lease), or None; `on_start` gets the ranks' process group id as soon as it exists.
    `netns`: a network namespace the ranks run in (an emulated node: `ip netns exec` enters it
    and execs, so torchrun keeps the process group and the lifeline keeps its parent).
    `collective_timeout_s`: how long a rank waits in one collective of its world group (None: torch's default).
    `allowed_modules`: this worker's allow-list of entry points — a job was checked against the
    submitting side's at resolution, and is checked again here, against the host that would run it,
    and by each rank before it imports the entry point."""
    run_dir.create()
    run_dir.write_atomic(run_dir.job, job.model_dump_json(indent=2).encode())
    missing = extras.missing_extra(job.model) or extras.refused_module(job.model, allowed_modules)
    if missing is not None:  # refused before any rank starts
        run_dir.log.write_text(missing + "\n")
        return LaunchOutcome(returncode=None, reason=missing, log_tail=missing)
    deadline = time.monotonic() + timeout_s
    progress = ProgressTail(run_dir.progress, log=run_dir.log)
    speed = SpeedProbe(lanes=job.ranks_per_node)
    speed.start()  # before the noise sample: the probe's own CPU is not the run's
    sampler = NoiseSampler(ranks_on_host=job.ranks_per_node)
    sampler.start()
    with run_dir.log.open("wb") as log:
        # The agent dies with this process (lifeline): a killed worker leaves no training behind.
        command = torchrun_command(job, run_dir, trace_cap_bytes=trace_cap_bytes, cache_dir=cache_dir, node=node)
        wrapped = lifeline.wrap(command, parent=os.getpid())
        proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, *wrapped] if netns else wrapped,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={
                **rank_environment(job, allowed_modules, collective_timeout_s=collective_timeout_s),
                # torch's own dumps (NCCL's watchdog writes one on a collective's timeout) land with the run
                "TORCH_FR_DUMP_TEMP_FILE": str(run_dir.path / "torch_flight_rank"),
            },
            start_new_session=True,
        )
        reason = None
        try:
            if on_start is not None:
                on_start(proc.pid)  # start_new_session: torchrun leads its own process group
            while proc.poll() is None:
                # One poll interval, cut short when torchrun exits: a sleep would keep every launch
                # waiting up to `poll_s` after its ranks ended (half of it on average).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=poll_s)
                if on_progress is not None and (view := progress.live()) is not None:
                    on_progress(view)
                if should_cancel is not None and should_cancel():
                    reason = "cancelled"
                    stop_process_group(proc)
                    break
                if should_stop is not None and (why := should_stop()) is not None:
                    reason = why
                    stop_process_group(proc)
                    break
                if time.monotonic() > deadline:
                    reason = f"timed out after {timeout_s:.0f} s"
                    stop_process_group(proc)
                    break
        except BaseException:
            stop_process_group(proc)
            raise
    if on_progress is not None and proc.returncode == 0:
        progress.poll()
        progress.mark("storing")  # the ranks are done: the worker stores the result now
        if (view := progress.live(force=True)) is not None:
            on_progress(view)
    code = proc.returncode
    if reason is None and code != 0:
        reason = f"exit code {code}" if code is None or code >= 0 else f"killed by signal {-code}"
    noise = sampler.stop(exclude={proc.pid})
    return LaunchOutcome(
        returncode=code, reason=reason, log_tail=read_log_tail(run_dir.log), noise=noise, host_speed=speed.stop(ended=code == 0)
    )
