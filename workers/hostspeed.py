"""Time the host-speed probe (`parallab.core.hostspeed`): pure Python, one process per rank on the host.

Every rank times it right before and right after its measured steps (`workers.harness.loop`,
`IN_STEPS` runs each side), so it sees the host's load of the moment the steps saw; the launcher
also times it before torchrun starts the ranks and after they end (`SpeedProbe`), kept where the
ranks did not. It runs in as many processes at once as the run has ranks on the host (`lanes`):
a job of two ranks on a two-core runner slows when another job takes one core, which a
single-threaded probe would not see (it would get the other core to itself). Each lane discards
one warm-up run (CPython specialises its bytecode on the first runs, and the clock may ramp),
then times its runs (about 15–60 ms each on a 2-core CI runner). A sample's rate is the probe's
operations over the lanes' mean time. The mean of the samples, not the best, is kept: the point
is to see the load, not to get past it.
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.pool import Pool
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parallab.core.hostspeed import HostSpeed

# The core's definitions (pydantic) are imported where the rates are computed, not at module level:
# each lane of `SpeedProbe` is a spawned process that imports this module only to run `_lane`, and
# would otherwise import pydantic first (about 0.4 s of CPU a lane, before every launch's ranks).

N = 64
AXPY = 50_000
REPEATS = 5
IN_STEPS = 3
"""Timed runs each side of the measured steps, inside each rank (`workers.harness.loop`)."""
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


def _lane(repeats: int) -> list[float]:
    probe_once()  # warm-up, discarded
    return [probe_once() for _ in range(repeats)]


def rates(repeats: int = REPEATS, *, pool: Pool | None = None, lanes: int = 1) -> list[float]:
    """The probe's rate in ops/s per lane, `repeats` times; `lanes` processes of `pool` at once."""
    from parallab.core.hostspeed import PROBE_OPS

    if pool is None or lanes == 1:
        return [PROBE_OPS / max(t, 1e-9) for t in _lane(repeats)]
    per_lane = pool.map(_lane, [repeats] * lanes, chunksize=1)
    return [PROBE_OPS / max(sum(times) / lanes, 1e-9) for times in zip(*per_lane, strict=True)]


class SpeedProbe:
    """Around one launch: `start()` before the ranks, `stop()` after them. With `lanes` > 1 the
    lanes are spawned processes kept (idle) through the run and closed by `stop()`."""

    def __init__(self, repeats: int = REPEATS, *, lanes: int = 1) -> None:
        self.repeats = repeats
        self.lanes = max(1, lanes)
        self.before: list[float] = []
        self._pool: Pool | None = None

    def start(self) -> None:
        if self.lanes > 1:
            try:
                self._pool = multiprocessing.get_context("spawn").Pool(self.lanes)
            except (AssertionError, OSError):  # a daemonic process may not have children: one lane, said so
                self.lanes = 1
        self.before = rates(self.repeats, pool=self._pool, lanes=self.lanes)

    def stop(self, *, ended: bool = True) -> HostSpeed | None:
        from parallab.core.hostspeed import from_samples

        try:
            if not self.before:
                return None
            after = rates(self.repeats, pool=self._pool, lanes=self.lanes) if ended else []
            return from_samples(self.before, after, lanes=self.lanes)
        finally:
            if self._pool is not None:
                self._pool.terminate()
                self._pool = None
