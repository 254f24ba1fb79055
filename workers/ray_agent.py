"""`parallab ray-agent --pool NAME`: the Ray pool's driver of the run coordinator, beside the lab (or on the cluster's head).

The scheduler agent (`workers.scheduler_agent`) over the Ray engine (`workers.engines.ray_cluster`),
one round every `poll_s`: a queued run's placement group is placed and its rank actors started,
the placement group recorded as its job (a job the cluster cannot place, or an entry point this
agent does not allow, fails its run saying why; an actor that could not start fails it saying so;
the cluster not answering leaves the run queued); a cancelled run's actors are stopped and its
placement group removed. The actors and placement groups are detached and named after their runs,
so on start the agent reconciles: a run's actors the ledger lacks are adopted, or stopped when
their run already ended; a watched run whose actors are gone ends `failed`, saying which rank's.
"""

from __future__ import annotations

from backend.config import Settings
from parallab.core.ledger import Ledger
from parallab.core.pools import RayPool
from workers.engines.ray_cluster import RayEngine, RayHandle, RayUnavailable
from workers.scheduler_agent import NoSuchPool, SchedulerAgent

__all__ = ["NoSuchPool", "RayAgent"]


class RayAgent(SchedulerAgent[RayHandle]):
    """Launches, watches, cancels and stores the runs of one Ray pool."""

    pool_settings = RayPool
    engine_class = RayEngine
    job_handle = RayHandle
    unavailable = RayUnavailable
    label, job_noun = "Ray", "Ray placement group"
    start_failure = "could not start the ranks on Ray"

    def __init__(self, settings: Settings, pool: str, ledger: Ledger | None = None, *, poll_s: float = 2.0):
        super().__init__(settings, pool, ledger, poll_s=poll_s)
