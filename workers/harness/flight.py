"""The rank's flight recorder, dumped into the run directory when the rank fails or is stopped.

torch keeps it: with `TORCH_FR_BUFFER_SIZE` > 0 (the launcher sets it for every run,
`workers.launcher.FLIGHT_RECORDER_ENTRIES`) every collective a process group issues — gloo's as
well as NCCL's in torch 2.13 — is recorded in a ring of that many entries: group, sequence
number, op, sizes, dtypes, creation time. Nothing is written while the run goes well.

When the rank fails (an exception: a collective's timeout, a peer's broken connection, any error)
`dump` writes it; when the rank is stopped (torchrun's SIGTERM after another rank died, the
worker's timeout or cancel) so does `arm`'s watcher. A rank stuck inside a collective never
returns to Python, so a Python signal handler alone would never run: `signal.set_wakeup_fd` has
the interpreter's C-level handler write the signal's number to a socket at once, from whatever
thread receives it, and a daemon thread waiting on that socket writes the dump and exits the
process with 128 + the signal's number, as the default action would have.

The file (`RunDir.flight(rank)`) is torch's JSON dump inside an envelope
(`parallab.core.hangs.Dump`): the run and rank that wrote it, why, and the ranks of each of the
rank's process groups (torch's gloo dump leaves them out). `parallab.core.hangs.analyse` reads
every rank's file.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import torch.distributed as dist

from parallab.core.hangs import FORMAT
from parallab.core.rundir import RunDir


def _torch_dump(backend: str) -> dict[str, Any]:
    """torch's flight-recorder dump of this process (NCCL's own recorder on NCCL ranks)."""
    from torch._C import _distributed_c10d as c10d

    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    dump = nccl if backend == "nccl" and nccl is not None else getattr(c10d, "_dump_fr_trace_json")  # noqa: B009 — not in torch's stubs
    text = dump(True, False)  # every entry, the completed ones too
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def process_groups() -> dict[str, dict[str, Any]]:
    """This rank's process groups by torch's group name: their description and global ranks."""
    if not dist.is_initialized():
        return {}
    world = dist.distributed_c10d._world
    out: dict[str, dict[str, Any]] = {}
    for pg, name in world.pg_names.items():
        ranks = world.pg_group_ranks.get(pg, {})
        out[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""), "ranks": sorted(int(r) for r in ranks)}
    return out


class Recorder:
    """One rank's dump, written at most once (the first failure or signal wins)."""

    def __init__(self, run_dir: RunDir, *, rank: int, world_size: int, backend: str):
        self.run_dir, self.rank, self.world_size, self.backend = run_dir, rank, world_size, backend
        self._lock = threading.Lock()
        self._tried = False
        self.path: Path | None = None

    def dump(self, reason: str) -> Path | None:
        """Write this rank's dump (once: a second call waits for the first to finish, then writes
        nothing); None when it wrote nothing."""
        with self._lock:
            if self._tried:
                return None
            self._tried = True
            return self._write(reason)

    def _write(self, reason: str) -> Path | None:
        try:
            document = {
                "format": FORMAT,
                "run": self.run_dir.path.name,
                "rank": self.rank,
                "world_size": self.world_size,
                "reason": reason[:500],
                "groups": process_groups(),
                "torch": _torch_dump(self.backend),
            }
            target = self.run_dir.flight(self.rank)
            self.run_dir.write_atomic(target, json.dumps(document, separators=(",", ":")).encode())
            self.path = target
            return target
        except Exception as exc:  # noqa: BLE001 — a dump is evidence, never a second failure
            print(f"parallab: could not write the flight-recorder dump: {exc}", file=sys.stderr, flush=True)
            return None

    def arm(self) -> None:
        """Dump and exit on SIGTERM, even while the main thread waits inside a collective."""
        if threading.current_thread() is not threading.main_thread():
            return
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)

        def stopped(signum: int) -> None:
            self.dump(f"stopped by {signal.Signals(signum).name}")
            os._exit(128 + signum)

        def on_signal(signum: int, _frame: object) -> None:  # runs only if the main thread is in Python
            stopped(signum)

        def watch() -> None:
            while True:
                select.select([reader], [], [])
                try:
                    data = reader.recv(64)
                except BlockingIOError:
                    continue
                if signal.SIGTERM in data:
                    stopped(signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_signal)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._keep = (reader, writer)  # the sockets live as long as the recorder
        threading.Thread(target=watch, name="parallab-flight", daemon=True).start()
