"""A pool's topology in its settings: written and read back whole, merged into what the pool
already holds, and refused on a Slurm pool (whose settings are its sbatch's)."""

from __future__ import annotations

import pytest

from backend.db import session_scope
from backend.services import pools
from parallab.core.pools import LinkFigures, PoolTopology, SlurmPool

TOPOLOGY = PoolTopology(
    source="emulated",
    nodes=2,
    ranks_per_node=2,
    inter_node=LinkFigures(bandwidth_bps=1e9),
    measured_inter_node=LinkFigures(bandwidth_bps=9.7e8, latency_s=3e-4),
)


def test_the_topology_is_recorded_read_back_and_replaced(db_url: str) -> None:
    with session_scope(db_url) as session:
        assert pools.pool_topology(session=session, name="emu") is None
        pools.record_topology(session=session, name="emu", topology=TOPOLOGY)
    with session_scope(db_url) as session:
        assert pools.pool_topology(session=session, name="emu") == TOPOLOGY
        assert pools.uses_queue(session=session, pool="emu"), "an emulated pool is still a Celery pool"
        slower = TOPOLOGY.model_copy(update={"inter_node": LinkFigures(bandwidth_bps=2e7)})
        pools.record_topology(session=session, name="emu", topology=slower)
    with session_scope(db_url) as session:
        assert pools.pool_topology(session=session, name="emu") == slower


def test_a_slurm_pool_keeps_its_settings(db_url: str) -> None:
    slurm = SlurmPool(python="/opt/venv/bin/python", run_root="/shared/runs")
    with session_scope(db_url) as session:
        pools.declare_pool(session=session, name="cluster", settings=slurm)
    with pytest.raises(ValueError, match="pool 'cluster' is a slurm pool"), session_scope(db_url) as session:
        pools.record_topology(session=session, name="cluster", topology=TOPOLOGY)
    with session_scope(db_url) as session:
        assert pools.scheduled_pool(session=session, name="cluster") == slurm


def test_a_pool_with_a_topology_plans_on_its_nodes_and_link(db_url: str, tmp_path) -> None:
    """The plan of a pool reads its recorded topology: 2 nodes × 2 ranks, the link as measured;
    a pool without one plans on one node, as before."""
    from backend.config import Settings
    from backend.services.hardware import pool_hardware

    settings = Settings(home=tmp_path, database_url=db_url)
    with session_scope(db_url) as session:
        plain = pool_hardware(session=session, settings=settings, pool="emu")
        pools.record_topology(session=session, name="emu", topology=TOPOLOGY)
    with session_scope(db_url) as session:
        hw = pool_hardware(session=session, settings=settings, pool="emu")
    assert plain.topology is None and plain.nodes == 1
    assert (hw.nodes, hw.per_node, hw.topology) == (2, 2, TOPOLOGY)
    assert hw.topology_link(inter=True) == (9.7e8 / 8, 3e-4)
    assert hw.crosses_nodes(4, 1) and not hw.crosses_nodes(2, 1)
