"""Resolution fills the defaults once, and what it produces resubmits as the same job.

Every strategy of the registry is covered without being listed here: a new descriptor is tested
as soon as it is registered.
"""

from __future__ import annotations

import pytest

from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.model import PRESETS, SHAPE_FIELDS, ModelConfig
from parallab.core.problems import SpecError
from parallab.core.spec import INPUT_FIELDS, WORKLOAD_KEY_FIELDS, JobSpec, Workload, workload_fields
from parallab.core.strategies import REGISTRY, STRATEGY_NAMES, TRAINING_STRATEGIES

CONTRACTUAL = ("single", "ddp", "fsdp", "tp", "pp", "ring", "moe", "hybrid")  # shared/DESIGN.md


def resolve(strategy: str, world: int, options: dict | None = None, **workload) -> ResolvedJob:
    doc = {"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}
    return resolve_job(JobSpec.model_validate(doc))


def smallest_job(strategy: str, **workload) -> ResolvedJob:
    """The strategy on the fewest ranks `tiny` allows (its minimum, doubled until the rules hold)."""
    world = REGISTRY[strategy].min_world_size
    while True:
        try:
            return resolve(strategy, world, **workload)
        except SpecError:
            if world >= 64:
                raise
            world *= 2


VARIANTS = [(name, {}) for name in REGISTRY] + [
    ("fsdp", {"precision": "bf16", "activation_checkpointing": "full"}),
    ("ddp", {"grad_accumulation_steps": 2, "global_batch_size": 12, "seq_len": 32}),
    ("moe", {"num_experts": 2, "top_k": 1}),
    ("pp", {"model": "small"}),
]


@pytest.mark.parametrize(("strategy", "workload"), VARIANTS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(VARIANTS)])
def test_resolving_a_resolved_spec_gives_the_same_job(strategy, workload):
    job = smallest_job(strategy, **workload)
    again = resolve_job(job.spec)
    assert again == job
    assert again.spec.model_dump() == job.spec.model_dump()


@pytest.mark.parametrize("strategy", list(REGISTRY))
def test_the_workload_document_is_a_valid_workload_and_resubmits(strategy):
    job = smallest_job(strategy)
    document = job.workload_document()
    workload = Workload.model_validate(document)  # norm_eps and rope_theta included
    assert set(SHAPE_FIELDS) <= set(document)
    resubmitted = JobSpec.model_validate({"workload": document, "strategy": job.strategy_document(), "trace": job.spec.trace})
    assert resolve_job(resubmitted) == job
    # A field at None (no entry point: not the module family) is the preset's absence, not an override.
    assert workload.shape_overrides() == {k: v for k, v in job.model.model_dump().items() if v is not None}


def test_pipeline_micro_batches_default_to_twice_the_stages_and_an_explicit_count_stays():
    assert resolve("pp", 2).spec.strategy.options["microbatches"] == 4
    assert resolve("pp", 4).spec.strategy.options["microbatches"] == 8
    assert resolve("pp", 2, {"microbatches": 6}, global_batch_size=12).spec.strategy.options["microbatches"] == 6


@pytest.mark.parametrize(
    ("strategy", "world", "options", "workload", "batch"),
    [
        ("ddp", 2, {}, {}, 8),  # the preset's 8 already splits
        ("ddp", 3, {}, {}, 9),  # rounded up to split 3 ways
        ("ddp", 3, {}, {"grad_accumulation_steps": 2}, 12),  # 3 replicas × 2 micro-steps
        ("pp", 4, {}, {}, 8),  # 8 micro-batches by default
        ("pp", 2, {"microbatches": 3}, {}, 9),
        ("hybrid", 6, {"tp": 2}, {}, 9),  # dp = 3
        ("tp", 2, {}, {}, 8),  # no data parallelism: nothing to split
        ("ddp", 2, {}, {"model": "small"}, PRESETS["small"].global_batch_size),
    ],
)
def test_the_default_batch_is_the_presets_rounded_up_to_split_evenly(strategy, world, options, workload, batch):
    job = resolve(strategy, world, options, **workload)
    assert job.global_batch_size == batch
    assert job.spec.workload.global_batch_size == batch


def test_a_batch_the_user_sets_is_checked_as_given_not_rounded():
    with pytest.raises(SpecError, match="global batch size \\(8\\) is not divisible by 3"):
        resolve("ddp", 3, global_batch_size=8)


def test_moe_on_a_dense_preset_gets_the_presets_experts_unless_the_spec_names_some():
    assert resolve("moe", 2).model.num_experts == PRESETS["tiny"].moe_experts
    assert resolve("moe", 2, num_experts=8).model.num_experts == 8
    assert resolve("ddp", 2).model.num_experts == 0


def test_shape_overrides_replace_only_what_they_name():
    job = resolve("ddp", 2, num_layers=2, seq_len=32)
    preset = PRESETS["tiny"].config
    assert (job.model.num_layers, job.model.seq_len) == (2, 32)
    assert job.model.model_copy(update={"num_layers": preset.num_layers, "seq_len": preset.seq_len}) == preset


def test_the_mesh_and_dp_degree_come_from_the_descriptor():
    hybrid = resolve("hybrid", 4, {"tp": 2})
    assert [(d.name, d.size) for d in hybrid.mesh] == [("dp_shard", 2), ("tp", 2)]  # a layout names its dims
    assert hybrid.dp_degree == 2
    assert (resolve("tp", 2).dp_degree, resolve("ring", 2).dp_degree, resolve("ddp", 4).dp_degree) == (1, 1, 4)
    assert resolve("collectives", 2).tokens_per_step == 0


# ---- one list of strategies, one list of workload fields ----


def test_the_registry_the_specs_enum_and_the_names_agree():
    schema = JobSpec.model_json_schema()
    enum = schema["$defs"]["StrategySpec"]["properties"]["name"]["enum"]
    assert enum == list(REGISTRY) == list(STRATEGY_NAMES)
    assert all(descriptor.name == name for name, descriptor in REGISTRY.items())
    assert set(CONTRACTUAL) <= set(STRATEGY_NAMES)
    assert [n for n in STRATEGY_NAMES if n not in TRAINING_STRATEGIES] == ["collectives", "calibrate"]


@pytest.mark.parametrize("strategy", list(REGISTRY))
def test_every_options_model_refuses_unknown_keys_and_is_frozen(strategy):
    model = REGISTRY[strategy].options_model
    assert model.model_config.get("extra") == "forbid"
    assert model.model_config.get("frozen") is True


def test_workload_fields_list_every_field_once_with_a_unique_flag():
    fields = workload_fields()
    assert [f.name for f in fields if f.group == "shape"] == list(SHAPE_FIELDS) == list(ModelConfig.model_fields)
    assert {f.name for f in fields} == set(Workload.model_fields) - set(INPUT_FIELDS)  # a config.json is resolved away
    flags = [f.cli for f in fields]
    assert len(set(flags)) == len(flags) and all(flag.startswith("--") for flag in flags)
    assert tuple(f.name for f in fields if f.workload_key) == WORKLOAD_KEY_FIELDS
    assert {"norm_eps", "rope_theta", "steps", "seed"}.isdisjoint(WORKLOAD_KEY_FIELDS)
    assert {"num_layers", "hidden_size", "precision", "global_batch_size"} <= set(WORKLOAD_KEY_FIELDS)
