"""A quiet machine for the few measurements that need one, inside a suite run by several xdist workers.

Most timings in the suite are figures, not claims; a test that holds a *timed* difference to a
bound (the reshard diff's parts adding up within 5 % of the step-time difference it explains)
cannot hold it beside the suite's other worker: on two cores the neighbour's torchrun jobs move
each timed step by more than the effect measured. `quiet_machine()` waits until every other
worker of the same run has finished the test it is in, and keeps them from starting another until
it is done; the waiting is printed with the measurement's result.

A readers-writer lock on two files, with the writer first: every test runs holding the *room*
shared, taken through the *gate* (`enter_test`, from a hook around each test's setup, call and
teardown); the quiet measurement takes the gate and then the room exclusively, so a test that
starts meanwhile waits at the gate instead of slipping in ahead of it. The files are named by
xdist's run id, so two pytest sessions on one machine never wait for each other; a serial
session has no neighbour and no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

_ROOM: IO[bytes] | None = None
"""This process's shared hold on the room while one of its tests runs; None between tests."""


def _files(run: str | None = None) -> tuple[Path, Path] | None:
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    base = Path(tempfile.gettempdir()) / f"parallab-quiet-{run}"
    return base.with_suffix(".gate"), base.with_suffix(".room")


def remove_files(run: str) -> None:
    """The run's two lock files, once its workers are done (the xdist controller's session end)."""
    for path in _files(run) or ():
        path.unlink(missing_ok=True)


def _lock(path: Path, mode: int) -> IO[bytes]:
    handle = path.open("ab")
    fcntl.flock(handle, mode)
    return handle


def _release(handle: IO[bytes]) -> None:
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def enter_test() -> None:
    """Take the room shared for one test (through the gate: after any quiet measurement waiting)."""
    global _ROOM
    files = _files()
    if files is None or _ROOM is not None:
        return
    gate, room = files
    passing = _lock(gate, fcntl.LOCK_EX)
    try:
        _ROOM = _lock(room, fcntl.LOCK_SH)
    finally:
        _release(passing)


def leave_test() -> None:
    """Give the room back after a test."""
    global _ROOM
    if _ROOM is not None:
        _release(_ROOM)
        _ROOM = None


@contextlib.contextmanager
def quiet_machine() -> Iterator[float]:
    """Run the block while no other worker of this run is inside a test; yields the seconds waited."""
    files = _files()
    if files is None:
        yield 0.0
        return
    held = _ROOM is not None
    leave_test()  # this worker's own test must not hold the room against itself
    start = time.monotonic()
    gate = _lock(files[0], fcntl.LOCK_EX)
    try:
        room = _lock(files[1], fcntl.LOCK_EX)
        try:
            yield time.monotonic() - start
        finally:
            _release(room)
    finally:
        _release(gate)
        if held:
            enter_test()
