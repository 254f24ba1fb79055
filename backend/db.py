"""Engine and session factory. One engine per database URL; sessions are short and explicit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import pydantic_core
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from backend.config import get_settings


def json_dumps(value: Any) -> str:
    """JSON for the JSON columns, by pydantic-core: a wide result document in about a millisecond,
    where `json.dumps` takes several and holds the GIL throughout, stalling the event loop (issue
    #12). NaN and infinities are written as `json.dumps` writes them."""
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    """The engine for `url`, its connection pool sized by the settings (`db_pool_*`): a request that
    cannot get a connection within `db_pool_timeout_s` fails fast (503, see `api.errors`) rather than
    waiting out SQLAlchemy's default 30 s while the caller's client gives up."""
    settings = get_settings()
    kwargs: dict = {"pool_pre_ping": True, "json_serializer": json_dumps}
    parsed = make_url(url)
    if not (parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")):  # one shared connection there
        kwargs.update(
            pool_size=settings.database.db_pool_size,
            max_overflow=settings.database.db_max_overflow,
            pool_timeout=settings.database.db_pool_timeout_s,
        )
    if url.startswith("sqlite"):
        # The API serves from a thread pool; the worker writes from another process.
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    return engine


@lru_cache(maxsize=8)
def get_sessionmaker(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    session = get_sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
