"""A family's declaration held against the module it builds, and a fake tensor-parallel mesh to
apply its plan in one process (shared by the family tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from torch import nn

from parallab.core.families import ModelFamily
from parallab.core.model import ModelConfig


def mismatches(family: ModelFamily, cfg: ModelConfig, model: nn.Module) -> list[str]:
    """Every way the module's parameters differ from the family's declared tensors (empty: they agree)."""
    got = {name: tuple(p.shape) for name, p in model.named_parameters()}
    declared = family.tensors(cfg)
    want = {t.name: t.shape for t in declared}
    out = [
        f"{name}: module {got.get(name)}, declared {want.get(name)}"
        for name in sorted(set(got) | set(want))
        if got.get(name) != want.get(name)
    ]
    if len(declared) != len(want):
        out.append(f"{len(declared) - len(want)} tensors declared twice")
    if sum(p.numel() for p in model.parameters()) != family.param_counts(cfg).total:
        out.append("the parameter formula disagrees with the module")
    return out


@contextlib.contextmanager
def fake_tp_group() -> Iterator[Any]:
    """Two tensor-parallel ranks in one process: torch's fake process group runs no collective
    (yields the 1-D "tp" mesh; skips when a process group already exists here)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def tp_split(model: nn.Module) -> dict[str, int | None]:
    """Each parameter's sharded dim after tensor parallelism (None where it is replicated)."""
    from torch.distributed.tensor import DTensor, Shard

    split: dict[str, int | None] = {}
    for name, p in model.named_parameters():
        shards = [pl.dim for pl in p.placements if isinstance(pl, Shard)] if isinstance(p, DTensor) else []
        split[name] = shards[0] if shards else None
    return split
