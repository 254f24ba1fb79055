"""CPU use by process group, once a second, while a command runs (is the server, Postgres or the client busy?).

    python benchmarks/cpu_by_process.py -- python benchmarks/ingest.py --parallab-only --no-write --kinds small

Prints on stderr each second's CPU % (100 = one core) of: the command itself (`client`: the
benchmark's upload threads), uvicorn (`uvicorn`), MLflow (`mlflow`), Postgres's processes
(`postgres`), the command's other children (`prober`: the health poller), and anything else on
the machine by name. Exits with the command's status.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time

import psutil


def group(proc: psutil.Process, main: int) -> str:
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return ""
    if "postgres" in cmd or name.startswith("postgres"):
        return "postgres"
    if "uvicorn" in cmd:
        return "uvicorn"
    if "mlflow" in cmd or "gunicorn" in cmd:
        return "mlflow"
    if proc.pid == main:
        return "client"
    if "multiprocessing" in cmd:
        return "prober"
    return "other:" + name


def main() -> None:
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    child = subprocess.Popen(command)
    before: dict[int, tuple[str, float]] = {}
    while child.poll() is None:
        time.sleep(1)
        now: dict[int, tuple[str, float]] = {}
        for proc in psutil.process_iter():
            try:
                t = proc.cpu_times()
                now[proc.pid] = (group(proc, child.pid), t.user + t.system)
            except psutil.Error:
                pass
        used: collections.Counter[str] = collections.Counter()
        for pid, (name, cpu) in now.items():
            if pid in before and name:
                used[name] += cpu - before[pid][1]
        before = now
        print("CPU %", " ".join(f"{name}={seconds * 100:.0f}" for name, seconds in used.most_common(6)), file=sys.stderr, flush=True)
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
