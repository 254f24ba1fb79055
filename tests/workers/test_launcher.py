"""The launcher: the ranks' command line, and its file followers (progress lines arrive whole,
log tails stay bounded)."""

from __future__ import annotations

import json
import sys

import pytest

from parallab.core.jobs import Limits, resolve_job
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from workers import launcher
from workers.hostspeed import SpeedProbe
from workers.launcher import ProgressTail, read_log_tail, torchrun_command


def test_the_ranks_get_the_job_file_and_the_trace_cap(tmp_path) -> None:
    job = resolve_job(JobSpec.model_validate({"strategy": {"name": "fsdp", "world_size": 2}}), Limits())
    run_dir = RunDir(tmp_path)
    cmd = torchrun_command(job, run_dir, trace_cap_bytes=4096, cache_dir=None)
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("--job") + 1] == str(run_dir.job)
    assert cmd[cmd.index("--trace-cap-bytes") + 1] == "4096"
    assert "--cache-dir" not in cmd and "--spec" not in cmd
    assert torchrun_command(job, run_dir, trace_cap_bytes=4096, cache_dir=tmp_path / "c")[-2:] == ["--cache-dir", str(tmp_path / "c")]


def test_progress_tail_returns_only_complete_new_lines(tmp_path) -> None:
    path = RunDir(tmp_path).progress
    tail = ProgressTail(path)
    assert tail.poll() is None  # no file yet
    path.write_text(json.dumps({"phase": "warmup", "step": 0}) + "\n" + '{"phase": "tr')
    assert tail.poll() == {"phase": "warmup", "step": 0}
    assert tail.poll() is None  # the half-written line is not read
    with path.open("a") as fh:
        fh.write('ain", "step": 0}\n' + json.dumps({"phase": "train", "step": 1}) + "\n")
    assert tail.poll() == {"phase": "train", "step": 1}
    assert tail.latest == {"phase": "train", "step": 1}


def test_log_tail_keeps_the_last_lines(tmp_path) -> None:
    log = RunDir(tmp_path).log
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    tail = read_log_tail(log, lines=5)
    assert tail.splitlines() == [f"line {i}" for i in range(995, 1000)]
    assert read_log_tail(tmp_path / "missing.log") == ""


def test_the_launch_ends_when_torchrun_exits_not_at_the_next_poll(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll interval far beyond the suite's timeout: the launch returns only because it waits on
    the process itself, and it still runs its checks once after the exit, as each poll does."""
    job = resolve_job(JobSpec.model_validate({"strategy": {"name": "single", "world_size": 1}}), Limits())
    monkeypatch.setattr(launcher, "torchrun_command", lambda *args, **kwargs: [sys.executable, "-c", "print('ranks done')"])
    monkeypatch.setattr(launcher, "SpeedProbe", lambda lanes: SpeedProbe(repeats=1))  # the probe's own cost: not this test's
    checks: list[int] = []

    def cancel() -> bool:
        checks.append(1)
        return False

    outcome = launcher.launch(job, RunDir(tmp_path), timeout_s=7200, trace_cap_bytes=0, poll_s=3600, should_cancel=cancel)
    assert outcome.ok and outcome.returncode == 0 and "ranks done" in outcome.log_tail
    assert checks == [1]
