"""Keep a child process running, as compose's `restart: unless-stopped` keeps a container.

`parallab up` runs its worker under a `Supervisor`: a worker that dies (OOM-killed, a crash) is
started again after a short backoff that doubles while it keeps dying (and resets once it has
lived `stable_s`), each restart logged. The new worker reconciles at start-up, so whatever the
dead one held is failed and reaped before it takes a job.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

from workers.launcher import stop_process_group

Child = subprocess.Popen[bytes]


def exit_text(code: int | None) -> str:
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


class Supervisor(threading.Thread):
    """Runs `start()` and starts it again whenever the process it returned exits, until `stop()`."""

    def __init__(
        self,
        start: Callable[[], Child],
        *,
        name: str,
        say: Callable[[str], None],
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stable_s: float = 60.0,
        poll_s: float = 0.5,
    ):
        super().__init__(name=f"supervise-{name}", daemon=True)
        self.start_child, self.what, self.say = start, name, say
        self.backoff_s, self.max_backoff_s, self.stable_s, self.poll_s = backoff_s, max_backoff_s, stable_s, poll_s
        self.restarts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.proc: Child = start()
        self._started_at = time.monotonic()

    def run(self) -> None:
        delay = self.backoff_s
        while not self._stopping.is_set():
            code = self.proc.poll()
            if code is None:
                self._stopping.wait(self.poll_s)
                continue
            lived = time.monotonic() - self._started_at
            delay = self.backoff_s if lived >= self.stable_s else delay
            self.say(f"{self.what} (pid {self.proc.pid}) stopped: {exit_text(code)}; starting it again in {delay:.0f} s")
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                self.proc = self.start_child()
                self._started_at = time.monotonic()
                self.restarts += 1
            self.say(f"{self.what} started again (pid {self.proc.pid}, restart {self.restarts})")
            delay = min(delay * 2, self.max_backoff_s)

    def stop(self, grace_s: float = 20) -> None:
        """Stop supervising and stop the child (its whole process group)."""
        with self._lock:
            self._stopping.set()
        stop_process_group(self.proc, grace_s=grace_s)
        self.join(timeout=self.poll_s + 5)
