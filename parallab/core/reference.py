"""The fp32 reference of a training job: which curve it is, its key, and its cache file.

Every run's loss is held against the `single` run of the same workload and seed in fp32 with no
recomputation and no accumulation (`parallab.core.recipes`). Its curve depends only on that
reference workload (seed included; the recipe is the reference's, so runs of every precision share
one), plus, for MoE, the routing groups and the load-balancing weight: `reference_key` hashes
exactly that.

Where a run's reference comes from, recorded in its loss block as `reference_source`:
- `computed`: the job trained the reference itself, after its own steps (rank 0);
- `own`: the job is a reference-recipe `single`: its own curve is the reference;
- `host cache`: read from this host's cache file (`<home>/cache/reference/<key>.json`);
- `lab database`: the worker fetched it from the lab's database into that file before launching.

Both sides read and write the cache file through this module: the ranks (`workers.harness.main`,
which may not reach the database) and the worker (`workers.execute`, which fills it from the
database and stores what the ranks computed).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from parallab.core.jobs import ResolvedJob
from parallab.core.recipes import RECIPE_DEFAULTS
from parallab.core.spec import without_neutral
from parallab.core.strategies import REFERENCE_STRATEGY
from parallab.core.strategies.moe import MoEOptions

ReferenceSource = Literal["computed", "own", "host cache", "lab database"]


def aux_loss_coef(job: ResolvedJob) -> float:
    """The MoE load-balancing weight: the layout's (the moe strategy's option, a layout's ep option),
    else its default (dense-MoE under ddp/fsdp, whose layouts keep the default)."""
    layout = job.layout
    return layout.aux_loss_coef if layout is not None else MoEOptions().aux_loss_coef


def reference_job(job: ResolvedJob) -> ResolvedJob:
    """`job` with the recipe at the reference's: fp32, no recomputation, no accumulation."""
    workload = job.spec.workload.model_copy(update=RECIPE_DEFAULTS)
    return ResolvedJob(spec=job.spec.model_copy(update={"workload": workload}))


def is_reference(job: ResolvedJob) -> bool:
    """A `single` run with the reference recipe is its own reference."""
    return job.strategy == REFERENCE_STRATEGY and all(getattr(job.workload, k) == v for k, v in RECIPE_DEFAULTS.items())


OUTSIDE_THE_CURVE = ("profiled_steps",)
"""Workload fields that shape no step of the loss curve (the profiled window runs after the timed
steps): left out of the key, so runs that differ only in them share one reference."""


def reference_key(job: ResolvedJob) -> str:
    """sha256 of the reference's workload block; MoE adds its routing groups and aux weight (they shape the loss).
    The data is in the block (a text run never meets a random reference), left out at its default
    so the curves stored before it existed keep their keys."""
    block: dict[str, Any] = without_neutral(reference_job(job).workload_document())
    for name in OUTSIDE_THE_CURVE:
        block.pop(name, None)
    if job.model.is_moe:
        block = {"workload": block, "route_groups": job.dp_degree, "aux_loss_coef": aux_loss_coef(job)}
    return hashlib.sha256(json.dumps(block, sort_keys=True).encode()).hexdigest()


def cache_path(cache_dir: Path, job: ResolvedJob) -> Path:
    """The host cache file of `job`'s reference curve."""
    return cache_dir / f"{reference_key(job)}.json"


def read_cached(path: Path) -> list[float] | None:
    """The curve in a cache file, or None when there is none (or it is unreadable)."""
    try:
        loss = json.loads(path.read_text())["loss"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [float(x) for x in loss] if isinstance(loss, list) else None


def write_cached(path: Path, job: ResolvedJob, curve: list[float]) -> None:
    """Write the cache file atomically (a temp file renamed over it: a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"workload": reference_job(job).workload_document(), "loss": curve}))
    tmp.replace(path)
