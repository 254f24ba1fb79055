"""A real one-node Ray cluster for the Ray pool's tests: `ray start --head` on free ports under a
temporary directory of its own, in a session of its own, so that tearing it down kills exactly its
processes (the head's session: GCS, raylet, agents, every worker and every rank they started) and
nothing another Ray on the machine runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
REGISTER_WAIT_S = 300.0
"""How long the head waits for its raylet to register (Ray's own `ray start` gives it a fixed 30 s,
which a 2-core machine under load misses: the raylet waits for its agents' Python to start)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RayCluster:
    address: str
    """The head's GCS address, as `ray.init(address=…)` takes it."""
    temp_dir: Path
    sid: int
    """The session of every process of the cluster."""

    def processes(self) -> list[int]:
        """The pids of the cluster's session still alive (the head's `ray start` included)."""
        return session_pids(self.sid)


def session_pids(sid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 2, *, start_timeout_s: float = 300) -> Iterator[RayCluster]:
    """A head node with `num_cpus` CPUs until the block ends; everything it started killed after."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    ports = {
        flag: free_port()
        for flag in (
            "--dashboard-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
            "--node-manager-port",
            "--object-manager-port",
        )
    }
    cmd = [sys.executable, "-m", "tests.e2e.raycluster", "start", "--head", f"--num-cpus={num_cpus}", "--num-gpus=0", f"--port={port}"]
    cmd += ["--node-ip-address=127.0.0.1"]
    cmd += [f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats", "--block"]
    cmd += [f"{flag}={value}" for flag, value in ports.items()]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)  # the actors import workers/
    # A loaded 2-core machine starts the agents slowly: give the raylet time to see them up.
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "RAY_raylet_start_wait_time_s": str(int(REGISTER_WAIT_S)), "OMP_NUM_THREADS": "1"}
    log = temp_dir.with_suffix(".log")
    with log.open("wb") as out:
        head = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not start (exit {head.poll()}):\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        yield RayCluster(f"127.0.0.1:{port}", temp_dir, head.pid)
    finally:
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            for pid in session_pids(head.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while session_pids(head.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
        head.wait(timeout=10)
        shutil.rmtree(temp_dir, ignore_errors=True)
        log.unlink(missing_ok=True)


def on_cluster(address: str, namespace: str, *args: str) -> Any:
    """What the cluster holds (`names`: the namespace's live actors and every placement group not
    removed), or an actor killed (`kill NAME`), or every run of a pool stopped (`stop RUN_ROOT POOL`),
    asked from a process of its own: a process connected to Ray listens beyond loopback, and the
    API under test then refuses to serve it in local mode."""
    cmd = [sys.executable, "-m", "tests.e2e.raycluster", "ask", address, namespace, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def ask(address: str, namespace: str, what: str, *args: str) -> Any:
    import ray
    from ray.util import placement_group_table

    ray.init(address=address, namespace=namespace, logging_level="ERROR", log_to_driver=False)
    if what == "names":
        actors = [e["name"] for e in ray.util.list_named_actors(all_namespaces=True) if e["namespace"] == namespace]
        groups = [str(i.get("name")) for i in placement_group_table().values() if i.get("state") != "REMOVED"]
        return {"actors": sorted(actors), "groups": sorted(groups)}
    if what == "kill":
        ray.kill(ray.get_actor(args[0], namespace=namespace), no_restart=True)
        return {"killed": args[0]}
    if what == "stop":
        from parallab.core.pools import RayPool
        from workers.engines.ray_cluster import RayEngine

        engine = RayEngine(args[1], RayPool(address=address, run_root=args[0], namespace=namespace), max_job_seconds=600, trace_cap_bytes=0)
        found = engine.reconcile()
        for handle in found.values():
            engine.cancel(handle, "the test lab closed")
        return {"stopped": sorted(found)}
    raise SystemExit(f"unknown question {what!r}")


def main() -> None:
    """`start ARGS…`: `ray start ARGS…`, its raylet given `REGISTER_WAIT_S` to register (Ray's node
    start-up asks the GCS for the node in a loop that gives up after 30 s; each ask here retries for
    longer); `ask ADDRESS NAMESPACE …`: `on_cluster`'s questions, answered as one line of JSON."""
    if sys.argv[1] == "ask":
        print(json.dumps(ask(*sys.argv[2:])))
        return
    import ray._private.services as services
    from ray.scripts.scripts import main as ray_main

    get_node = services.get_node

    def patient(gcs_address: str, node_id: str) -> object:
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient
    sys.argv = ["ray", *sys.argv[1:]]  # start ...
    ray_main()


if __name__ == "__main__":
    main()
