"""Time the host-speed probe (`parallab.core.hostspeed`) in this process: pure Python, one thread.

The launcher runs it right before torchrun starts the ranks and right after they end, so it sees
the host's load of the moment that the run's timings saw. Each side takes `REPEATS` runs of the
probe (about 25–80 ms each on a 2-core CI runner; a few hundred ms for the pair). The mean of the
rates, not the best, is kept: the point is to see the load, not to get past it.
"""

from __future__ import annotations

import time

from parallab.core.hostspeed import PROBE_OPS, HostSpeed, from_samples

N = 64
AXPY = 50_000
REPEATS = 5
_A = [[((i * 7 + j * 3) % 11) / 11.0 for j in range(N)] for i in range(N)]
_B = [[((i * 5 + j * 2) % 13) / 13.0 for j in range(N)] for i in range(N)]
_X = [(i % 17) / 17.0 for i in range(AXPY)]


def probe_once() -> float:
    """Seconds for one run of the probe (`PROBE_OPS` operations)."""
    start = time.perf_counter()
    b_t = list(zip(*_B, strict=True))
    c = [[sum(x * y for x, y in zip(row, col, strict=True)) for col in b_t] for row in _A]
    y = [0.0] * AXPY
    for i, x in enumerate(_X):
        y[i] = 1.0001 * x + y[i]
    elapsed = time.perf_counter() - start
    if c[0][0] < 0 or y[-1] < 0:  # keep the work observable
        raise AssertionError("unreachable")
    return elapsed


def rates(repeats: int = REPEATS) -> list[float]:
    """The probe's rate in ops/s, `repeats` times."""
    return [PROBE_OPS / max(probe_once(), 1e-9) for _ in range(repeats)]


class SpeedProbe:
    """Around one launch: `start()` before the ranks, `stop()` after them."""

    def __init__(self, repeats: int = REPEATS) -> None:
        self.repeats = repeats
        self.before: list[float] = []

    def start(self) -> None:
        self.before = rates(self.repeats)

    def stop(self, *, ended: bool = True) -> HostSpeed | None:
        if not self.before:
            return None
        return from_samples(self.before, rates(self.repeats) if ended else [])
