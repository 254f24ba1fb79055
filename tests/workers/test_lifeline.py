"""The parent-death signal (workers.lifeline): a wrapped command dies with the process that
started it, even when that process is SIGKILLed and runs no cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from workers import lifeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")


def _parent_with_child(tmp_path, *, wrapped: bool) -> tuple[subprocess.Popen[bytes], int]:
    """A parent process that starts `sleep` in a session of its own (as the launcher starts
    torchrun), wrapped or not; returns the parent and the sleeper's pid."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from workers import lifeline
        cmd = ["sleep", "300"]
        if {wrapped!r}:
            cmd = lifeline.wrap(cmd, parent=os.getpid())
        child = subprocess.Popen(cmd, start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(300)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the parent never started its child"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    # Wait until the wrapper has exec'd `sleep` (its request for the signal is made by then).
    while psutil.Process(child).name() != "sleep":
        assert time.monotonic() < deadline, "the wrapper never exec'd its command"
        time.sleep(0.05)
    return parent, child


def _gone(pid: int, timeout: float = 10) -> bool:
    try:
        proc = psutil.Process(pid)
        proc.wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def test_a_wrapped_command_dies_when_its_parent_is_sigkilled(tmp_path) -> None:
    parent, child = _parent_with_child(tmp_path, wrapped=True)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    assert _gone(child), "the wrapped command outlived its parent"


def test_without_the_wrapper_the_command_outlives_its_parent(tmp_path) -> None:
    """The check can fail: a command in its own session survives its parent's SIGKILL unwrapped."""
    parent, child = _parent_with_child(tmp_path, wrapped=False)
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert not _gone(child, timeout=1), "an unwrapped command should have survived (re-parented)"
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_command_whose_parent_is_already_gone_is_signalled_at_once() -> None:
    """The parent died before the request was made: the wrapper takes the signal itself."""
    proc = subprocess.run(
        [sys.executable, "-m", "workers.lifeline", "--parent", "1", "--signal", "SIGTERM", "--", "sleep", "300"], timeout=30
    )
    assert proc.returncode == -signal.SIGTERM


def test_wrap_keeps_the_command_whole() -> None:
    cmd = ["python", "-m", "torch.distributed.run", "--run-dir", "/x"]
    wrapped = lifeline.wrap(cmd, parent=1234)
    assert wrapped[-len(cmd) :] == cmd and wrapped[wrapped.index("--parent") + 1] == "1234"
