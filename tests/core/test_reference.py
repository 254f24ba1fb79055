"""The reference's key and its host cache file (parallab.core.reference, issue 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.reference import cache_path, is_reference, read_cached, reference_key, write_cached
from parallab.core.spec import JobSpec


def job(strategy: str = "ddp", world: int = 2, **workload: Any) -> ResolvedJob:
    return resolve_job(
        JobSpec.model_validate({"workload": {"model": "tiny", "steps": 3, **workload}, "strategy": {"name": strategy, "world_size": world}})
    )


def test_the_key_is_the_reference_workload_so_every_recipe_and_strategy_of_it_shares_one() -> None:
    base = reference_key(job())
    assert reference_key(job("fsdp")) == base
    assert reference_key(job(precision="bf16")) == base
    assert reference_key(job(activation_checkpointing="full", grad_accumulation_steps=2)) == base
    assert reference_key(job(seed=1)) != base
    assert reference_key(job(steps=4)) != base
    assert reference_key(job(lr=1e-2)) != base
    assert reference_key(job(profiled_steps=8)) == base  # the window runs after the curve's steps


def test_text_data_has_its_own_reference_and_random_keeps_the_key_it_had() -> None:
    # The key this job had before the data field (and the architecture fields) existed, as stored
    # in reference caches written then.
    before = "4cf16070848a08c6cef0e42649d131c77b12ef824008782359f9f17b29083416"
    assert reference_key(job()) == reference_key(job(data="random")) == before
    assert reference_key(job(data="text")) != before
    assert reference_key(job("fsdp", data="text")) == reference_key(job(data="text"))


def test_only_a_reference_recipe_single_is_its_own_reference() -> None:
    assert is_reference(job("single", 1))
    assert not is_reference(job("single", 1, precision="bf16"))
    assert not is_reference(job())


def test_the_cache_file_round_trips_and_a_missing_or_broken_one_reads_as_none(tmp_path: Path) -> None:
    path = cache_path(tmp_path / "cache", job())
    assert read_cached(path) is None
    write_cached(path, job(), [3.5, 2.25])
    assert read_cached(path) == [3.5, 2.25]
    assert list(path.parent.iterdir()) == [path]  # no temp file left
    path.write_text("{not json")
    assert read_cached(path) is None
