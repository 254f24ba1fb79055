"""All of parallab's settings (prefix ``PARALLAB_``), grouped by concern.

Nothing else reads ``os.environ``: the API, the Celery app, Alembic and the CLI all call
:func:`get_settings`. The embedded default (SQLite + a serverless Celery transport under
``PARALLAB_HOME``) needs no server at all; a lab points the URLs at Postgres and Redis.

The groups (``settings.database``, ``settings.broker``, ``settings.server``, ``settings.security``,
``settings.quotas``, ``settings.limits``, ``settings.worker``, ``settings.planner``) are how the
code reads them; the environment stays flat. Every field of every group keeps the one name it had
before the groups, and ``PARALLAB_<NAME>`` sets it (``PARALLAB_MAX_WORLD_SIZE`` sets
``settings.limits.max_world_size``): the variables are a public contract (README, docs,
.env.example, compose, CI), and a name is unique across the groups. ``Settings(max_world_size=4)``
and ``model_copy(update={"max_world_size": 4})`` take the same flat names.

``settings.limits`` is the `Limits` every submitted job is checked against, not a copy of it.
"""

from __future__ import annotations

import ipaddress
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from typing_extensions import Self

from parallab.core.jobs import Limits
from parallab.core.spec import POOL_PATTERN

PLACEHOLDER_SECRET = "change-me"


class Group(BaseModel):
    """One concern's settings (a field's name is its variable's, less the prefix). Mutable, as
    Settings is: a test sets `settings.server.max_upload_bytes` on the app's own object."""

    model_config = ConfigDict(extra="forbid")


class DatabaseSettings(Group):
    """The database: where it is and each process's connection pool."""

    # An API process holds a connection per upload thread while it stores, and one per other
    # request only while it runs (the token check gives its connection back before an upload
    # queues): pool_size should cover upload_concurrency plus the requests served at once; every
    # process may open up to db_pool_size + db_max_overflow, which Postgres' max_connections must
    # cover for all of them.
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite under home.")
    db_pool_size: int = Field(8, ge=1, le=1000, description="Connections each process keeps open (SQLAlchemy's pool_size).")
    db_max_overflow: int = Field(8, ge=0, le=1000, description="Connections each process may open beyond db_pool_size under a burst.")
    db_pool_timeout_s: float = Field(
        5.0, gt=0, le=300, description="How long a request waits for a pooled connection before it is answered 503 with Retry-After."
    )


class BrokerSettings(Group):
    """The Celery broker and the queues runs wait in."""

    broker_url: str | None = Field(None, description="Celery broker; default: kombu's SQLAlchemy transport on SQLite under home.")
    queue: str = Field("parallab", description="Prefix of the Celery queues: pool P is consumed from queue '<queue>.<P>'.")


class ServerSettings(Group):
    """The API process: where it listens, how big a request may be, how uploads queue, its health check and its GIL."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_request_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest body of any other request (specs, forms, settings); larger is 413 before it is parsed."
    )
    max_upload_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest result document CI may upload.")
    max_trace_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Cap on one rank's stored Chrome trace (compressed).")
    upload_concurrency: int = Field(
        2,
        ge=1,
        le=64,
        description="Uploads parsed, checked and stored at once, in a thread pool of this size beside the event loop: "
        "each is CPU-bound under one GIL, so more of them only slow the event loop's turn (/healthz) without more throughput.",
    )
    upload_queue: int = Field(
        16,
        ge=0,
        le=10_000,
        description="Uploads that may wait for a free upload thread in each API process; one more is answered 503 with "
        "Retry-After at once (a client retries under the same Idempotency-Key) instead of waiting for a database connection.",
    )
    upload_retry_after_s: int = Field(2, ge=1, le=600, description="Retry-After of the 503 that answers an upload while the queue is full.")
    health_timeout_s: float = Field(
        2.0, gt=0, le=60, description="How long /healthz waits for the database and for the broker to answer before it says 503."
    )
    gil_switch_interval_ms: float = Field(
        0.5,
        gt=0,
        le=100,
        description="sys.setswitchinterval of the API process, in ms (Python's default: 5): how long a CPU-bound upload thread "
        "keeps the GIL before the event loop's thread may take it. Each socket read or write of a request waits for it once.",
    )
    gc_freeze: bool = Field(
        True,
        description="gc.freeze() once the API process has started: the collector's full passes no longer walk the modules, app and "
        "ORM objects made at start-up (a full pass over them held the GIL ~100 ms, stalling every request).",
    )


class SecuritySettings(Group):
    """Accounts and trust: the signing secret, local mode, the first admin, logins, API docs and the upload rate per token."""

    secret_key: str = PLACEHOLDER_SECRET
    allow_local_mode: bool = Field(
        True, description="False: ask for logins and tokens even when bound to loopback (a shared host, or a test of the lab setup)."
    )
    admin_email: str | None = Field(None, description="With admin_password: an admin created at start-up if no user has this email.")
    admin_password: SecretStr | None = Field(None, description="Read once at start-up (compose); change it after the first login.")
    docs_public: bool = Field(
        False, description="Serve /docs, /redoc and /openapi.json to anyone; False: only to logged-in users (local mode: always open)."
    )
    session_max_age_s: int = Field(14 * 24 * 3600, ge=300, description="How long a login lasts.")
    login_free_failures: int = Field(3, ge=0, description="Failed logins an account or address may make before each next try waits.")
    login_delay_s: float = Field(
        1.0, ge=0, le=3600, description="The first wait after the free failures; it doubles with each further one."
    )
    login_max_delay_s: float = Field(60.0, ge=0, le=86_400, description="The longest wait between two tries (short of a lockout).")
    login_account_lockout: int = Field(10, ge=1, description="Failed logins in a row that lock an account (or a known device).")
    login_ip_lockout: int = Field(30, ge=1, description="Failed logins in a row that lock a client address (any accounts).")
    login_lockout_s: int = Field(
        900, ge=1, le=7 * 86_400, description="How long a lockout lasts, and how long failures are remembered after the last one."
    )
    upload_rate_per_minute: float = Field(120.0, ge=0, description="Uploads one token may make per minute, sustained (0: no limit).")
    upload_burst: int = Field(120, ge=1, description="Uploads one token may make at once before the rate applies.")


class QuotaSettings(Group):
    """Queued work per user (backend.services.quotas); admins are exempt."""

    max_active_runs_per_user: int = Field(40, ge=1, description="Runs one user may have queued or running at once.")
    max_runs_per_sweep: int = Field(16, ge=1, description="Runs one sweep may queue.")
    quota_exempt_emails: list[str] = Field(default_factory=list, description="Users (by email) exempt from the quotas, as admins are.")

    @field_validator("quota_exempt_emails", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """The environment's form, a JSON list (`["ci-bot@lab.org"]`); a list passes as it is."""
        return json.loads(value) if isinstance(value, str) else value


class WorkerSettings(Group):
    """The fleet, and what one run may use of a worker: pools, hosts, heartbeats, leases,
    reservations, a job's wall clock, its collectives' timeout and one rank's memory."""

    pool: str | None = Field(None, pattern=POOL_PATTERN, description="This worker's pool (default: named after its hardware: cpu, h100x8).")
    default_pool: str | None = Field(
        None, pattern=POOL_PATTERN, description="The pool of a job that names none (default: the first live pool that can run it)."
    )
    worker_host: str | None = Field(None, max_length=200, description="The host this worker stands for (default: the hostname).")
    worker_address: str | None = Field(
        None, max_length=200, description="Where other hosts reach this one for a multi-node rendezvous (default: the host's address)."
    )
    worker_netns: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="A network namespace this worker's ranks run in (an emulated node of `parallab lab emulate`); "
        "the worker itself stays in its own, beside the database and broker.",
    )
    worker_devices: int | None = Field(
        None, ge=1, le=1024, description="Ranks one node may run on this worker (default: its GPUs; on CPU, max_world_size)."
    )
    heartbeat_s: float = Field(5.0, gt=0, le=300, description="How often a worker heartbeats; its runs' leases live on it.")
    worker_ttl_s: float = Field(30.0, gt=0, le=3600, description="A worker silent this long is dead and its runs' leases have lapsed.")
    lease_check_s: float | None = Field(
        None,
        ge=0,
        le=3600,
        description="How often each API process fails runs whose worker's lease lapsed (default: half worker_ttl_s; 0: never).",
    )
    reservation_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="A host reserved for a multi-node job that has not started its part by then fails the job."
    )
    max_job_seconds: int = Field(1800, ge=10, description="Wall-clock limit of one torchrun job.")
    collective_timeout_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="How long a rank waits in one collective of its world group before it fails (default: torch's, 30 min): "
        "a node cut off from the others fails its job in about this time rather than at max_job_seconds.",
    )
    max_memory_per_rank_bytes: int | None = Field(
        None,
        ge=1,
        description="Predicted memory one rank may use (e.g. a GPU's memory). Unset: in local mode the job's ranks "
        "share this host's memory; elsewhere no memory check.",
    )
    slurm_poll_s: float = Field(5.0, gt=0, le=600, description="How often the Slurm agent submits queued runs and reads squeue.")


class PlannerSettings(Group):
    """The planner: a lab's hardware catalogue and the runs a sweep queues."""

    hardware_catalogue: Path | None = Field(
        None,
        description="A lab's own hardware catalogue (JSON, the shape of parallab/core/hardware_catalogue.json); its entries win by key.",
    )
    sweep_steps: int = Field(10, ge=1, le=10_000, description="Measured steps of each run a sweep queues (unless the request says).")


class ServerLimits(Limits):
    """What one submitted job may ask of this deployment: `Limits` with its ceilings as defaults.
    The worker owns the machine: these keep a form from asking for more ranks, steps or size than
    the host can give (checked at resolution, 422 naming the field and the limit)."""

    whose: str = Field("the server's", exclude=True)
    max_world_size: int = Field(8, ge=1, description="Most ranks one job may ask for on this worker (8: a 2 × 2 × 2 layout on CPU).")
    max_steps: int = Field(10_000, ge=1)
    max_warmup_steps: int = Field(1000, ge=0)
    max_seq_len: int = Field(32_768, ge=2)
    max_global_batch_size: int = Field(4096, ge=1)
    max_grad_accumulation_steps: int = Field(256, ge=1)
    max_hidden_size: int = Field(16_384, ge=2)
    max_ffn_hidden_size: int = Field(65_536, ge=1)
    max_num_layers: int = Field(256, ge=1)
    max_vocab_size: int = Field(262_144, ge=2)
    max_num_experts: int = Field(256, ge=0)
    max_tokens_per_step: int = Field(1 << 22, ge=1, description="global_batch_size × seq_len of one optimizer step.")
    max_microbatches: int = Field(256, ge=1, description="Pipeline micro-batches per step (pp).")


Environment = dict[str, tuple[str | None, str]]
"""A variable's name, lower case and without the prefix → (its group, or None at the top; its field)."""


def _is_group(annotation: Any) -> TypeGuard[type[BaseModel]]:
    """A field holding one concern's settings (a model), not a value."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def environment_names(settings_cls: type[BaseModel]) -> Environment:
    """Every name the environment may set: each top-level field that is no group, and each field of
    each group (a `whose`-like field left out of dumps is wording, not a setting)."""
    out: Environment = {}
    for name, field in settings_cls.model_fields.items():
        group = field.annotation
        inner: list[tuple[str | None, str]] = [(None, name)]
        if _is_group(group):
            inner = [(name, sub) for sub, info in group.model_fields.items() if not info.exclude]
        for where, sub in inner:
            if sub in out:
                raise TypeError(f"two settings are both named {sub!r}: the environment's names must be unique")
            out[sub] = (where, sub)
    return out


class FlatEnvironment(PydanticBaseSettingsSource):
    """``PARALLAB_<NAME>`` for every field of every group, nested into its group. Each value is
    the variable's string; a field that is not a scalar parses it itself (a JSON list, a
    comma-separated allow-list)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError("read all at once by __call__")

    def __call__(self) -> dict[str, Any]:
        prefix = str(self.config.get("env_prefix", "")).lower()
        environ = {key.lower(): value for key, value in os.environ.items()}
        out: dict[str, Any] = {}
        for name, (group, field) in environment_names(self.settings_cls).items():
            value = environ.get(prefix + name)
            if value is None:
                continue
            if group is None:
                out[field] = value
            else:
                out.setdefault(group, {})[field] = value
        return out


def _nested(names: Environment, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each flat name of a group's field moved into its group (a flat name wins over
    the same field given in its group, as a dict or a model)."""
    out = dict(values)
    for key in [k for k in values if k in names and names[k][0] is not None]:
        group = names[key][0]
        assert group is not None
        current = out.get(group, {})
        if isinstance(current, BaseModel):
            current = {f: getattr(current, f) for f in type(current).model_fields}
        out[group] = {**current, key: out.pop(key)}
    return out


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARALLAB_", extra="ignore")

    home: Path = Field(Path(".parallab"), description="Where the embedded database, broker and run directories live.")
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    limits: ServerLimits = Field(default_factory=ServerLimits)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    planner: PlannerSettings = Field(default_factory=PlannerSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The constructor's arguments, then the flat environment (pydantic-settings' own source
        would read a group from one JSON variable, ``PARALLAB_LIMITS``, which no one documents)."""
        return init_settings, FlatEnvironment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _groups_from_flat_names(cls, data: Any) -> Any:
        """`Settings(max_world_size=4)`: the environment's flat names, given to the constructor."""
        return _nested(environment_names(cls), data) if isinstance(data, dict) else data

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Self:
        """A copy whose groups are copies too (changing the copy's `server.max_upload_bytes` leaves
        the original's alone, as it did with one flat model); `update` may name a group's field by
        its flat name (`{"max_world_size": 16}`), which pydantic alone would set as a stray attribute."""
        update = _nested(environment_names(type(self)), dict(update or {}))
        for key, field in type(self).model_fields.items():
            if _is_group(field.annotation) and isinstance(given := update.get(key, {}), dict):
                update[key] = getattr(self, key).model_copy(update=given)
        return super().model_copy(update=update, deep=deep)

    @property
    def resolved_home(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def sqlalchemy_url(self) -> str:
        if self.database.database_url:
            return self.database.database_url
        return f"sqlite:///{self.resolved_home / 'parallab.db'}"

    @property
    def celery_broker_url(self) -> str:
        if self.broker.broker_url:
            return self.broker.broker_url
        return f"sqla+sqlite:///{self.resolved_home / 'broker.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.resolved_home / "runs"

    @property
    def loopback(self) -> bool:
        """Bound to a loopback address (cookies need not be Secure: nothing leaves the host)."""
        try:
            return ipaddress.ip_address(self.server.host).is_loopback
        except ValueError:
            return self.server.host == "localhost"

    @property
    def local_mode(self) -> bool:
        """Local mode: bound to loopback, so its one user submits and browses without logging in."""
        return self.security.allow_local_mode and self.loopback

    def check_secrets(self) -> None:
        """Refuse to serve beyond loopback while a secret still holds its placeholder."""
        if not self.local_mode and self.security.secret_key == PLACEHOLDER_SECRET:
            raise ValueError(f"PARALLAB_SECRET_KEY still holds its placeholder; set a real secret before binding to {self.server.host}")

    def ensure_home(self) -> None:
        self.resolved_home.mkdir(parents=True, exist_ok=True)
        self.runs_dir.mkdir(parents=True, exist_ok=True)


@lru_cache
def get_settings() -> Settings:
    return Settings()
