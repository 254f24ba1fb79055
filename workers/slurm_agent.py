"""`parallab slurm-agent --pool NAME`: the Slurm pool's driver of the run coordinator, on the cluster's login node.

The scheduler agent (`workers.scheduler_agent`) over the Slurm engine (`workers.engines.slurm`),
one round every `slurm_poll_s`: a queued run's job is `sbatch`ed (a job Slurm refuses, an unknown
partition, fails its run with Slurm's own message); every watched job's state is read in one
`squeue` (PENDING with Slurm's reason keeps the run queued) and a cancelled run's job
`scancel`ed. On start it reconciles: jobs of the pool that Slurm knows by name and comment but the
ledger lacks are adopted, or cancelled when their run already ended; a watched job that Slurm no
longer knows ends its run `failed`, saying it vanished.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from backend.config import Settings
from parallab.core.ledger import Ledger
from parallab.core.pools import SlurmPool
from workers.engines.base import EngineState
from workers.engines.slurm import SlurmEngine, SlurmHandle, SlurmUnavailable, read_noise
from workers.scheduler_agent import NoSuchPool, SchedulerAgent

__all__ = ["NoSuchPool", "SlurmAgent", "read_noise"]

log = logging.getLogger(__name__)


class SlurmAgent(SchedulerAgent[SlurmHandle]):
    """Submits, watches, cancels and stores the runs of one Slurm pool."""

    pool_settings = SlurmPool
    engine_class = SlurmEngine
    job_handle = SlurmHandle
    unavailable = SlurmUnavailable
    label, job_noun = "Slurm", "Slurm job"
    engine: SlurmEngine

    def __init__(self, settings: Settings, pool: str, ledger: Ledger | None = None):
        super().__init__(settings, pool, ledger, poll_s=settings.worker.slurm_poll_s)

    def _states(self, handles: list[SlurmHandle]) -> Callable[[SlurmHandle], EngineState]:
        """Every watched job's state in one `squeue`."""
        return self.engine.states(handles).__getitem__

    def _cancel(self, handle: SlurmHandle, reason: str = "cancelled") -> None:
        """`scancel` a job; Slurm not answering leaves it for the next round."""
        try:
            self.engine.cancel(handle, reason)
        except SlurmUnavailable as exc:
            log.warning("could not cancel Slurm job %s (%s); trying again next round", handle.job_id, exc)
