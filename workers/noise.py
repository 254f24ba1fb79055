"""Sample the host before a launch and after it ends: load, CPU steal, other jobs.

Read from /proc (Linux); where a file is missing (another OS, a locked-down container) the field
is left out rather than guessed. The judgement is `parallab.core.noise`'s.

A worker samples in-process around its torchrun (`workers.launcher.launch`). A Slurm job's batch
script, on its first node, samples around its `srun` with two commands (the sample in between is
kept in a file):

    python -m workers.noise start STATE --ranks N
    python -m workers.noise stop STATE --out noise.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from parallab.core.noise import HostNoise

PROC = Path("/proc")
LAUNCHERS = (b"torch.distributed.run", b"torchrun")
"""How a torchrun launcher's command line reads: what counts as another job on the host."""


def load_average(proc: Path = PROC) -> float | None:
    """The 1-minute load average."""
    try:
        return float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_times(proc: Path = PROC) -> tuple[int, int, int] | None:
    """(total, idle + iowait, steal) jiffies of all CPUs since boot (/proc/stat's `cpu` line)."""
    try:
        fields = (proc / "stat").read_text().splitlines()[0].split()
        values = [int(v) for v in fields[1:]]
    except (OSError, ValueError, IndexError):
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user
    total = sum(values[:8])
    return total, values[3] + (values[4] if len(values) > 4 else 0), values[7] if len(values) > 7 else 0


def physical_cores(proc: Path = PROC) -> int | None:
    """Distinct (package, core) pairs in /proc/cpuinfo; None where it does not say."""
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return None
    cores, package = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            package = value.strip()
        elif key.strip() == "core id":
            cores.add((package, value.strip()))
    return len(cores) or None


def launchers(proc: Path = PROC, exclude: Collection[int] = ()) -> int:
    """torchrun launchers running on the host, not counting the processes in `exclude`."""
    count = 0
    for entry in proc.iterdir() if proc.exists() else ():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # the launcher itself (python -m torch.distributed.run / torchrun), not its ranks or a shell that names it
        if any(arg in LAUNCHERS or arg.endswith(b"/torchrun") for arg in argv[:3]):
            count += 1
    return count


@dataclass
class NoiseSampler:
    """Take `start()` before the launch and `stop()` after the ranks ended."""

    ranks_on_host: int
    proc: Path = PROC
    _load: float | None = None
    _cpu: tuple[int, int, int] | None = None
    _jobs: int = 0
    _t0: float = 0.0

    def start(self) -> None:
        self._load, self._cpu, self._t0 = load_average(self.proc), cpu_times(self.proc), time.monotonic()
        self._jobs = launchers(self.proc)

    def stop(self, exclude: Collection[int] = ()) -> HostNoise | None:
        """The record of the run; None when the host's load could not be read."""
        end_load, end_cpu = load_average(self.proc), cpu_times(self.proc)
        if self._load is None or end_load is None:
            return None
        steal = busy = None
        if self._cpu is not None and end_cpu is not None and end_cpu[0] > self._cpu[0]:
            total = end_cpu[0] - self._cpu[0]
            steal = min(max((end_cpu[2] - self._cpu[2]) / total, 0.0), 1.0)
            busy = min(max(1 - (end_cpu[1] - self._cpu[1]) / total, 0.0), 1.0)
        return HostNoise(
            load_avg_1m_start=self._load,
            load_avg_1m_end=end_load,
            cpu_steal_fraction=steal,
            cpu_busy_fraction=busy,
            logical_cpus=os.cpu_count() or 1,
            physical_cores=physical_cores(self.proc),
            ranks_on_host=self.ranks_on_host,
            co_running_jobs=max(self._jobs, launchers(self.proc, exclude)),
            duration_s=time.monotonic() - self._t0,
        )

    def save(self, path: Path) -> None:
        """What `start` sampled, for a `stop` in another process on this host (CLOCK_MONOTONIC is the host's)."""
        path.write_text(
            json.dumps({"ranks_on_host": self.ranks_on_host, "load": self._load, "cpu": self._cpu, "jobs": self._jobs, "t0": self._t0})
        )

    @classmethod
    def load(cls, path: Path) -> NoiseSampler:
        state = json.loads(path.read_text())
        sampler = cls(ranks_on_host=int(state["ranks_on_host"]))
        sampler._load, sampler._jobs, sampler._t0 = state["load"], int(state["jobs"]), float(state["t0"])
        sampler._cpu = tuple(state["cpu"]) if state["cpu"] is not None else None  # type: ignore[assignment]
        return sampler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.noise", description="Sample this host around a launch.")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="Sample now, into STATE.")
    start.add_argument("state", type=Path)
    start.add_argument("--ranks", type=int, required=True, help="The job's ranks on this host.")
    stop = commands.add_parser("stop", help="Sample again and write the run's HostNoise.")
    stop.add_argument("state", type=Path)
    stop.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "start":
        sampler = NoiseSampler(ranks_on_host=args.ranks)
        sampler.start()
        sampler.save(args.state)
        return 0
    noise = NoiseSampler.load(args.state).stop()
    if noise is None:
        print("noise: the host's load could not be read", file=sys.stderr)
        return 1
    args.out.write_text(noise.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
