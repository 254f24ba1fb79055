"""The kinds of pool, as a registry: each kind's settings model, by the kind's name (`POOL_KINDS`).

A pool of kind `celery` needs no set-up: it exists as soon as a worker registers it, and its
settings hold only how its hosts are wired (`topology`). A pool of a scheduler's kind is declared
once by an admin: kind `slurm` (`parallab pool create-slurm`) with what every `sbatch` of its jobs
carries — partition, account, QoS, GPUs per node, a time limit — and what the cluster provides:
the Python environment that runs the ranks and a directory on the cluster's shared filesystem
where each run gets its run directory (every node of a job reads and writes the same one). Kind
`ray` (`parallab pool create-ray`) holds a Ray cluster's address, what each rank's bundle of its
placement group asks for, and the run directories' root on the cluster's shared filesystem.

Placement, the pool services and the CLI read the registry, never a kind's name: a kind says
whether its runs go to a Celery queue (`queued`) and what it cannot run (`problems`). The engine
that runs a kind's jobs is registered beside it on the run side (`workers.engines.registry`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$"


class PoolSettings(BaseModel):
    """A pool kind's settings, stored with a declared pool; the class says what the kind is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ClassVar[str]
    title: ClassVar[str] = ""
    """The kind's name on pages (`Slurm`); empty: the kind itself."""
    queued: ClassVar[bool] = False
    """Its runs go to a Celery queue that its workers consume (False: its agent takes them from the database)."""

    def problems(self, pool: str, job: ResolvedJob) -> list[SpecProblem]:
        """Why pool `pool` of this kind cannot run `job` (empty: it can)."""
        return []


class SlurmPool(PoolSettings):
    """How the jobs of one Slurm pool are submitted (every field but `python` and `run_root` optional)."""

    kind: ClassVar[str] = "slurm"
    title: ClassVar[str] = "Slurm"

    partition: str | None = Field(None, pattern=_NAME, description="`--partition`; none: the cluster's default partition.")
    account: str | None = Field(None, pattern=_NAME, description="`--account` charged for the jobs.")
    qos: str | None = Field(None, pattern=_NAME, title="QoS", description="`--qos`.")
    gpus_per_node: int = Field(
        0, ge=0, le=64, title="GPUs per node", description="`--gpus-per-node`; 0: CPU nodes (the ranks run on gloo)."
    )
    time_limit: str | None = Field(
        None, description="`--time` in Slurm's format (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS); none: the partition's limit."
    )
    max_nodes: int = Field(1024, ge=1, le=1024, description="The most nodes one job of this pool may ask for.")
    python: str = Field(
        ..., min_length=1, max_length=1000, description="The Python on the cluster's nodes that has parallab and torch installed."
    )
    run_root: str = Field(
        ...,
        min_length=1,
        max_length=1000,
        title="Run directory",
        description="A directory on the cluster's shared filesystem: each run's files go under it.",
    )

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS)")
        return value

    @field_validator("python", "run_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path on the cluster")
        return value

    def problems(self, pool: str, job: ResolvedJob) -> list[SpecProblem]:
        out = []
        if job.nodes > self.max_nodes:
            out.append(SpecProblem(("placement", "nodes"), f"pool {pool!r} allows {self.max_nodes} node(s); this job asks for {job.nodes}"))
        if self.gpus_per_node and job.ranks_per_node > self.gpus_per_node:
            said = f"pool {pool!r} has {self.gpus_per_node} GPU(s) per node; this job puts {job.ranks_per_node} rank(s) on each node"
            out.append(SpecProblem(("strategy", "world_size"), said))
        return out


class RayPool(PoolSettings):
    """A Ray cluster: each run's ranks are actors of one placement group, one bundle a rank."""

    kind: ClassVar[str] = "ray"
    title: ClassVar[str] = "Ray"

    address: str = Field(
        ..., min_length=1, max_length=1000, description="The cluster's address as `ray.init` takes it (its GCS `host:port`, or `auto`)."
    )
    run_root: str = Field(
        ...,
        min_length=1,
        max_length=1000,
        title="Run directory",
        description="A directory every Ray node and the agent share: each run's files go under it.",
    )
    namespace: str | None = Field(None, pattern=_NAME, description="The Ray namespace of the pool's actors; none: `parallab-<pool>`.")
    cpus_per_rank: float = Field(1.0, gt=0, le=256, title="CPUs per rank", description="CPUs in each rank's bundle.")
    gpus_per_rank: int = Field(
        0, ge=0, le=1, title="GPUs per rank", description="GPUs in each rank's bundle: 1 puts the ranks on CUDA (NCCL), 0 on CPU (gloo)."
    )
    strategy: Literal["STRICT_PACK", "PACK"] = Field("PACK", description="The placement group's strategy (STRICT_PACK: one node).")
    place_timeout_s: float = Field(60.0, gt=0, le=3600, description="How long a launch waits for the cluster to place every bundle.")
    max_ranks: int = Field(1024, ge=1, le=65536, description="The most ranks one job of this pool may ask for.")

    @field_validator("run_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path on the cluster")
        return value

    def problems(self, pool: str, job: ResolvedJob) -> list[SpecProblem]:
        if job.world_size > self.max_ranks:
            said = f"pool {pool!r} allows {self.max_ranks} rank(s); this job asks for {job.world_size}"
            return [SpecProblem(("strategy", "world_size"), said)]
        return []


class LinkFigures(BaseModel):
    """One path between two ranks: its bandwidth (bit/s) and one-way latency (s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandwidth_bps: float = Field(..., gt=0, description="Bits per second one way.")
    latency_s: float = Field(0.0, ge=0, description="One-way latency in seconds (half a round trip).")
    alpha_s: float | None = Field(
        None,
        ge=0,
        description="α of the α–β model: what one step of a collective pays on this path beside its bytes, as measured "
        "(the median half round trip of a one-element message on the pool as loaded); None: the wire's latency_s.",
    )

    @property
    def step_s(self) -> float:
        """The per-step cost a collective's algorithm pays on this path: the measured α where there
        is one — on CPU ranks that share their cores it is mostly the wait for a descheduled peer,
        which the wire's floor (`latency_s`) leaves out — else the latency."""
        return self.alpha_s if self.alpha_s is not None else self.latency_s


class PoolTopology(BaseModel):
    """How a pool's hosts are wired, where a planner reads it: inside a node and between nodes, as
    declared (an emulated link's settings) and as measured (gloo send/recv across each path).

    Stored in a pool's settings under `topology` (`parallab lab emulate` writes it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["emulated", "declared"] = "declared"
    nodes: int = Field(..., ge=1)
    ranks_per_node: int = Field(..., ge=1)
    intra_node: LinkFigures | None = Field(None, description="Declared inside a node (None: the host's own memory path, unshaped).")
    inter_node: LinkFigures = Field(..., description="Declared between nodes (an emulated link's tbf rate and netem delay).")
    measured_intra_node: LinkFigures | None = None
    measured_inter_node: LinkFigures | None = None


def placed_mesh(mesh: Sequence[tuple[str, int]], order: str = "inner-first") -> list[tuple[str, int]]:
    """The mesh's dimensions in the order they are laid over the hosts' ranks (row-major, last
    innermost: consecutive host ranks differ in the last); `order` is a placement's
    (`parallab.core.spec.PlacementOrder`)."""
    return list(reversed(list(mesh))) if order == "across" else list(mesh)


def _row_major(coords: Sequence[int], sizes: Sequence[int]) -> int:
    index = 0
    for c, s in zip(coords, sizes, strict=True):
        index = index * s + c
    return index


def _coords(index: int, sizes: Sequence[int]) -> list[int]:
    out = []
    for s in reversed(list(sizes)):
        out.append(index % s)
        index //= s
    return list(reversed(out))


def host_rank(rank: int, mesh: Sequence[tuple[str, int]], order: str = "inner-first") -> int:
    """The position (torchrun's global rank: node × ranks per node + local rank) of the mesh's
    `rank` (row-major over `mesh`) under `order`."""
    if order != "across" or len(mesh) < 2:
        return rank
    coords = _coords(rank, [s for _, s in mesh])
    return _row_major(list(reversed(coords)), [s for _, s in reversed(list(mesh))])


def mesh_rank(position: int, mesh: Sequence[tuple[str, int]], order: str = "inner-first") -> int:
    """The mesh rank a host position runs (the inverse of `host_rank`)."""
    if order != "across" or len(mesh) < 2:
        return position
    coords = _coords(position, [s for _, s in reversed(list(mesh))])
    return _row_major(list(reversed(coords)), [s for _, s in mesh])


def placed_stride(mesh: Sequence[tuple[str, int]], order: str, group_size: int, stride: int) -> int:
    """The host-rank distance between the members of a mesh dimension's groups, for the dimension
    whose groups are `group_size` mesh ranks `stride` apart (row-major, last innermost); `stride`
    itself where no dimension matches or the order keeps the mesh's."""
    if order != "across":
        return stride
    inner = 1
    for name, size in reversed(list(mesh)):
        if size == group_size and inner == stride:
            out = 1
            for other, s in reversed(placed_mesh(mesh, order)):
                if other == name:
                    return out
                out *= s
        inner *= size
    return stride


def crossing_dims(mesh: Sequence[tuple[str, int]], ranks_per_node: int, order: str = "inner-first") -> list[str]:
    """The mesh dimensions whose groups span nodes, with host ranks in order on the nodes
    (node = host rank // ranks_per_node) and the mesh laid over them by `order` (`placed_mesh`) —
    `inner-first` is torchtitan's order, which puts tp innermost so that it stays inside a node. A
    dimension of size s whose members sit `stride` host ranks apart stays inside a node when
    stride × s divides the ranks per node. Mesh order."""
    crossing, stride = set(), 1
    for name, size in reversed(placed_mesh(mesh, order)):
        if size > 1 and ranks_per_node % (stride * size) != 0:
            crossing.add(name)
        stride *= size
    return [name for name, _ in mesh if name in crossing]


class CeleryPool(PoolSettings):
    """A pool of Celery workers, one per host: it exists once a worker registers it; its settings
    keep only how its hosts are wired, where that was recorded."""

    kind: ClassVar[str] = "celery"
    title: ClassVar[str] = "Celery"
    queued: ClassVar[bool] = True

    topology: PoolTopology | None = None


POOL_KINDS: dict[str, type[PoolSettings]] = {}
"""Every pool kind's settings model, by kind (`register_pool_kind`)."""


def register_pool_kind(settings: type[PoolSettings]) -> type[PoolSettings]:
    """Register a pool kind by its settings model (its `kind` names it)."""
    if settings.kind in POOL_KINDS and POOL_KINDS[settings.kind] is not settings:
        raise ValueError(f"pool kind {settings.kind!r} is registered already")
    POOL_KINDS[settings.kind] = settings
    return settings


for _kind in (CeleryPool, SlurmPool, RayPool):
    register_pool_kind(_kind)


DEFAULT_KIND = CeleryPool.kind
"""The kind of a pool that nobody declared: one its workers registered."""


def pool_settings(kind: str, said: dict[str, Any] | None) -> PoolSettings:
    """A stored pool's settings read as its kind's model (a ValueError naming an unknown kind)."""
    model = POOL_KINDS.get(kind)
    if model is None:
        raise ValueError(f"unknown pool kind {kind!r}; known: {', '.join(sorted(POOL_KINDS))}")
    return model.model_validate(said or {})
