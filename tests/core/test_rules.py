"""Every rule a job spec must satisfy raises a SpecError that names the field at fault.

Each case is a spec that breaks one rule and, beside it, the same spec with that field put right,
which must resolve: so the rule is known to be about that field and nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.jobs import Limits, resolve_job
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.spec import JobSpec
from parallab.core.strategies import REGISTRY


def spec(strategy: str, world: int, options: dict[str, Any] | None = None, **workload: Any) -> dict[str, Any]:
    return {"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}


def problems_of(doc: dict[str, Any], limits: Limits | None = None) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        resolve_job(JobSpec.model_validate(doc), limits)
    return caught.value.problems


def case(name: str, broken: dict, field: str, says: str, fixed: dict, limits: Limits | None = None) -> Any:
    """A spec that breaks one rule, the field it must name (dotted), what the message says, the spec put right."""
    return pytest.param(broken, tuple(field.split(".")), says, fixed, limits, id=name)


W, OPT = "workload", "strategy.options"
CASES = [
    case("heads/tp", spec("tp", 3, ffn_hidden_size=192), f"{W}.num_heads", "heads (4) is not divisible by 3",
         spec("tp", 2, ffn_hidden_size=192)),
    case("ffn/tp", spec("tp", 2, ffn_hidden_size=255), f"{W}.ffn_hidden_size", "ffn hidden size (255) is not divisible by 2",
         spec("tp", 2, ffn_hidden_size=254)),
    case("seq/sp", spec("tp", 2, {"sequence_parallel": True}, seq_len=63), f"{W}.seq_len", "sequence length (63)",
         spec("tp", 2, {"sequence_parallel": False}, seq_len=63)),
    case("layers/stages", spec("pp", 3), f"{W}.num_layers", "layers (4) is not divisible by 3", spec("pp", 3, num_layers=6)),
    case("micro-batches < stages", spec("pp", 2, {"microbatches": 1}), f"{OPT}.microbatches",
         "micro-batches (1) must be at least pp=2 stages", spec("pp", 2, {"microbatches": 2})),
    case("batch/dp", spec("ddp", 2, global_batch_size=7), f"{W}.global_batch_size", "global batch size (7) is not divisible by 2",
         spec("ddp", 2, global_batch_size=6)),
    case("batch/accumulation", spec("ddp", 2, global_batch_size=6, grad_accumulation_steps=2), f"{W}.global_batch_size",
         "global batch size (6) is not divisible by 4", spec("ddp", 2, global_batch_size=8, grad_accumulation_steps=2)),
    case("batch/pp micro-batches", spec("pp", 2, {"microbatches": 4}, global_batch_size=6), f"{W}.global_batch_size",
         "global batch size (6) is not divisible by 4", spec("pp", 2, {"microbatches": 4}, global_batch_size=12)),
    case("seq/ring", spec("ring", 4, seq_len=66), f"{W}.seq_len", "sequence length (66) is not divisible by 4",
         spec("ring", 4, seq_len=68)),
    case("cp/fsdp over cp", spec("layout", 4, {"cp": 2, "shard_over_cp": True}), f"{OPT}.shard_over_cp", "predicted only",
         spec("layout", 4, {"cp": 2})),
    case("seq/ring zig-zag", spec("ring", 2, {"zigzag": True}, seq_len=66), f"{W}.seq_len", "zig-zag: 2 chunks a rank",
         spec("ring", 2, {"zigzag": False}, seq_len=66)),
    case("experts/world", spec("moe", 3), f"{W}.num_experts", "experts (4) is not divisible by 3", spec("moe", 3, num_experts=6)),
    case("hybrid mesh", spec("hybrid", 6, {"tp": 4}, num_heads=8, ffn_hidden_size=512), f"{OPT}.tp", "does not make world size 6",
         spec("hybrid", 6, {"tp": 2}, num_heads=8, ffn_hidden_size=512)),
    case("hybrid dp ≥ 2", spec("hybrid", 2, {"tp": 2}), f"{OPT}.tp", "needs tp ≥ 2 and dp ≥ 2", spec("hybrid", 4, {"tp": 2})),
    case("hybrid heads/tp", spec("hybrid", 16, {"tp": 8}), f"{W}.num_heads", "heads (4) is not divisible by 8",
         spec("hybrid", 16, {"tp": 4})),
    case("collectives min > max", spec("collectives", 2, {"min_bytes": 4096, "max_bytes": 1024}), f"{OPT}.min_bytes",
         "min_bytes is above max_bytes", spec("collectives", 2, {"min_bytes": 1024, "max_bytes": 4096})),
    case("fp8/tp", spec("tp", 2, precision="fp8"), f"{W}.precision", "fp8 with tp needs torchao's Float8 tensor-parallel styles",
         spec("tp", 2, precision="bf16")),
    case("world above the limit", spec("ddp", 8), "strategy.world_size", "above this deployment's limit of 4", spec("ddp", 4),
         Limits(max_world_size=4)),
    case("steps above the limit", spec("ddp", 2, steps=50), f"{W}.steps", "above this deployment's limit of 10", spec("ddp", 2, steps=10),
         Limits(max_steps=10)),
    case("single on 2 ranks", spec("single", 2), "strategy.world_size", "exactly 1 rank", spec("single", 1)),
    case("ddp on 1 rank", spec("ddp", 1), "strategy.world_size", "ddp needs at least 2 ranks", spec("ddp", 2)),
    case("unknown preset", spec("ddp", 2, model="huge"), f"{W}.model", "unknown model preset 'huge'", spec("ddp", 2, model="small")),
    case("unknown option key", spec("fsdp", 2, {"reshard": False}), OPT, "unknown option 'reshard'; valid: reshard_after_forward",
         spec("fsdp", 2, {"reshard_after_forward": False})),
    case("option out of bounds", spec("hybrid", 4, {"tp": 0}), f"{OPT}.tp", "greater than or equal to 1", spec("hybrid", 4, {"tp": 2})),
    case("hidden/heads", spec("ddp", 2, num_heads=3), f"{W}.num_heads", "hidden_size 64 is not divisible by num_heads 3",
         spec("ddp", 2, num_heads=2)),
    case("rotary head dim", spec("ddp", 2, hidden_size=96, num_heads=32), f"{W}.num_heads", "must be even",
         spec("ddp", 2, hidden_size=96, num_heads=16)),
    case("top_k > experts", spec("moe", 2, num_experts=2, top_k=3), f"{W}.top_k", "top_k 3 must be between 1 and num_experts 2",
         spec("moe", 2, num_experts=2, top_k=2)),
]  # fmt: skip


@pytest.mark.parametrize(("broken", "loc", "says", "fixed", "limits"), CASES)
def test_a_broken_rule_names_its_field(broken, loc, says, fixed, limits):
    problems = problems_of(broken, limits)
    assert [p.loc for p in problems] == [loc], problems
    assert says in problems[0].msg
    assert resolve_job(JobSpec.model_validate(fixed), limits).spec.strategy.name == fixed["strategy"]["name"]


DENSE_ONLY = [name for name, d in REGISTRY.items() if d.dense_only]


@pytest.mark.parametrize("strategy", DENSE_ONLY)
def test_dense_only_strategies_refuse_experts(strategy):
    world = 4 if strategy == "hybrid" else 2
    problems = problems_of(spec(strategy, world, num_experts=4))
    assert [p.loc for p in problems] == [("workload", "num_experts")]
    assert f"{strategy} supports dense models only" in problems[0].msg


def test_dense_only_covers_the_strategies_that_cannot_route_experts():
    assert set(DENSE_ONLY) == {"pp", "ring"}
    resolve_job(JobSpec.model_validate(spec("moe", 2, num_experts=4)))  # the one that splits them
    # tp keeps every expert whole on each rank, so an MoE model runs it, alone or beside FSDP
    for strategy, world, options in (("tp", 2, {}), ("hybrid", 4, {"tp": 2})):
        assert resolve_job(JobSpec.model_validate(spec(strategy, world, options, num_experts=4))).model.is_moe
    sp = problems_of(spec("tp", 2, {"sequence_parallel": True}, num_experts=4))
    assert [p.loc for p in sp] == [("strategy", "options", "sequence_parallel")], sp


def test_fp8_is_a_spec_the_device_decides_except_under_tensor_parallelism():
    """fp8 resolves for the strategies torchao's float8 training wraps plainly; whether the device
    can run it is the device's rule (`hardware.precision_problem`), checked where it is known."""
    for strategy, world in (("collectives", 2), ("ddp", 2), ("fsdp", 2), ("pp", 2), ("single", 1)):
        resolve_job(JobSpec.model_validate(spec(strategy, world, precision="fp8")))
    assert [p.loc for p in problems_of(spec("hybrid", 4, {"tp": 2}, precision="fp8"))] == [("workload", "precision")]


def test_every_problem_is_reported_at_once_and_reads_field_first():
    problems = problems_of(spec("tp", 3, precision="fp8"), Limits(max_world_size=2))
    assert {p.loc for p in problems} == {
        ("strategy", "world_size"),
        ("workload", "num_heads"),
        ("workload", "ffn_hidden_size"),
        ("workload", "precision"),
    }
    heads = next(p for p in problems if p.loc == ("workload", "num_heads"))
    assert str(heads) == "workload.num_heads: heads (4) is not divisible by 3 (tp=3)"
    detail = {"loc": ["body", "workload", "num_heads"], "msg": "heads (4) is not divisible by 3 (tp=3)", "type": "value_error"}
    assert heads.as_detail() == detail


def test_bounds_and_unknown_strategies_fail_in_the_spec_itself():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(spec("warp", 2, seq_len=1))
    locs = {tuple(e["loc"]) for e in caught.value.errors()}
    assert locs == {("strategy", "name"), ("workload", "seq_len")}


def test_fsdp_over_cp_is_predicted_where_a_run_is_refused():
    """torchtitan's dp_shard_cp layout resolves for a prediction (`predict_only`), FSDP then sharding over dp_shard × cp."""
    job = resolve_job(JobSpec.model_validate(spec("layout", 4, {"cp": 2, "shard_over_cp": True})), predict_only=True)
    assert job.layout is not None and (job.layout.dp_shard, job.layout.fsdp_shards) == (2, 4)


def test_fsdp_over_cp_is_stored_only_where_it_is_on():
    """Off, the option is left out of the stored options, so a layout run's leaderboard key is what
    it was before the option existed; on, it is kept and resolves to FSDP over dp_shard × cp."""
    off = resolve_job(JobSpec.model_validate(spec("layout", 4, {"cp": 2})))
    assert "shard_over_cp" not in off.spec.strategy.options and "zigzag" in off.spec.strategy.options
    on = resolve_job(JobSpec.model_validate(spec("layout", 4, {"cp": 2, "shard_over_cp": True})), predict_only=True)
    again = resolve_job(JobSpec.model_validate(on.spec.model_dump(mode="json")), predict_only=True)
    assert again.spec.strategy.options["shard_over_cp"] is True and again.fsdp_shards == 4
