"""The worker's Celery app. Start it with `parallab worker [--pool NAME]` (one per host: it owns the
accelerators). It consumes its pool's queue (`parallab.<pool>`) for runs, and its own queue for
its part of multi-node runs that another worker leads (backend.queue).

Never imports torch: the tasks run torchrun as a subprocess (workers.launcher).
"""

from __future__ import annotations

import logging

from backend.config import get_settings
from backend.queue import RUN_JOB_TASK, RUN_NODE_TASK, make_celery

log = logging.getLogger(__name__)
settings = get_settings()
celery_app = make_celery(settings)


@celery_app.task(name=RUN_JOB_TASK, acks_late=True)
def run_job(run_id: str) -> str:
    """Thin: re-read the run by id and delegate to workers.execute (as the run's node 0)."""
    from workers.execute import execute_run

    status = execute_run(run_id, get_settings())
    log.info("run %s finished: %s", run_id, status)
    return status


@celery_app.task(name=RUN_NODE_TASK, acks_late=True)
def run_node(run_id: str, node_rank: int) -> str:
    """Thin: this worker's reserved part of a multi-node run (workers.execute.execute_node)."""
    from workers.execute import execute_node

    status = execute_node(run_id, node_rank, get_settings())
    log.info("node %d of run %s finished: %s", node_rank, run_id, status)
    return status
