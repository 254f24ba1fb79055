"""`parallab lab emulate`'s input: rates, times and shapes it refuses, naming the flag; the tc
commands a link shape becomes; which mesh dimensions cross nodes under torchtitan's placement."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from parallab.cli import app
from parallab.core.pools import crossing_dims
from workers.netns import LOSS_SCALE, RANKS_PER_CORE, BadShape, ClusterSpec, LinkShape, loss_ruleset, parse_rate, parse_time


def test_rates_and_times_parse_in_tc_units() -> None:
    assert parse_rate("1gbit") == 1e9 and parse_rate("200mbit") == 2e8 and parse_rate("125mbps") == 1e9
    assert parse_time("200us", flag="--latency") == pytest.approx(2e-4) and parse_time("0", flag="--latency") == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--inter-node", "0mbit"], "--inter-node: the bandwidth must be above 0"),
        (["--inter-node", "0"], "--inter-node: the bandwidth must be above 0"),
        (["--inter-node", "-5mbit"], "--inter-node: the bandwidth must be above 0"),
        (["--inter-node", "100"], "--inter-node: '100' is not a rate"),
        (["--jitter", "-1us"], "--jitter: must not be negative"),
        (["--loss", "-1"], "--loss: a percentage in [0, 100)"),
        (["--inter-node", "fast"], "--inter-node: 'fast' is not a rate"),
        (["--latency", "-1ms"], "--latency: must not be negative"),
        (["--nodes", "1"], "--nodes: an emulated cluster has at least 2 nodes"),
        (["--nodes", "2", "--ranks-per-node", "999"], f"more than {RANKS_PER_CORE} ranks per core"),
        (["--loss", "100"], "--loss: a percentage in [0, 100)"),
    ],
)
def test_an_impossible_cluster_is_refused_naming_the_flag(args: list[str], said: str) -> None:
    out = CliRunner().invoke(app, ["lab", "emulate", *args])
    assert out.exit_code == 2
    assert said in out.output.replace("\n", " "), out.output


def test_the_core_bound_counts_ranks_of_all_nodes() -> None:
    link = LinkShape(1e9)
    assert ClusterSpec(2, RANKS_PER_CORE, link).problems(cores=2) == []
    assert "--ranks-per-node" in ClusterSpec(2, RANKS_PER_CORE + 1, link).problems(cores=2)[0]
    with pytest.raises(BadShape, match="--jitter"):
        parse_time("-5us", flag="--jitter")


def test_a_rate_alone_is_one_tbf_and_latency_puts_netem_above_it() -> None:
    (only,) = LinkShape(2e8).tc_commands("eth0")
    assert only[only.index("root") + 3 :][:3] == ["tbf", "rate", "200000000bit"]
    netem, tbf = LinkShape(1e9, latency_s=2e-4, jitter_s=5e-5).tc_commands("eth0")
    assert netem[netem.index("netem") :][:4] == ["netem", "delay", "200us", "50us"]
    assert tbf[tbf.index("parent") + 1] == "1:" and "tbf" in tbf


def test_loss_is_an_nftables_drop_on_the_links_ingress_not_netem() -> None:
    lossy = LinkShape(1e9, loss_pct=2.5)
    assert not lossy.needs_netem and len(lossy.tc_commands("eth0")) == 1
    rules = loss_ruleset("eth0", 2.5)
    assert 'hook ingress device "eth0"' in rules
    assert f"numgen random mod {LOSS_SCALE} < {LOSS_SCALE * 25 // 1000} counter drop" in rules
    assert loss_ruleset("eth0", 0) == ""


@pytest.mark.parametrize(
    ("mesh", "per_node", "crossing"),
    [
        ([("dp_shard", 2), ("tp", 2)], 2, ["dp_shard"]),  # tp innermost stays inside the node
        ([("tp", 2), ("dp_shard", 2)], 2, ["tp"]),  # tp outermost crosses
        ([("dp_replicate", 4)], 2, ["dp_replicate"]),
        ([("dp_replicate", 2), ("tp", 2)], 4, []),  # one node holds the whole mesh
        ([("pp", 2), ("dp_shard", 1), ("tp", 4)], 4, ["pp"]),
    ],
)
def test_the_dimensions_whose_groups_span_nodes(mesh: list[tuple[str, int]], per_node: int, crossing: list[str]) -> None:
    assert crossing_dims(mesh, per_node) == crossing


def test_a_runs_estimate_across_nodes_is_made_on_its_nodes_and_the_pools_link() -> None:
    """`workers.aggregate.run_hardware`: a 2-node job's hardware is 2 × its ranks per node with the
    pool's topology, so DDP's all-reduce is timed on the link; one node's is the host alone."""
    from parallab.core.jobs import Limits, resolve_job
    from parallab.core.planner import estimate_step_time
    from parallab.core.pools import LinkFigures, PoolTopology
    from parallab.core.spec import JobSpec
    from workers.aggregate import run_hardware

    def ddp(nodes: int):
        doc = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 4}, "placement": {"nodes": nodes}}
        return resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=16, max_steps=10))

    reported = {"device": "cpu", "device_name": "some cpu", "device_count": 4}
    topo = PoolTopology(source="emulated", nodes=2, ranks_per_node=2, inter_node=LinkFigures(bandwidth_bps=2e7))
    across = run_hardware(reported, None, job=ddp(2), topology=topo)
    alone = run_hardware(reported, None, job=ddp(1))
    assert across is not None and alone is not None
    assert (across.nodes, across.per_node, across.topology) == (2, 2, topo)
    assert (alone.nodes, alone.per_node) == (1, 4)
    slow, fast = estimate_step_time(ddp(2), across), estimate_step_time(ddp(1), alone)
    assert slow.inter_node_dims == ["dp_replicate"] and fast.inter_node_dims == []
    assert slow.comm_s > 20 * fast.comm_s  # a 20 Mbit/s link against the host's memory path
