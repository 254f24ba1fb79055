"""The planner reads a pool's topology: a collective whose groups span nodes is timed on the pool's
inter-node link (the textbook ring: 2(n−1)/n·S over the link's share plus 2(n−1) latencies for an
all-reduce), one inside a node on the node's own path — so the inter-node bandwidth moves a
prediction only through the dimensions that cross nodes."""

from __future__ import annotations

import pytest

from parallab.core.hardware import load_catalogue
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.plan_hardware import LINK_EFFICIENCY, Hardware, hardware_for
from parallab.core.planner import estimate_step_time
from parallab.core.pools import LinkFigures, PoolTopology
from parallab.core.spec import JobSpec

CPU = load_catalogue().get("cpu")
INSIDE = LinkFigures(bandwidth_bps=12.8e9, latency_s=1e-4)


def job(strategy: str, world: int, options: dict | None = None, nodes: int = 2) -> ResolvedJob:
    doc = {
        "workload": {"model": "tiny", "steps": 4},
        "strategy": {"name": strategy, "world_size": world, "options": options or {}},
        "placement": {"nodes": nodes} if nodes > 1 else None,
    }
    return resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=16, max_steps=100))


def pool(rate_bps: float, *, measured: float | None = None, latency_s: float = 0.0, per_node: int = 2) -> PoolTopology:
    return PoolTopology(
        source="emulated",
        nodes=2,
        ranks_per_node=per_node,
        inter_node=LinkFigures(bandwidth_bps=rate_bps, latency_s=latency_s),
        measured_inter_node=LinkFigures(bandwidth_bps=measured, latency_s=latency_s) if measured else None,
        measured_intra_node=INSIDE,
    )


def on(j: ResolvedJob, topology: PoolTopology) -> Hardware:
    return hardware_for(CPU, nodes=j.nodes, devices_per_node=j.ranks_per_node, topology=topology)


def test_an_all_reduce_across_nodes_is_the_textbook_ring_on_the_link() -> None:
    hw = hardware_for(CPU, nodes=2, devices_per_node=2, topology=pool(1e9, measured=0.8e9, latency_s=2e-4))
    size, n = 64 << 20, 4
    expected = 2 * (n - 1) * 2e-4 + 2 * (n - 1) / n * size / (0.8e9 / 8)
    assert hw.comm_seconds("all_reduce", size, 1, n) == pytest.approx(expected)
    # Unmeasured: the declared rate at the uncalibrated link efficiency.
    declared = hardware_for(CPU, nodes=2, devices_per_node=2, topology=pool(1e9, latency_s=2e-4))
    assert declared.comm_seconds("all_reduce", size, 1, n) == pytest.approx(2 * 3 * 2e-4 + 1.5 * size / (1e9 / 8 * LINK_EFFICIENCY))
    # Inside a node: the measured intra-node path, whatever the link.
    assert hw.comm_seconds("all_reduce", size, 1, 2) == pytest.approx(2 * 1e-4 + size / (12.8e9 / 8))


def test_groups_that_share_a_nodes_link_split_it() -> None:
    """2 × 2, dp_shard across with tp inside: each node's two ranks are in two dp_shard groups, both
    crossing at once over the node's one link; ddp over all four runs one ring through it."""
    hw = hardware_for(CPU, nodes=2, devices_per_node=2, topology=pool(1e9, measured=1e9))
    assert hw.link_sharers(group_size=2, stride=2) == 2
    assert hw.link_sharers(group_size=4, stride=1) == 1
    assert hw.comm_seconds("all_gather", 1 << 20, 1, 2, stride=2) == pytest.approx(0.5 * (1 << 20) / (1e9 / 8 / 2))


@pytest.mark.parametrize(
    ("strategy", "world", "options", "nodes", "crossing", "inside"),
    [
        ("tp", 2, {}, 1, [], ["tp"]),  # tp=2 inside one node
        ("tp", 2, {}, 2, ["tp"], []),  # tp=2 across two nodes of one rank each
        ("ddp", 4, {}, 2, ["dp_replicate"], []),
        ("fsdp", 4, {}, 2, ["dp_shard"], []),
        ("hybrid", 4, {"tp": 2}, 2, ["dp_shard"], ["tp"]),  # fsdp across, tp inside
        ("tp", 4, {}, 2, ["tp"], []),
    ],
)
def test_the_inter_node_bandwidth_moves_only_the_dimensions_that_cross(
    strategy: str, world: int, options: dict, nodes: int, crossing: list[str], inside: list[str]
) -> None:
    j = job(strategy, world, options, nodes)
    fast = estimate_step_time(j, on(j, pool(1e9, measured=1e9, per_node=j.ranks_per_node)))
    slow = estimate_step_time(j, on(j, pool(2e8, measured=2e8, per_node=j.ranks_per_node)))
    assert fast.inter_node_dims == slow.inter_node_dims == crossing
    for dim in crossing:  # bandwidth-bound at this size: 5× slower link, about 5× the time
        assert slow.comm_by_dim[dim] == pytest.approx(5 * fast.comm_by_dim[dim], rel=0.02)
    for dim in inside:
        assert slow.comm_by_dim[dim] == fast.comm_by_dim[dim]
    assert fast.compute_s == slow.compute_s
    assert (slow.step_s > fast.step_s) == bool(crossing)
    assert sum(fast.exposed_by_dim.values()) == pytest.approx(fast.exposed_comm_s)


def test_tp_across_nodes_is_predicted_slower_than_tp_inside_and_without_topology_they_tie() -> None:
    inside, across = job("tp", 2, nodes=1), job("tp", 2, nodes=2)
    topo = pool(1e9, measured=1e9)
    assert (
        estimate_step_time(across, on(across, pool(1e9, measured=1e9, per_node=1))).step_s
        > estimate_step_time(inside, on(inside, topo)).step_s
    )
    # The catalogue alone knows no emulated link: a one-node estimate of either is the same.
    plain = hardware_for(CPU, devices_per_node=2)
    assert estimate_step_time(across, plain).step_s == estimate_step_time(inside, plain).step_s


def test_a_pool_without_topology_keeps_the_catalogue_link() -> None:
    j = job("ddp", 4)
    hw = hardware_for(CPU, nodes=2, devices_per_node=2)
    assert hw.topology_link(inter=True) is None
    e = estimate_step_time(j, hw)
    assert e.inter_node_dims == ["dp_replicate"]
    assert e.comm_s == pytest.approx(
        hw.comm_seconds("all_reduce", j.descriptor.comm_items(j)[0].bytes_per_call, 1, 4) * j.descriptor.comm_items(j)[0].calls
    )


def placed(order: str) -> ResolvedJob:
    doc = {
        "workload": {"model": "tiny", "steps": 4},
        "strategy": {"name": "hybrid", "world_size": 4, "options": {"tp": 2}},
        "placement": {"nodes": 2, "order": order},
    }
    return resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=16, max_steps=100))


def test_placement_across_puts_tp_on_the_link_and_keeps_dp_shard_inside() -> None:
    """fsdp 2 × tp 2 on 2 × 2: inner-first keeps tp inside a node (dp_shard crosses); `across`
    reverses the mesh over the nodes, so tp's groups cross and the planner times tp on the slow
    link — tp's predicted time grows by the link, dp_shard's shrinks to the node's own path."""
    inner, across = placed("inner-first"), placed("across")
    assert inner.crossing_dims == ["dp_shard"] and across.crossing_dims == ["tp"]
    assert [across.node_of(r) for r in range(4)] == [0, 1, 0, 1]  # tp pairs (0,1), (2,3) split over the nodes
    assert [inner.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    slow = pool(20e6, measured=20e6, latency_s=2e-4)
    a, b = estimate_step_time(inner, on(inner, slow)), estimate_step_time(across, on(across, slow))
    assert a.inter_node_dims == ["dp_shard"] and b.inter_node_dims == ["tp"]
    assert b.comm_by_dim["tp"] > 5 * a.comm_by_dim["tp"]
    assert b.comm_by_dim["dp_shard"] < a.comm_by_dim["dp_shard"] / 5
    # One node: nothing crosses, whatever the order.
    one = hardware_for(CPU, nodes=1, devices_per_node=4, topology=None)
    assert estimate_step_time(across, one).comm_by_dim == pytest.approx(estimate_step_time(inner, one).comm_by_dim)


def test_a_bad_placement_order_is_refused_naming_the_field() -> None:
    from pydantic import ValidationError

    doc = {"strategy": {"name": "hybrid", "world_size": 4, "options": {"tp": 2}}, "placement": {"nodes": 2, "order": "sideways"}}
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(doc)
    assert [e["loc"] for e in err.value.errors()] == [("placement", "order")]


def test_a_ranking_on_two_nodes_plans_each_layout_in_each_order_once() -> None:
    """Placed in both orders, fsdp × tp is planned twice (tp inside, tp across: different crossing
    dimensions and times); a one-dimensional mesh lays the same either way, so it is planned once."""
    from parallab.core.ranking import plan_cluster

    hw = hardware_for(CPU, nodes=2, devices_per_node=2, topology=pool(20e6, measured=20e6, latency_s=2e-4))
    ranking = plan_cluster(
        {"model": "tiny"},
        hw,
        world_size=4,
        strategies=["ddp", "hybrid"],
        precisions=["fp32"],
        checkpointing=["none"],
        accumulation=[1],
        nodes=2,
        placements=["inner-first", "across"],
    )
    rows = {(r.label, tuple(r.estimate["inter_node_dims"])) for r in ranking.fits if not r.options.get("sequence_parallel")}
    assert rows == {
        ("ddp dp4", ("dp_replicate",)),
        ("hybrid[tp=2, sequence_parallel=False] dp2 × tp2", ("dp_shard",)),
        ("hybrid[tp=2, sequence_parallel=False] dp2 × tp2 (across)", ("tp",)),
    }
    assert all(r.spec["placement"]["nodes"] == 2 for r in ranking.fits)


def test_host_and_mesh_ranks_are_inverse_and_across_reverses_the_mesh_over_the_hosts() -> None:
    from parallab.core.pools import host_rank, mesh_rank

    mesh = [("dp_shard", 2), ("cp", 3), ("tp", 2)]
    for order in ("inner-first", "across"):
        assert sorted(host_rank(r, mesh, order) for r in range(12)) == list(range(12))
        assert all(mesh_rank(host_rank(r, mesh, order), mesh, order) == r for r in range(12))
    assert [host_rank(r, mesh, "inner-first") for r in range(12)] == list(range(12))
    # across: tp (stride 1 on the mesh) sits 6 host ranks apart, dp_shard (stride 6) 1 apart.
    assert host_rank(1, mesh, "across") - host_rank(0, mesh, "across") == 6
    assert host_rank(6, mesh, "across") - host_rank(0, mesh, "across") == 1


def alpha_pool(alpha_s: float | None, *, floor_s: float = 7e-5) -> PoolTopology:
    """A measured 2 × 2 pool whose links carry the wire's floor and, where given, a measured α."""
    return PoolTopology(
        source="emulated",
        nodes=2,
        ranks_per_node=2,
        inter_node=LinkFigures(bandwidth_bps=1e8),
        measured_inter_node=LinkFigures(bandwidth_bps=1e8, latency_s=floor_s, alpha_s=alpha_s),
        measured_intra_node=LinkFigures(bandwidth_bps=1e10, latency_s=floor_s, alpha_s=alpha_s),
    )


@pytest.mark.parametrize(
    ("op", "n", "stride", "steps"),
    [("all_reduce", 4, 1, 6), ("all_gather", 4, 1, 3), ("reduce_scatter", 2, 2, 1), ("reduce_scatter", 2, 1, 1), ("send", 2, 2, 1)],
)
def test_each_call_pays_the_measured_alpha_once_per_step_of_its_ring(op: str, n: int, stride: int, steps: int) -> None:
    """The α–β model: a call costs α × its algorithm's steps (ring: 2(n−1) for an all-reduce, n−1
    for an all-gather or reduce-scatter, 1 for a P2P transfer) plus its bytes over β — across nodes
    and inside one alike, with α the path's measured per-step cost, not the wire's floor; 7 calls
    pay it 7 times."""
    from parallab.core.metrics import busbw_factor
    from parallab.core.plan_hardware import ring_steps

    assert ring_steps(op, n) == steps
    size, alpha = 1 << 16, 0.01
    hw = hardware_for(CPU, nodes=2, devices_per_node=2, topology=alpha_pool(alpha))
    inter = hw.crosses_nodes(n, stride)
    beta = 1e8 / 8 / hw.link_sharers(n, stride) if inter else 1e10 / 8
    assert hw.comm_seconds(op, size, 7, n, stride) == pytest.approx(7 * (steps * alpha + busbw_factor(op, n) * size / beta))
    # Unmeasured α: the floor stands in, and the difference is α's alone, per call and step.
    floor = hardware_for(CPU, nodes=2, devices_per_node=2, topology=alpha_pool(None))
    assert hw.comm_seconds(op, size, 7, n, stride) - floor.comm_seconds(op, size, 7, n, stride) == pytest.approx(7 * steps * (alpha - 7e-5))


def test_a_dimensions_alpha_follows_its_collective_count_not_its_bytes() -> None:
    """fsdp 2 × tp 2 on 2 × 2 (dp_shard across, tp inside, no calibrated curve): raising both paths'
    α by Δ raises each dimension's predicted time by Δ × Σ calls × ring steps of its collectives —
    tp's 18 all-reduces (2 steps each) and one all-gather, dp_shard's 10 all-gathers and 5
    reduce-scatters (1 step each) — whatever their bytes."""
    from parallab.core.plan_hardware import ring_steps

    j = placed("inner-first")
    low = estimate_step_time(j, on(j, alpha_pool(1e-3)))
    high = estimate_step_time(j, on(j, alpha_pool(11e-3)))
    steps = {"tp": 0.0, "dp_shard": 0.0}
    for item in j.descriptor.comm_items(j):
        steps["tp" if item.stride == 1 else "dp_shard"] += item.calls * ring_steps(item.op, item.group_size)
    assert steps == {"tp": 37.0, "dp_shard": 15.0}
    for dim, count in steps.items():
        assert high.comm_by_dim[dim] - low.comm_by_dim[dim] == pytest.approx(count * 10e-3)
    assert high.step_s - low.step_s == pytest.approx(52 * 10e-3)
    assert high.compute_s == low.compute_s


def test_the_probe_records_alpha_beside_the_wire_latency() -> None:
    from workers.linkprobe import link_figures

    said = link_figures({"bandwidth_bps": 9.7e7, "latency_s": 7e-5, "alpha_s": 1.19e-2})
    assert (said.latency_s, said.alpha_s, said.step_s) == (7e-5, 1.19e-2, 1.19e-2)
    # A topology stored before α was measured reads back with the floor as its per-step cost.
    old = LinkFigures.model_validate({"bandwidth_bps": 1e9, "latency_s": 2e-4})
    assert old.alpha_s is None and old.step_s == 2e-4
