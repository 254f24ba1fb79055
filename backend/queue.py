"""The Celery app's configuration, shared by the API (which only sends tasks by name) and the
worker (which registers them in `workers.celery_app`). No torch, no training code here.

Queues: pool P is consumed from `<settings.broker.queue>.<P>` (e.g. `parallab.cpu`,
`parallab.h100x8`) by every worker of that pool; each worker also consumes its own queue
`<settings.broker.queue>.worker.<id>`, where the worker that leads a multi-node job sends each reserved
host its part.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from celery import Celery

from backend.config import Settings

log = logging.getLogger(__name__)

RUN_JOB_TASK = "parallab.run_job"
RUN_NODE_TASK = "parallab.run_node"
"""One host's part of a multi-node job, sent to that host's worker queue."""


def pool_queue(settings: Settings, pool: str) -> str:
    return f"{settings.broker.queue}.{pool}"


def worker_queue(settings: Settings, worker_id: str) -> str:
    return f"{settings.broker.queue}.worker.{worker_id}"


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
        task_default_queue=pool_queue(settings, settings.worker.pool or settings.worker.default_pool or "cpu"),
        broker_connection_retry_on_startup=True,
        # A broker blip must not end the worker: keep reconnecting (None: for ever), and let a
        # running job go on while the connection is down (its lease lives in the database).
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
    )
    if settings.celery_broker_url.startswith(("redis", "rediss")):
        app.conf.broker_transport_options = {
            # Longer than the longest job, or Redis would hand an unacked job to a second worker.
            "visibility_timeout": settings.worker.max_job_seconds * 2 + 600,
            # A dead or hung Redis answers within seconds (the API's 503), never hangs a request.
            "socket_connect_timeout": 5,
            "socket_timeout": 15,
        }
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


PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}


def _send(settings: Settings, task: str, args: list[object], *, queue: str, attempts: int = 3, expires: float | None = None) -> None:
    """Send a task by name. kombu's SQLite transport can fail a publish outside its retry policy: a
    worker starting at the same moment inserts the same queue row (IntegrityError), and the failed
    session stays unusable. Such a client is dropped and the send tried again on a fresh one."""
    key = settings.model_dump_json()
    for attempt in range(attempts):
        try:
            _client(key).send_task(task, args=args, queue=queue, retry=True, retry_policy=PUBLISH_RETRY, expires=expires)
            return
        except Exception:
            _client.cache_clear()
            if attempt == attempts - 1:
                raise


def enqueue_run(settings: Settings, run_id: str, *, pool: str | None = None, attempts: int = 3) -> None:
    """Queue a run on its pool's queue; called only after the run row is committed."""
    _send(settings, RUN_JOB_TASK, [run_id], queue=pool_queue(settings, pool or settings.worker.default_pool or "cpu"), attempts=attempts)


def send_node(settings: Settings, *, worker_id: str, run_id: str, node_rank: int) -> None:
    """Tell a reserved worker to start its part of a multi-node run (the message expires with the reservation)."""
    _send(
        settings, RUN_NODE_TASK, [run_id, node_rank], queue=worker_queue(settings, worker_id), expires=settings.worker.reservation_timeout_s
    )


def queue_lengths(settings: Settings, pools: list[str]) -> dict[str, int | None]:
    """Messages waiting in each pool's queue; None for all when the broker cannot be asked."""
    if not pools:
        return {}
    try:
        with _client(settings.model_dump_json()).connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            out: dict[str, int | None] = {}
            for pool in pools:
                try:
                    out[pool] = int(channel.queue_declare(queue=pool_queue(settings, pool), passive=True).message_count)
                except Exception:  # a queue nobody has sent to yet (Redis drops empty lists)
                    out[pool] = 0
                    channel = conn.channel()  # a refused passive declare may close the channel
            return out
    except Exception as exc:
        log.warning("could not read queue lengths: %s", exc)
        _client.cache_clear()
        return dict.fromkeys(pools)
