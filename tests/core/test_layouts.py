"""Layouts: every strategy resolves to one, every preset predicts exactly what its layout written
out predicts, bad degrees name the dimension and the numbers, and the planner's grid is the
runtime's grid."""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core import dims
from parallab.core.hardware import load_catalogue
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.layout import MESH_ORDER, Layout, MeshAxisName, parse_layout
from parallab.core.plan_hardware import Hardware
from parallab.core.prediction import predict
from parallab.core.problems import SpecError
from parallab.core.ranking import plan_cluster
from parallab.core.spec import JobSpec
from parallab.core.strategies import REFERENCE_STRATEGY, TRAINING_STRATEGIES, get_descriptor
from parallab.core.strategies.layout import LayoutOptions
from workers.strategies import MODULES


def resolve(strategy: str, world: int, options: dict[str, Any] | None = None, **workload: Any) -> ResolvedJob:
    doc = {"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}
    return resolve_job(JobSpec.model_validate(doc), Limits())


def problems(strategy: str, world: int, options: dict[str, Any] | None = None, **workload: Any) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(SpecError) as caught:
        resolve(strategy, world, options, **workload)
    return [(p.loc, p.msg) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("strategy", "world", "options", "degrees"),
    [
        ("single", 1, {}, {}),
        ("ddp", 4, {}, {"dp_replicate": 4}),
        ("fsdp", 4, {}, {"dp_shard": 4}),
        ("tp", 2, {}, {"tp": 2}),
        ("pp", 2, {}, {"pp": 2}),
        ("ring", 2, {}, {"cp": 2}),
        ("moe", 2, {}, {"ep": 2}),
        ("hybrid", 8, {"tp": 2}, {"dp_shard": 4, "tp": 2}),
        ("hsdp", 4, {}, {"dp_replicate": 2, "dp_shard": 2}),
        ("3d", 8, {}, {"pp": 2, "dp_shard": 2, "tp": 2}),
        ("layout", 8, {"pp": 2, "tp": 2}, {"pp": 2, "dp_shard": 2, "tp": 2}),  # dp_shard takes the rest
    ],
)
def test_every_strategy_is_a_preset_of_a_layout(strategy, world, options, degrees):
    job = resolve(strategy, world, options, **({"num_experts": 4} if strategy == "moe" else {}))
    layout = job.layout
    assert layout is not None and layout.size == world
    assert {k: v for k, v in layout.degrees.items() if v > 1} == degrees


def test_the_mesh_names_the_dims_in_torchtitans_order_and_leaves_degree_one_out():
    job = resolve("3d", 8)
    assert [(d.name, d.size) for d in job.mesh] == [("pp", 2), ("dp_shard", 2), ("tp", 2)]
    assert [d.name for d in resolve("hsdp", 4).mesh] == ["dp_replicate", "dp_shard"]
    assert job.dp_degree == 2 and resolve("hsdp", 8, {"dp_replicate": 2}).dp_degree == 8


def test_one_vocabulary_names_the_dims_of_layouts_meshes_and_dimension_modules():
    """A layout's degrees, the dimension modules and the mesh order are one list of names, and no
    training strategy's mesh names a dim outside it (the old 1-D "dp" mesh included)."""
    assert list(Layout().degrees) == list(MESH_ORDER) == [axis.value for axis in MeshAxisName]
    assert set(dims.DIMENSIONS) == set(MESH_ORDER)
    for name in TRAINING_STRATEGIES:
        descriptor = get_descriptor(name)
        for world in (1, 2, 4, 8):
            for options in descriptor.plan_grid(world):
                parsed = descriptor.complete_options(descriptor.parse_options(options), world)
                assert {d.name for d in descriptor.mesh(world, parsed)} <= set(MESH_ORDER), (name, world, options)


def test_an_explicit_layout_is_the_same_job_as_its_preset():
    hybrid, explicit = resolve("hybrid", 4, {"tp": 2}), resolve("layout", 4, {"dp_shard": 2, "tp": 2})
    assert hybrid.layout == explicit.layout
    for what in ("param_elements_per_rank", "comm_bytes_per_step", "comm_items", "activation_layouts"):
        assert getattr(hybrid.descriptor, what)(hybrid) == getattr(explicit.descriptor, what)(explicit), what


OFF_DEFAULT: dict[str, list[dict[str, Any]]] = {
    "ddp": [{"bucket_cap_mb": 1.0}],
    "tp": [{"async_tp": True}],
    "pp": [{"schedule": "zbv", "virtual_stages": 2}, {"schedule": "gpipe", "microbatches": 8}],
    "moe": [{"aux_loss_coef": 0.5}],
    "hsdp": [{"reshard_after_forward": False}],
}
"""Options away from their defaults that the planner's grid leaves out (each must reach the layout)."""
PRESET_GRID = [
    (name, world, options, model)
    for name in TRAINING_STRATEGIES
    if name not in (REFERENCE_STRATEGY, "layout")
    for world in (2, 4, 8)
    for options in get_descriptor(name).plan_grid(world) + OFF_DEFAULT.get(name, [])
    for model in ("tiny", "small")
]
H100_2x4 = Hardware(spec=load_catalogue().get("h100"), nodes=2, devices_per_node=4)


def _explicit(job: ResolvedJob) -> ResolvedJob:
    """`job` as the explicit `layout` strategy of its preset's layout, every degree and option written out."""
    assert job.layout is not None
    options = {k: v for k, v in job.layout.as_dict().items() if k in LayoutOptions.model_fields}
    doc = job.spec.model_dump(mode="json")
    doc["strategy"] = {**doc["strategy"], "name": "layout", "options": options}
    return resolve_job(JobSpec.model_validate(doc), Limits())


@pytest.mark.parametrize(("strategy", "world", "options", "model"), PRESET_GRID)
def test_every_preset_is_its_layout_written_out(strategy, world, options, model):
    """A preset is nothing but its layout: its mesh (named by the one vocabulary, degree-one dims
    left out), batch split and whole prediction — bytes, memory, step time on two nodes — are
    those of the explicit `layout` of the same degrees and options, and each of its options is
    the layout's."""
    try:
        job = resolve(strategy, world, options, model=model)
    except SpecError:
        pytest.skip("not a job of this model (the planner's grid is the model's too)")
    assert job.layout is not None
    laid_out = {k: v for k, v in job.options.model_dump().items() if k in Layout.__dataclass_fields__ and v is not None}
    assert laid_out == {k: getattr(job.layout, k) for k in laid_out}, "every option of the preset reaches its layout"
    explicit = _explicit(job)
    assert job.layout == explicit.layout
    assert [(d.name, d.size) for d in job.mesh] == [(d.name, d.size) for d in explicit.mesh]
    assert [d.name for d in job.mesh] == list(job.layout.on) and set(job.layout.on) <= set(MESH_ORDER)
    assert (job.dp_degree, job.micro_batch_size) == (explicit.dp_degree, explicit.micro_batch_size) == (job.layout.dp, job.micro_batch_size)
    assert predict(job, H100_2x4) == predict(explicit, H100_2x4)


def test_hsdp_holds_a_dp_shard_share_and_all_reduces_the_shard_over_the_replicas():
    hsdp, fsdp2 = resolve("hsdp", 4), resolve("fsdp", 2)
    assert hsdp.descriptor.param_elements_per_rank(hsdp) == fsdp2.descriptor.param_elements_per_rank(fsdp2)
    comm, inner = hsdp.descriptor.comm_bytes_per_step(hsdp), fsdp2.descriptor.comm_bytes_per_step(fsdp2)
    assert comm == {**inner, "all_reduce": inner["reduce_scatter"] // 2}
    groups = {(i.op, i.group_size, i.stride) for i in hsdp.descriptor.comm_items(hsdp)}
    assert groups == {("all_gather", 2, 1), ("reduce_scatter", 2, 1), ("all_reduce", 2, 2)}


@pytest.mark.parametrize(("options", "workload", "inner"), [({"cp": 2}, {}, "ring"), ({"ep": 2}, {"num_experts": 4}, "moe")])
def test_cp_or_ep_beside_dp_shard_all_reduce_the_fsdp_shard_of_what_they_replicate(options, workload, inner):
    """Beside dp_shard, cp and ep keep their own traffic (the ring's hops at a data-parallel group's
    tokens, the all-to-alls at a rank's rows) and all-reduce, over their own dim, only the FSDP
    shard of the gradients they replicate: half of what they all-reduce alone at half the batch."""
    job = resolve("layout", 4, {**options, "dp_shard": 2}, **workload)
    alone = resolve(inner, 2, {}, **workload, global_batch_size=job.global_batch_size // 2)
    comm, own = job.descriptor.comm_bytes_per_step(job), alone.descriptor.comm_bytes_per_step(alone)
    assert {op: comm[op] for op in own if op != "all_reduce"} == {op: b for op, b in own.items() if op != "all_reduce"}
    assert comm["all_reduce"] == own["all_reduce"] // 2
    groups = {(i.op, i.group_size, i.stride) for i in job.descriptor.comm_items(job)}
    assert {("all_gather", 2, 2), ("reduce_scatter", 2, 2), ("all_reduce", 2, 1)} <= groups
    assert len(job.mesh) == 2 and job.mesh[0].name == "dp_shard" and job.dp_degree == (2 if inner == "ring" else 4)


def test_pp_by_tp_does_one_end_of_tp_per_stage_and_3d_cuts_state_three_ways():
    job = resolve("layout", 4, {"pp": 2, "tp": 2})
    bsh = job.global_batch_size * job.model.seq_len * job.model.hidden_size * 4
    assert job.descriptor.comm_bytes_per_step(job)["all_reduce"] == (4 * job.model.num_layers // 2 + 1) * bsh
    three = resolve("3d", 8)
    pp_only = resolve("pp", 2)
    assert max(three.descriptor.param_elements_per_rank(three)) < max(pp_only.descriptor.param_elements_per_rank(pp_only)) / 3


@pytest.mark.parametrize(
    ("strategy", "world", "options", "workload", "loc", "says"),
    [
        ("layout", 4, {"pp": 2, "tp": 2, "dp_shard": 2}, {}, ("strategy", "options"), "× tp=2 make 8 ranks, not the world size 4"),
        ("layout", 8, {"tp": 8}, {}, ("workload", "num_heads"), "heads (4) is not divisible by 8 (tp=8)"),
        ("layout", 6, {"pp": 3, "dp_shard": 2}, {}, ("workload", "num_layers"), "layers (4) is not divisible by 3 (pp=3)"),
        ("layout", 4, {"ep": 4}, {}, ("workload", "num_experts"), "ep=4 needs a model with experts; 0 experts is a dense model"),
        ("layout", 4, {"pp": 2, "dp_shard": 2}, {"global_batch_size": 6}, ("workload", "global_batch_size"), "global batch size (6)"),
        ("layout", 4, {"pp": 2, "dp_shard": 2, "microbatches": 1}, {}, ("strategy", "options", "microbatches"), "at least pp=2"),
        ("layout", 4, {"cp": 2, "tp": 2}, {}, ("strategy", "options", "cp"), "cp=2 beside tp=2 is not composed by the ranks yet"),
        ("layout", 8, {"cp": 2, "ep": 2, "dp_shard": 2}, {"num_experts": 4}, ("strategy", "options", "ep"),
         "ep=2 is composed with dp_shard only for now, not with cp=2"),
        ("layout", 4, {"ep": 2, "pp": 2}, {"num_experts": 4}, ("strategy", "options", "ep"),
         "ep=2 is composed with dp_shard only for now, not with pp=2"),
        ("hsdp", 4, {"dp_replicate": 4}, {}, ("strategy", "options", "dp_replicate"), "dp_replicate=4 on 4 ranks"),
        ("3d", 4, {}, {}, ("strategy", "options"), "pp=2 × tp=2 on 4 ranks"),
        ("3d", 8, {}, {"precision": "fp8"}, ("workload", "precision"), "fp8 with 3d needs torchao's Float8 tensor-parallel styles"),
    ],
)  # fmt: skip
def test_bad_degrees_name_the_dimension_and_the_numbers(strategy, world, options, workload, loc, says):
    found = problems(strategy, world, options, **workload)
    assert [p for p in found if p[0] == loc and says in p[1]], found


def test_a_dense_only_dimension_refuses_experts_and_ep_takes_them():
    assert problems("layout", 4, {"dp_shard": 2, "cp": 2}, num_experts=4) == [
        (("workload", "num_experts"), "cp=2 supports dense models only (4 experts)")
    ]
    assert resolve("hsdp", 4, num_experts=4).model.is_moe  # FSDP shards experts like any tensor


def test_a_stored_strategy_block_resolves_to_its_layout_and_a_preset_meets_its_explicit_layout():
    from parallab.core.strategies import layout_of

    hybrid, explicit = layout_of("hybrid", 4, {"tp": 2}), layout_of("layout", 4, {"dp_shard": 2, "tp": 2})
    assert hybrid is not None and hybrid == explicit and hybrid.label() == "dp_shard=2,tp=2"
    assert layout_of("pp", 4, {}) == Layout(pp=4, microbatches=8)
    assert layout_of("warp", 2, {}) is None and layout_of("ddp", 2, {"bucket": 1}) is None and layout_of("collectives", 2, {}) is None


def test_parse_layout_reads_degrees_and_refuses_what_is_not_one():
    assert parse_layout("pp=2, dp_shard=2,tp=2") == {"pp": 2, "dp_shard": 2, "tp": 2}
    for bad, says in [
        ("pp=2,pp=2", "given twice"),
        ("dp=2", "DIM=DEGREE"),
        ("tp=0", "at least 1"),
        ("tp=x", "whole number"),
        ("", "empty"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_layout(bad)
    assert Layout(pp=2, dp_shard=2, tp=2).label() == "pp=2,dp_shard=2,tp=2" and Layout().label() == "single"


def test_every_fitting_plan_candidate_for_tiny_on_8_ranks_is_a_job_the_ranks_can_run():
    """The planner's grid is the runtime's grid: each fitting candidate resolves as a job spec, its
    strategy has a rank module, and its layout fills the 8 ranks."""
    hw = Hardware(spec=load_catalogue().get("h100"), nodes=1, devices_per_node=8)
    ranking = plan_cluster({"model": "tiny"}, hw, world_size=8, precisions=("fp32",), checkpointing=("none",), accumulation=(1,))
    assert {"ddp", "fsdp", "hsdp", "hybrid", "ring", "3d"} <= {r.strategy for r in ranking.fits}
    for row in ranking.fits:
        job = resolve_job(JobSpec.model_validate(row.spec), Limits(max_world_size=8))
        assert job.strategy in MODULES and job.layout is not None and job.layout.size == 8, row.label


def test_sequence_parallel_all_reduces_the_norms_gradients_once_per_step():
    """Korthikanti et al. 2022: under SP each rank's norm-weight gradient is a partial sum over its
    sequence shard, all-reduced over tp — h fp32 elements per norm, 2 per block and the final one,
    one call per norm per optimizer step (not per micro-step); without SP the norms see the whole
    sequence and need none beyond Megatron's activations' all-reduces."""
    sp = resolve("tp", 2, {"sequence_parallel": True}, global_batch_size=8, grad_accumulation_steps=2)
    cfg = sp.model
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    assert norms == 9 * 64
    assert sp.descriptor.comm_bytes_per_step(sp)["all_reduce"] == norms * 4
    items = {i.op: i for i in sp.descriptor.comm_items(sp)}
    assert items["all_reduce"].calls == 2 * cfg.num_layers + 1 and items["all_reduce"].bytes_per_call == cfg.hidden_size * 4
    assert items["reduce_scatter"].calls == (4 * cfg.num_layers + 2) * 2  # the activations' collectives are per micro-step
    plain = resolve("tp", 2, {}, global_batch_size=8)
    bsh = plain.global_batch_size * cfg.seq_len * cfg.hidden_size * 4
    assert plain.descriptor.comm_bytes_per_step(plain)["all_reduce"] == (4 * cfg.num_layers + 2) * bsh


def test_tp_on_an_moe_model_all_reduces_around_the_attention_only():
    """Megatron's count per layer is 4 all-reduces of b·s·h: attention and MLP, forward and backward.
    An MoE block's experts stay whole on every tp rank, so its MLP adds none: 2 per MoE layer, 4 per
    dense first layer, and the two ends."""
    moe = resolve("tp", 2, {}, global_batch_size=8, num_experts=4, first_dense_layers=1)
    cfg = moe.model
    assert (cfg.num_layers, cfg.moe_layers) == (4, 3)
    bsh = moe.global_batch_size * cfg.seq_len * cfg.hidden_size * 4
    assert moe.descriptor.comm_bytes_per_step(moe)["all_reduce"] == (4 * 1 + 2 * 3 + 2) * bsh
    items = {i.op: i for i in moe.descriptor.comm_items(moe)}
    assert items["all_reduce"].calls == 4 * 1 + 2 * 3 + 2
    # the router and the experts are not split: every tp rank holds them whole; the attention is split
    from parallab.core.costs import tp_local
    from parallab.core.families import model_tensors

    tensors = {t.name: t for t in model_tensors(cfg)}
    whole = [t for name, t in tensors.items() if t.expert or ".router." in name]
    assert len(whole) == 3 * 4 and all(tp_local(t, 2) == t.shape for t in whole)
    assert tp_local(tensors["layers.1.attention.wq.weight"], 2) == (cfg.hidden_size // 2, cfg.hidden_size)


def test_under_fsdp_in_16_bits_the_norms_gradients_are_all_reduced_in_16_bits():
    """FSDP's param_dtype gathers the norm weights in bf16, so their gradients are made and
    all-reduced over tp in bf16; alone (or beside dp_replicate) they are fp32 master gradients."""
    h, norms = 64, 9
    fsdp = resolve("layout", 4, {"dp_shard": 2, "tp": 2, "sequence_parallel": True}, precision="bf16")
    replicated = resolve("layout", 4, {"dp_replicate": 2, "tp": 2, "sequence_parallel": True}, precision="bf16")

    def tp_all_reduces(job: ResolvedJob) -> list[int]:
        assert job.layout is not None
        items = dims.compose(job, job.layout).comm_items()
        return [i.bytes_per_step for i in items if i.op == "all_reduce" and i.stride == 1]  # tp is the innermost dim

    assert tp_all_reduces(fsdp) == [norms * h * 2]
    assert tp_all_reduces(replicated) == [norms * h * 4]


@pytest.mark.parametrize("family", ["parallab", "hf"])
def test_the_norm_count_is_every_module_the_familys_tp_plan_runs_sequence_parallel(family):
    """`norm_elements` is h per module each family's plan marks "norm" (SequenceParallel under SP)."""
    from parallab.core.dims.tp import norm_elements
    from parallab.core.families import FAMILIES

    cfg = resolve("tp", 2, {"sequence_parallel": True}).model.model_copy(update={"family": family})
    fam = FAMILIES[family]
    styled = list(fam.root_plan(cfg).values()) + [s for layer in range(cfg.num_layers) for s in fam.block_plan(cfg, layer).values()]
    assert norm_elements(cfg) == styled.count("norm") * cfg.hidden_size


@pytest.mark.parametrize("name", [n for n in TRAINING_STRATEGIES if not getattr(get_descriptor(n).options_model, "stored_when_on", ())])
def test_a_presets_options_serialize_under_their_own_schema(name):
    """A preset without flags stored only when on has no serializer of its own: its options' schema
    (what the API publishes for a response) names its fields, as before the presets became layouts."""
    model = get_descriptor(name).options_model
    assert model.model_json_schema(mode="serialization") == model.model_json_schema()
