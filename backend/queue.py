"""The Celery app's configuration, shared by the API (which only sends tasks by name) and the
worker (which registers them in `workers.celery_app`). No torch, no training code here."""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from backend.config import Settings

RUN_JOB_TASK = "parallab.run_job"


def make_celery(settings: Settings) -> Celery:
    settings.ensure_home()
    app = Celery("parallab", broker=settings.celery_broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_track_started=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_default_queue=settings.queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    if settings.celery_broker_url.startswith(("redis", "rediss")):
        # Longer than the longest job, or Redis would hand an unacked job to a second worker.
        app.conf.broker_transport_options = {"visibility_timeout": settings.max_job_seconds * 2 + 600}
    else:
        # kombu's SQLAlchemy transport hands its transport options to create_engine: wait for the
        # worker's short polling locks instead of failing after SQLite's default 5 s.
        app.conf.broker_transport_options = {"connect_args": {"timeout": 30}}
        app.conf.broker_polling_interval = 0.5
    return app


@lru_cache(maxsize=4)
def _client(settings_json: str) -> Celery:
    """One client per distinct configuration (settings aren't hashable; their JSON is)."""
    return make_celery(Settings.model_validate_json(settings_json))


PUBLISH_RETRY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}


def enqueue_run(settings: Settings, run_id: str, *, attempts: int = 3) -> None:
    """Send the job by name; called only after the run row is committed.

    kombu's SQLite transport can fail a publish outside its retry policy: a worker starting at
    the same moment inserts the same queue row (IntegrityError), and the failed session stays
    unusable. Such a client is dropped and the send tried again on a fresh one.
    """
    key = settings.model_dump_json()
    for attempt in range(attempts):
        try:
            _client(key).send_task(RUN_JOB_TASK, args=[run_id], queue=settings.queue, retry=True, retry_policy=PUBLISH_RETRY)
            return
        except Exception:
            _client.cache_clear()
            if attempt == attempts - 1:
                raise
