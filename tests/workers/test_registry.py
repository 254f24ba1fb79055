"""The rank side's registry and context: every training strategy has its rank module, typed by its
descriptor's options, and a rank's context cannot change once built. No ranks launched."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

from parallab.core.options import NoOptions
from parallab.core.strategies import REFERENCE_STRATEGY, REGISTRY, TRAINING_STRATEGIES, get_descriptor
from workers import strategies
from workers.harness.runtime import RunContext
from workers.strategies import compose
from workers.strategies.base import Applied, Strategy


def test_every_training_strategy_has_a_rank_module_and_nothing_else_does():
    assert set(strategies.MODULES) == set(TRAINING_STRATEGIES)
    assert set(REGISTRY) - set(TRAINING_STRATEGIES) == {"collectives", "calibrate"}
    with pytest.raises(KeyError, match="collectives"):
        strategies.get("collectives")  # a job kind, not a training strategy


@pytest.mark.parametrize("name", TRAINING_STRATEGIES)
def test_each_rank_module_takes_its_descriptors_options(name):
    strategy = strategies.get(name)
    assert isinstance(strategy, Strategy) and strategy.name == name
    base = next(b for b in getattr(type(strategy), "__orig_bases__", ()) if typing.get_origin(b) is Strategy)
    options, applied = typing.get_args(base)
    assert issubclass(get_descriptor(name).options_model, options)
    assert issubclass(applied, Applied)


@pytest.mark.parametrize("name", [n for n in TRAINING_STRATEGIES if n != REFERENCE_STRATEGY])
def test_every_preset_runs_through_the_composition_on_its_descriptors_layout(name):
    """No preset has a rank module of its own: the composition applies the layout its descriptor
    resolves to, whose dims are the mesh the rank builds (`ResolvedJob.mesh`)."""
    strategy = strategies.get(name)
    assert strategies.MODULES[name] == "compose" and isinstance(strategy, compose.Composed)
    descriptor = get_descriptor(name)
    options = descriptor.complete_options(descriptor.parse_options(descriptor.plan_grid(8)[0] if descriptor.plan_grid(8) else {}), 8)
    ctx = dataclasses.replace(solo(), world_size=8)
    layout = strategy.layout(ctx, options)
    assert layout == descriptor.layout(8, options) and layout.size == 8
    assert tuple(d.name for d in descriptor.mesh(8, options)) == layout.on


def solo() -> RunContext:
    return RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="none", accum_steps=2)


def test_a_run_context_is_never_changed_after_it_is_built():
    ctx = solo()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.accum_steps = 4  # type: ignore[misc]
    assert dataclasses.replace(ctx, precision="bf16").precision == "bf16" and ctx.precision == "fp32"


def test_without_a_mesh_there_is_no_data_parallel_split_and_no_dims():
    ctx = solo()
    assert strategies.get(REFERENCE_STRATEGY).data_rank(ctx, NoOptions()) == (1, 0)
    with pytest.raises(RuntimeError, match="no 'tp' dim"):
        ctx.mesh_dim("tp")
