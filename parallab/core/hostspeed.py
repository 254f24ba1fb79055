"""The host's speed of the moment: a fixed CPU reference measured in the same job as a benchmark.

On a shared CI runner most of the spread between jobs is the host, not the code: other jobs'
load changes between one CI job and the next, and every timing of a job moves with it. A fixed
piece of work timed in the same job measures that speed: every rank times it right before and
right after the measured steps (`where="steps"`, one lane per rank, `workers.harness.loop`), and
the launcher around the whole launch (`where="launch"`, kept only when the ranks did not time
it). A timing divided by it (a throughput ÷ the probe's ops/s, a duration × the probe's ops/s)
keeps what the code changed and cancels what the host's load changed alike for both. The series
shows the raw and the normalised metric side by side, each with its between-job CV, so a team
sees which is quieter on its runner.

The probe is defined by `PROBE` and `PROBE_VERSION`: results of another definition are not
compared (`comparable`). Pure: the model and the arithmetic; the timing is the worker's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PROBE: Literal["py-matmul64-axpy"] = "py-matmul64-axpy"
"""A 64×64 matrix product and a 50 000-element multiply-add loop in pure Python, one thread."""
PROBE_VERSION = 1
PROBE_OPS = 2 * 64**3 + 2 * 50_000
"""Arithmetic operations in one run of the probe (multiply and add counted apart)."""
MAX_OPS_PER_S = 1e12
"""No pure-Python loop on one thread comes within orders of magnitude of this: a larger value is an error."""
MAX_SAMPLES = 64
SCALE = 1e6
"""Normalised metrics are stated per million probe operations (tokens per Mop, step time in Mops)."""


class HostSpeed(BaseModel):
    """The probe's rate around one run (node 0's host), in arithmetic operations per second per lane."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    probe: Literal["py-matmul64-axpy"] = Field(PROBE, description="Which fixed work was timed (`parallab.core.hostspeed.PROBE`).")
    version: int = Field(PROBE_VERSION, ge=1, le=1000, description="The probe's version: another version is another unit.")
    ops: int = Field(PROBE_OPS, ge=1, le=1 << 40, description="Arithmetic operations in one run of the probe.")
    where: Literal["steps", "launch"] = Field(
        "launch",
        description="'steps': timed in every rank right before and after the measured steps; "
        "'launch': in the launcher, before torchrun starts the ranks and after they end.",
    )
    lanes: int = Field(1, ge=1, le=1024, description="Processes that ran the probe at once (the run's ranks on the host).")
    before_ops_per_s: list[float] = Field(
        min_length=1, max_length=MAX_SAMPLES, description="The probe's rate, each run, right before the ranks started."
    )
    after_ops_per_s: list[float] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="The same right after they ended (empty when the run did not end)."
    )
    ops_per_s: float = Field(gt=0, le=MAX_OPS_PER_S, description="The host's speed for this run: the mean of every sample.")

    def model_post_init(self, _context: object) -> None:
        for name in ("before_ops_per_s", "after_ops_per_s"):
            for i, v in enumerate(getattr(self, name)):
                if not 0 < v <= MAX_OPS_PER_S:
                    raise ValueError(f"host_speed.{name}[{i}]: {v!r} is not in (0, {MAX_OPS_PER_S:g}] ops/s")


def from_samples(before: list[float], after: list[float], *, lanes: int = 1, where: Literal["steps", "launch"] = "launch") -> HostSpeed:
    """A HostSpeed from the probe's rates before and after a run."""
    samples = [*before, *after]
    if not samples:
        raise ValueError("host_speed: no probe sample")
    return HostSpeed(before_ops_per_s=before, after_ops_per_s=after, ops_per_s=sum(samples) / len(samples), lanes=lanes, where=where)


def from_ranks(before: list[list[float]], after: list[list[float]]) -> HostSpeed | None:
    """The probe timed inside each rank of one host (one lane each): sample `i` is the mean over
    the ranks of their `i`-th rate. None when no rank timed it."""
    lanes = [(b, a) for b, a in zip(before, after, strict=True) if b]
    if not lanes:
        return None
    n_before, n_after = min(len(b) for b, _ in lanes), min(len(a) for _, a in lanes)
    mean = [sum(b[i] for b, _ in lanes) / len(lanes) for i in range(n_before)]
    mean_after = [sum(a[i] for _, a in lanes) / len(lanes) for i in range(n_after)]
    return from_samples(mean, mean_after, lanes=len(lanes), where="steps")


def comparable(a: HostSpeed, b: HostSpeed) -> bool:
    """Whether two probes measure in the same unit (same definition and version)."""
    return (a.probe, a.version, a.ops, a.lanes, a.where) == (b.probe, b.version, b.ops, b.lanes, b.where)


def normalise(value: float, ops_per_s: float, *, higher_is_better: bool) -> float:
    """A timing metric with the host's speed taken out.

    A throughput (higher is better) is divided by the host's speed: tokens per million probe
    operations. A duration is multiplied by it: the step's length in millions of probe operations.
    Either way a host that runs everything `f` times slower leaves the result unchanged."""
    if not ops_per_s > 0:
        raise ValueError(f"ops_per_s: {ops_per_s!r} is not a positive speed")
    mops = ops_per_s / SCALE
    return value / mops if higher_is_better else value * mops
