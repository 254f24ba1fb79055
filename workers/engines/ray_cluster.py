"""The Ray engine: a job's ranks are Ray actors, one a rank, placed by one placement group.

`launch` writes the frozen job into the run's directory under the pool's `run_root` (every node
reads it there, and every rank writes its record there), asks the cluster for a placement group of
one bundle a rank (`cpus_per_rank` CPUs, and a GPU when the pool's ranks train on CUDA), waits for
it to be placed, and starts one actor in each bundle. Each actor starts the same rank code as
torchrun does (`python -m workers.harness.main`, the same arguments) as its child, with the
environment torchrun would give it: MASTER_ADDR and MASTER_PORT (rank 0's node and a port free
there), RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (by node), and on GPUs the node's GPUs
of the run in CUDA_VISIBLE_DEVICES — so gloo and NCCL meet as they do under torchrun. The rank
asks for SIGKILL on its parent's death (`workers.lifeline`): an actor killed takes its rank along.

Everything is named after the run, in the pool's namespace: the placement group
`parallab-<run id>` and the actors `parallab-<run id>-rank<r>`, all detached, so they outlive an
agent that stops; a restarted agent finds them by name (`reconcile`). `state` asks every rank's
actor for its child's exit code: all 0 → succeeded; a rank that exited non-zero, or an actor gone
from the cluster (its worker killed, its node lost), fails the run saying which rank and why, and
stops the others as torchrun would. A job's end is written into its run directory
(`ray-end.json`) and its actors and placement group removed, so the run's end outlives them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parallab.core.jobs import ResolvedJob
from parallab.core.pools import RayPool
from parallab.core.rundir import RunDir
from workers import extras
from workers.engines.base import EngineFacts, EngineState, LaunchRefused, PoolEngine, Records
from workers.engines.outputs import failure_message, kept_flight, node_records, read_traces
from workers.launcher import harness_args, rank_environment, read_log_tail

log = logging.getLogger(__name__)

NAME_PREFIX = "parallab-"
RANK_INFIX = "-rank"
CALL_TIMEOUT_S = 60
"""How long one call to an actor may take before the cluster counts as not answering."""
STOP_GRACE_S = 5.0
"""How long a stopped rank has to dump its flight recorder (SIGTERM) before SIGKILL."""
LAUNCH_FILE = "ray.json"
END_FILE = "ray-end.json"


class RayUnavailable(RuntimeError):
    """The cluster did not answer (its head down, a call timed out): nothing can be concluded now."""


class RankProcess:
    """One rank inside its Ray actor: the harness as the actor's child process, and its exit code."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def where(self) -> dict[str, Any]:
        """This actor's node (id and address), its GPUs and a TCP port free on its node."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        ctx = ray.get_runtime_context()
        gpus = [str(g) for g in ray.get_gpu_ids()]
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "gpus": gpus, "port": port, "pid": os.getpid()}

    def start(self, argv: list[str], env: dict[str, str], log_path: str) -> int:
        """Start the rank (`python ARGV…` with `env` over the actor's environment, output appended to `log_path`); its pid."""
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *argv], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self.proc.pid

    def poll(self) -> int | None:
        """The rank's exit code (None: still running)."""
        return self.proc.poll() if self.proc is not None else None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the rank's process group (it dumps its flight recorder), SIGKILL after `grace_s`; its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.poll() if self.proc is not None else None
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                return self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()


@dataclass(frozen=True)
class RayHandle:
    """A run's job on a Ray cluster: the run, and its placement group's name."""

    run_id: str
    job_id: str


def group_name(run_id: str) -> str:
    return f"{NAME_PREFIX}{run_id}"


def actor_name(run_id: str, rank: int) -> str:
    return f"{NAME_PREFIX}{run_id}{RANK_INFIX}{rank}"


def run_of(name: str) -> str | None:
    """The run id in an actor's name (None: not one of ours)."""
    if not name.startswith(NAME_PREFIX) or RANK_INFIX not in name:
        return None
    run_id, _, rank = name[len(NAME_PREFIX) :].rpartition(RANK_INFIX)
    return run_id if run_id and rank.isdigit() else None


def rank_envs(job: ResolvedJob, where: list[dict[str, Any]], *, base: dict[str, str]) -> list[dict[str, str]]:
    """Each rank's environment as torchrun would give it, from where its actor was placed: local
    ranks and world by node, and on GPUs every GPU of the run on the node visible to each of its
    ranks, LOCAL_RANK indexing its own."""
    master = where[0]
    by_node: dict[str, list[int]] = {}
    for rank, w in enumerate(where):
        by_node.setdefault(w["node_id"], []).append(rank)
    envs = []
    for rank, w in enumerate(where):
        peers = by_node[w["node_id"]]
        env = {
            **base,
            "MASTER_ADDR": str(master["ip"]),
            "MASTER_PORT": str(master["port"]),
            "RANK": str(rank),
            "WORLD_SIZE": str(job.world_size),
            "LOCAL_RANK": str(peers.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(peers)),
            "GROUP_RANK": str(list(by_node).index(w["node_id"])),
        }
        if w["gpus"]:
            visible = [g for peer in peers for g in where[peer]["gpus"]]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
            env["LOCAL_RANK"] = str(visible.index(w["gpus"][0]))
        envs.append(env)
    return envs


class RayEngine(PoolEngine[RayHandle]):
    """One Ray pool's jobs."""

    name = "ray"

    def __init__(
        self, pool: str, settings: RayPool, *, max_job_seconds: int, trace_cap_bytes: int, allowed_modules: frozenset[str] = frozenset()
    ):
        self.pool, self.settings = pool, settings
        self.max_job_seconds, self.trace_cap_bytes = max_job_seconds, trace_cap_bytes
        self.allowed_modules = allowed_modules
        self.namespace = settings.namespace or f"{NAME_PREFIX}{pool}"

    # ---- where a run's files live ----

    def run_dir(self, run_id: str) -> RunDir:
        return RunDir(Path(self.settings.run_root) / run_id)

    @property
    def device(self) -> str:
        return "cuda" if self.settings.gpus_per_rank else "cpu"

    def cache_dir(self) -> Path:
        return Path(self.settings.run_root) / "cache" / "reference"

    # ---- the cluster ----

    def connect(self) -> Any:
        """The `ray` module, connected to the pool's cluster in the pool's namespace."""
        import ray

        if not ray.is_initialized():
            try:
                ray.init(address=self.settings.address, namespace=self.namespace, logging_level=logging.WARNING, log_to_driver=False)
            except Exception as exc:  # ConnectionError, a timeout: the head is not there now
                raise RayUnavailable(f"could not connect to the Ray cluster at {self.settings.address}: {exc}") from exc
        return ray

    def _actor(self, run_id: str, rank: int) -> Any | None:
        ray = self.connect()
        try:
            return ray.get_actor(actor_name(run_id, rank), namespace=self.namespace)
        except ValueError:
            return None

    # ---- launch ----

    def launch(self, job: ResolvedJob, run_id: str) -> RayHandle:
        """Place one bundle a rank, start one actor in each and the rank in each actor; LaunchRefused
        when this agent's allow-list refuses the entry point or the cluster cannot place the bundles."""
        if (refused := extras.refused_module(job.model, self.allowed_modules)) is not None:
            raise LaunchRefused(refused)
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self.connect()
        files = self.run_dir(run_id).create()
        files.write_atomic(files.job, job.model_dump_json(indent=2).encode())
        self.cache_dir().mkdir(parents=True, exist_ok=True)
        s = self.settings
        bundle: dict[str, float] = {"CPU": s.cpus_per_rank, **({"GPU": float(s.gpus_per_rank)} if s.gpus_per_rank else {})}
        group = placement_group(
            [dict(bundle) for _ in range(job.world_size)], strategy=s.strategy, name=group_name(run_id), lifetime="detached"
        )
        if not group.wait(timeout_seconds=s.place_timeout_s):
            remove_placement_group(group)
            said = f"{job.world_size} bundle(s) of {bundle} ({s.strategy}) within {s.place_timeout_s:g} s"
            raise LaunchRefused(f"the Ray cluster at {s.address} could not place {said}")
        rank_actor = ray.remote(RankProcess)
        try:
            actors = [
                rank_actor.options(
                    name=actor_name(run_id, rank),
                    lifetime="detached",
                    num_cpus=s.cpus_per_rank,
                    num_gpus=s.gpus_per_rank,
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
                ).remote()
                for rank in range(job.world_size)
            ]
            where = ray.get([a.where.remote() for a in actors], timeout=CALL_TIMEOUT_S)
            base = {k: v for k, v in rank_environment(job, self.allowed_modules).items() if os.environ.get(k) != v}
            argv = harness_args(files, trace_cap_bytes=self.trace_cap_bytes, cache_dir=self.cache_dir())
            with files.log.open("ab") as out:
                out.write(f"parallab: Ray placement group {group_name(run_id)} on {', '.join(w['ip'] for w in where)}\n".encode())
            envs = rank_envs(job, where, base=base)
            pids = ray.get([a.start.remote(argv, env, str(files.log)) for a, env in zip(actors, envs, strict=True)], timeout=CALL_TIMEOUT_S)
        except Exception:
            self._remove(run_id, job.world_size)
            raise
        placed = {"world_size": job.world_size, "deadline": time.time() + self.max_job_seconds, "ranks": where, "pids": pids}
        files.write_atomic(files.path / LAUNCH_FILE, json.dumps(placed).encode())
        return RayHandle(run_id, group_name(run_id))

    # ---- state ----

    def world_size(self, run_id: str) -> int:
        """How many ranks the run has (its launch record, else its frozen job; 0 if neither is readable)."""
        if (said := self.launched(run_id)) is not None:
            return int(said["world_size"])
        try:
            return ResolvedJob.model_validate_json(self.run_dir(run_id).job.read_text()).world_size
        except (OSError, ValueError):
            return 0

    def launched(self, run_id: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.run_dir(run_id).path / LAUNCH_FILE).read_text()))
        except (OSError, ValueError):
            return None

    def ended(self, run_id: str) -> EngineState | None:
        try:
            said = json.loads((self.run_dir(run_id).path / END_FILE).read_text())
        except (OSError, ValueError):
            return None
        return EngineState(said["status"], said["reason"], said.get("detail") or {}, stopped=bool(said.get("stopped")))

    def end(self, handle: RayHandle, state: EngineState, world_size: int) -> EngineState:
        """Write the job's end into its run directory (the first end written stands), then remove its actors and placement group."""
        files = self.run_dir(handle.run_id)
        if (first := self.ended(handle.run_id)) is not None:
            state = first
        else:
            said = {"status": state.status, "reason": state.reason, "detail": state.detail, "stopped": state.stopped}
            files.write_atomic(files.path / END_FILE, json.dumps(said).encode())
        self._remove(handle.run_id, world_size)
        return state

    def state(self, handle: RayHandle) -> EngineState:
        if (done := self.ended(handle.run_id)) is not None:
            return done
        said = self.launched(handle.run_id)
        ray = self.connect()
        group = handle.job_id
        if said is None:
            why = f"Ray placement group {group}: its ranks never started"
            return self.end(handle, EngineState("failed", why), self.world_size(handle.run_id))
        world = int(said["world_size"])
        detail = {"ray_group": group, "ray_nodes": ",".join(dict.fromkeys(str(w["ip"]) for w in said["ranks"]))}
        codes: list[int | None] = []
        for rank in range(world):
            actor = self._actor(handle.run_id, rank)
            if actor is None:
                why = f"Ray placement group {group}: the actor of rank {rank} ({actor_name(handle.run_id, rank)}) is gone from the cluster"
                return self.end(handle, EngineState("failed", why, detail), world)
            try:
                codes.append(ray.get(actor.poll.remote(), timeout=CALL_TIMEOUT_S))
            except ray.exceptions.GetTimeoutError as exc:
                raise RayUnavailable(f"the actor of rank {rank} did not answer within {CALL_TIMEOUT_S} s") from exc
            except ray.exceptions.RayActorError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                why = f"Ray placement group {group}: the actor of rank {rank} ({actor_name(handle.run_id, rank)}) died: {first}"
                return self.end(handle, EngineState("failed", why, detail), world)
        if all(code == 0 for code in codes):
            return self.end(handle, EngineState("succeeded", f"Ray placement group {group}: every rank exited 0", detail), world)
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (0, None)]
        if failed:
            rank, code = failed[0]
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            return self.end(handle, EngineState("failed", f"Ray placement group {group}: rank {rank} failed ({how})", detail), world)
        if time.time() > float(said["deadline"]):
            why = f"Ray placement group {group}: it ran past its time limit ({self.max_job_seconds} s)"
            return self.end(handle, EngineState("failed", why, detail, stopped=True), world)
        return EngineState("running", f"Ray placement group {group} RUNNING", detail)

    def log_tail(self, handle: RayHandle) -> str:
        return read_log_tail(self.run_dir(handle.run_id).log)

    def failure(self, handle: RayHandle, state: EngineState) -> str:
        """Why a job failed: which rank and how, a rank's own failure record if one wrote it, and the log tail."""
        files = self.run_dir(handle.run_id)
        if files.failure.exists():
            return f"{state.reason}\n{failure_message(files, state.reason or '', self.log_tail(handle))}"
        return failure_message(files, state.reason or "failed", self.log_tail(handle))

    def flight(self, handle: RayHandle, job: ResolvedJob, others: Mapping[int, str] | None = None) -> dict[str, Any] | None:
        """The ranks' flight-recorder dumps in the run directory, with those `others` handed on."""
        return kept_flight(self.run_dir(handle.run_id), job.world_size, others)

    def facts(self, handle: RayHandle, state: EngineState) -> EngineFacts:
        """The job's hosts (its ranks' nodes, in rank order) and its placement group and pool for the document's `hardware`."""
        said = self.launched(handle.run_id) or {}
        hosts = list(dict.fromkeys(str(w["ip"]) for w in said.get("ranks", []))) or None
        return EngineFacts(hosts=hosts, hardware={"ray_group": handle.job_id, "ray_nodes": hosts, "ray_pool": self.pool})

    # ---- cancel, collect, reconcile ----

    def cancel(self, handle: RayHandle, reason: str = "cancelled") -> None:
        self.end(handle, EngineState("cancelled", reason, {"ray_group": handle.job_id}, stopped=True), self.world_size(handle.run_id))

    def collect(self, handle: RayHandle, job: ResolvedJob) -> Records:
        files = self.run_dir(handle.run_id)
        records = node_records(files, job, expected=job.world_size, log_tail=self.log_tail(handle))
        traces = read_traces(files, job.world_size, self.trace_cap_bytes) if job.spec.trace else {}
        return Records(records, traces)

    def reconcile(self) -> dict[str, RayHandle]:
        """The runs whose actors the pool's namespace still holds, by run id."""
        ray = self.connect()
        found: dict[str, RayHandle] = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name, namespace = (entry["name"], entry["namespace"]) if isinstance(entry, dict) else (entry, self.namespace)
            if namespace == self.namespace and (run_id := run_of(name)) is not None:
                found[run_id] = RayHandle(run_id, group_name(run_id))
        return found

    # ---- removal ----

    def _remove(self, run_id: str, world_size: int) -> None:
        """Stop each rank (SIGTERM, then SIGKILL), kill its actor and remove the placement group; idempotent."""
        from ray.util import placement_group_table
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        ray = self.connect()
        actors = [a for rank in range(world_size) if (a := self._actor(run_id, rank)) is not None]
        stops = [a.stop.remote() for a in actors]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_GRACE_S + 15)
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead
                log.debug("actor of run %s already gone", run_id, exc_info=True)
        for group_id, info in placement_group_table().items():
            if info.get("name") == group_name(run_id) and info.get("state") != "REMOVED":
                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
