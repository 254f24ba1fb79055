"""The worker's Celery app. Start it with `parallab worker` (one per host: it owns the accelerators).

Never imports torch: the task runs torchrun as a subprocess (workers.launcher).
"""

from __future__ import annotations

import logging

from backend.config import get_settings
from backend.queue import RUN_JOB_TASK, make_celery

log = logging.getLogger(__name__)
settings = get_settings()
celery_app = make_celery(settings)


@celery_app.task(name=RUN_JOB_TASK, acks_late=True)
def run_job(run_id: str) -> str:
    """Thin: re-read the run by id and delegate to workers.execute."""
    from workers.execute import execute_run

    status = execute_run(run_id, get_settings())
    log.info("run %s finished: %s", run_id, status)
    return status
