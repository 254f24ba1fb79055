"""Pool kinds as a registry: each kind's settings model (the core's) and engine (the run side's)
agree, an unknown kind is refused naming the kinds known, and placement asks the kind's settings
what it cannot run rather than naming a kind."""

from __future__ import annotations

import pytest

from parallab.core.jobs import Limits, resolve_job
from parallab.core.pools import POOL_KINDS, CeleryPool, SlurmPool, pool_settings
from parallab.core.spec import JobSpec
from workers.engines import registry
from workers.engines.base import Engine


def test_every_pool_kind_has_one_engine_and_every_engine_a_kind() -> None:
    assert registry.unregistered() == []
    assert set(POOL_KINDS) == set(registry.ENGINES) == {"celery", "slurm", "ray"}
    for kind, entry in registry.ENGINES.items():
        assert entry.settings.kind == kind and issubclass(entry.engine, Engine) and entry.drivers


def test_a_kind_missing_from_either_registry_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POOL_KINDS, "k8s", CeleryPool)
    assert registry.unregistered() == ["k8s"]


def test_an_unknown_kind_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="no engine runs pools of kind 'k8s'; known: celery, ray, slurm"):
        registry.engine_kind("k8s")
    with pytest.raises(ValueError, match="unknown pool kind 'k8s'; known: celery, ray, slurm"):
        pool_settings("k8s", {})


def test_a_kind_says_whether_its_runs_are_queued_and_what_it_cannot_run() -> None:
    slurm = pool_settings("slurm", {"python": "/env/bin/python", "run_root": "/shared", "max_nodes": 1, "gpus_per_node": 1})
    assert isinstance(slurm, SlurmPool) and not slurm.queued and CeleryPool().queued
    spec = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 4}, "placement": {"nodes": 2}}
    job = resolve_job(JobSpec.model_validate(spec), Limits(max_world_size=8, max_steps=10))
    problems = slurm.problems("a100", job)
    assert [(p.loc, p.msg) for p in problems] == [
        (("placement", "nodes"), "pool 'a100' allows 1 node(s); this job asks for 2"),
        (("strategy", "world_size"), "pool 'a100' has 1 GPU(s) per node; this job puts 2 rank(s) on each node"),
    ]
    assert CeleryPool().problems("cpu", job) == []
