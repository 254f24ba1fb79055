"""All of parallab's settings, in one pydantic-settings class (prefix ``PARALLAB_``).

Nothing else reads ``os.environ``: the API, the Celery app, Alembic and the CLI all call
:func:`get_settings`. The embedded default (SQLite + a serverless Celery transport under
``PARALLAB_HOME``) needs no server at all; a lab points the URLs at Postgres and Redis.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRET = "change-me"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARALLAB_", extra="ignore")

    home: Path = Field(Path(".parallab"), description="Where the embedded database, broker and run directories live.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite under home.")
    broker_url: str | None = Field(None, description="Celery broker; default: kombu's SQLAlchemy transport on SQLite under home.")
    host: str = "127.0.0.1"
    port: int = 8000
    secret_key: str = PLACEHOLDER_SECRET

    # What one submitted job may ask for. The worker owns the machine: these keep a form from
    # asking for more ranks, steps or time than the host can give.
    max_world_size: int = Field(4, ge=1, description="Most ranks one job may ask for on this worker.")
    max_steps: int = Field(10_000, ge=1)
    max_job_seconds: int = Field(1800, ge=10, description="Wall-clock limit of one torchrun job.")
    max_upload_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest result document CI may upload.")
    max_trace_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Cap on one rank's stored Chrome trace (compressed).")
    queue: str = Field("parallab", description="Celery queue this worker consumes (one per hardware kind in a lab).")

    # Issue 14: the planner.
    hardware_catalogue: Path | None = Field(
        None,
        description="A lab's own hardware catalogue (JSON, the shape of parallab/core/hardware_catalogue.json); its entries win by key.",
    )
    sweep_steps: int = Field(10, ge=1, le=10_000, description="Measured steps of each run a sweep queues (unless the request says).")

    @property
    def resolved_home(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_home / 'parallab.db'}"

    @property
    def celery_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{self.resolved_home / 'broker.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.resolved_home / "runs"

    @property
    def local_mode(self) -> bool:
        """Local mode: bound to loopback, so its one user submits and browses without logging in."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def check_secrets(self) -> None:
        """Refuse to serve beyond loopback while a secret still holds its placeholder."""
        if not self.local_mode and self.secret_key == PLACEHOLDER_SECRET:
            raise ValueError(f"PARALLAB_SECRET_KEY still holds its placeholder; set a real secret before binding to {self.host}")

    def ensure_home(self) -> None:
        self.resolved_home.mkdir(parents=True, exist_ok=True)
        self.runs_dir.mkdir(parents=True, exist_ok=True)


@lru_cache
def get_settings() -> Settings:
    return Settings()
