"""Processes that die with their parent: the torchrun agent with its worker, each rank with its agent.

A worker that is SIGKILLed (or OOM-killed) runs no cleanup. Its torchrun agent leads a session of
its own (so that a cancel can take the whole group down), and torchrun starts every rank in yet
another session, so nothing of the job would notice: the ranks would be re-parented to PID 1 and
keep training. Linux's parent-death signal closes that gap without any polling:

- the launcher starts torchrun through `python -m workers.lifeline --parent PID -- CMD...`, which
  asks for SIGTERM on its parent's death and then execs CMD (the request survives exec): the
  agent gets SIGTERM when the worker dies and stops its ranks as on a cancel;
- each rank asks for SIGKILL on its own parent's death at start-up (`die_with_parent`), so the
  ranks go even when the agent itself is killed outright.

Both check the parent once more after asking: a parent that died before the request was made
sends no signal. Elsewhere than Linux this is a no-op (the worker's reaper still kills orphans).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int, *, parent: int | None = None) -> bool:
    """Ask the kernel for `sig` when this process's parent dies; if it is already gone (re-parented
    to another process than `parent`, or to PID 1), take `sig` now. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    ppid = os.getppid()
    if ppid == 1 or (parent is not None and ppid != parent):
        os.kill(os.getpid(), sig)
    return True


def wrap(command: list[str], *, parent: int, sig: signal.Signals = signal.SIGTERM) -> list[str]:
    """`command`, run so that it gets `sig` when process `parent` dies."""
    return [sys.executable, "-m", "workers.lifeline", "--parent", str(parent), "--signal", sig.name, "--", *command]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workers.lifeline", description="Run a command that dies with this process's parent.")
    parser.add_argument("--parent", type=int, required=True, help="the pid whose death must signal the command")
    parser.add_argument("--signal", default="SIGTERM", choices=[s.name for s in signal.Signals])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    die_with_parent(signal.Signals[args.signal], parent=args.parent)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
