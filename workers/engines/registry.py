"""The kinds of pool on the run side: `{kind: (settings model, engine class)}`, in the style of
MLflow's store registries, over the settings models of `parallab.core.pools.POOL_KINDS`.

Placement, the pool services and the CLI read the kinds from the core's registry and never name an
engine; the run coordinator is generic over `Engine`. An engine class is named only in its own
module, here, and in the modules that drive it (`EngineKind.drivers`: the Celery worker drives the
host engine, a pool's agent drives its scheduler's) — `tests/test_architecture.py` holds that wall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallab.core.pools import POOL_KINDS, CeleryPool, PoolSettings, RayPool, SlurmPool
from workers.engines.base import Engine
from workers.engines.host_torchrun import HostTorchrun
from workers.engines.ray_cluster import RayEngine
from workers.engines.slurm import SlurmEngine


@dataclass(frozen=True)
class EngineKind:
    """One kind of pool: how it is declared, what runs its jobs, and what drives that engine."""

    settings: type[PoolSettings]
    engine: type[Engine[Any]]
    drivers: tuple[str, ...]
    """The modules that construct and drive the engine (the only ones but its own that name it)."""


ENGINES: dict[str, EngineKind] = {
    CeleryPool.kind: EngineKind(CeleryPool, HostTorchrun, ("workers.execute", "workers.fleet")),
    SlurmPool.kind: EngineKind(SlurmPool, SlurmEngine, ("workers.slurm_agent",)),
    RayPool.kind: EngineKind(RayPool, RayEngine, ("workers.ray_agent",)),
}


def engine_kind(kind: str) -> EngineKind:
    """The registered kind `kind` (a ValueError naming the kinds known)."""
    if kind not in ENGINES:
        raise ValueError(f"no engine runs pools of kind {kind!r}; known: {', '.join(sorted(ENGINES))}")
    return ENGINES[kind]


def unregistered() -> list[str]:
    """Pool kinds with a settings model but no engine, or the other way round (empty: the registries agree)."""
    mismatched = {kind for kind, entry in ENGINES.items() if POOL_KINDS.get(kind) is not entry.settings}
    return sorted((set(POOL_KINDS) ^ set(ENGINES)) | mismatched)
