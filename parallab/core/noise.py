"""What else the host was doing while a run ran, and whether that makes its times suspect.

The launcher samples the host before the ranks start and after they end (`workers.noise`) and
the result document keeps it as `noise`. A run is *noisy* when:

- it had more ranks on the host than physical cores (ranks then share cores: their step times
  measure the sharing, not the strategy);
- the host was already busy: the 1-minute load average before the launch plus the run's own
  ranks exceeds the logical CPUs (more runnable work than CPUs, so someone waits);
- the hypervisor stole more than `STEAL_HIGH` of the CPU time during the run;
- other jobs (torchrun launchers) ran on the host beside it.

Each reason is a sentence a page shows; none of them changes a measured number.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

STEAL_HIGH = 0.05
"""Above this share of CPU time taken by the hypervisor, a run's times are suspect (cloud
guidance treats sustained steal of a few percent as contention)."""


class HostNoise(BaseModel):
    """The host around one run (node 0's host), sampled before the launch and after the end."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    load_avg_1m_start: float = Field(ge=0, description="The 1-minute load average before the ranks started (/proc/loadavg).")
    load_avg_1m_end: float = Field(ge=0, description="The 1-minute load average when they had ended (includes the run's own ranks).")
    cpu_steal_fraction: float | None = Field(None, ge=0, le=1, description="CPU time the hypervisor took during the run (/proc/stat).")
    cpu_busy_fraction: float | None = Field(None, ge=0, le=1, description="Host CPU time spent busy during the run, every process's.")
    logical_cpus: int = Field(ge=1, le=1 << 20)
    physical_cores: int | None = Field(None, ge=1, le=1 << 20)
    ranks_on_host: int = Field(ge=1, le=1 << 16, description="The run's ranks on this host.")
    co_running_jobs: int = Field(0, ge=0, le=1 << 20, description="Other torchrun jobs seen on the host (the larger of before and after).")
    duration_s: float | None = Field(None, ge=0, description="Seconds between the two samples.")


def noisy_reasons(noise: HostNoise | dict[str, object] | None) -> list[str]:
    """Why a run's host was noisy (empty: it was not, or nothing was recorded)."""
    if noise is None:
        return []
    n = noise if isinstance(noise, HostNoise) else HostNoise.model_validate(noise)
    reasons = []
    if n.physical_cores is not None and n.ranks_on_host > n.physical_cores:
        reasons.append(f"{n.ranks_on_host} ranks on {n.physical_cores} physical cores")
    if n.load_avg_1m_start + n.ranks_on_host > n.logical_cpus:
        reasons.append(f"load {n.load_avg_1m_start:.1f} before the start + {n.ranks_on_host} ranks on {n.logical_cpus} CPUs")
    if n.cpu_steal_fraction is not None and n.cpu_steal_fraction > STEAL_HIGH:
        reasons.append(f"{n.cpu_steal_fraction:.0%} of the CPU stolen by the hypervisor")
    if n.co_running_jobs:
        reasons.append(f"{n.co_running_jobs} other job(s) on the host")
    return reasons
