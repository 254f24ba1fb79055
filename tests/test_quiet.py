"""The quiet machine's lock (`tests.quiet`) across processes, as two xdist workers hold it: a quiet
measurement waits for the test another worker is in, and a test that starts meanwhile waits for
the measurement. The order of events is asserted, never their durations."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import quiet

HOLDER = """
import sys, time
from pathlib import Path
from tests import quiet
log = Path(sys.argv[1])
log.with_suffix(".try").write_text(str(time.time()))
quiet.enter_test()
log.write_text(f"in {time.time()}\\n")
time.sleep(float(sys.argv[2]))
with log.open("a") as f:
    f.write(f"out {time.time()}\\n")
quiet.leave_test()
"""


def other_worker(log: Path, seconds: float, run: str) -> subprocess.Popen[bytes]:
    env = {"PYTEST_XDIST_TESTRUNUID": run, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(log), str(seconds)], env=env)


def times(log: Path) -> dict[str, float]:
    return {word: float(t) for word, t in (line.split() for line in log.read_text().splitlines())}


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"the other worker never wrote {path.name}"
        time.sleep(0.05)


@pytest.fixture
def run_id(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A run of its own, with this process's hold on the suite's real room set aside meanwhile."""
    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    monkeypatch.setattr(quiet, "_ROOM", None)
    yield run
    quiet.remove_files(run)
    assert not any(path.exists() for path in quiet._files(run) or ())


def test_a_quiet_measurement_waits_for_the_test_another_worker_is_in(tmp_path: Path, run_id: str) -> None:
    log = tmp_path / "other.log"
    other = other_worker(log, 1.0, run_id)
    wait_for(log)
    with quiet.quiet_machine():
        began = time.time()
    assert other.wait(60) == 0
    assert times(log)["out"] <= began


def test_a_test_that_starts_during_a_quiet_measurement_waits_for_its_end(tmp_path: Path, run_id: str) -> None:
    log = tmp_path / "other.log"
    with quiet.quiet_machine():
        other = other_worker(log, 0.0, run_id)
        wait_for(log.with_suffix(".try"))  # about to take the gate
        time.sleep(0.5)
        assert not log.exists(), "a test started inside the quiet measurement"
        ended = time.time()
    assert other.wait(60) == 0
    assert times(log)["in"] >= ended


def test_the_measuring_workers_own_test_does_not_hold_the_room_against_it(run_id: str) -> None:
    quiet.enter_test()  # as the hook does around the test that asks for quiet
    try:
        with quiet.quiet_machine() as waited:
            assert waited >= 0
        assert quiet._ROOM is not None  # its test holds the room again afterwards
    finally:
        quiet.leave_test()


def test_a_serial_session_has_no_neighbour_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    with quiet.quiet_machine() as waited:
        assert waited == 0.0
