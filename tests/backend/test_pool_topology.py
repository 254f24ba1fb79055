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
        pools.declare_slurm_pool(session=session, name="cluster", settings=slurm)
    with pytest.raises(ValueError, match="pool 'cluster' is a slurm pool"), session_scope(db_url) as session:
        pools.record_topology(session=session, name="cluster", topology=TOPOLOGY)
    with session_scope(db_url) as session:
        assert pools.slurm_pool(session=session, name="cluster") == slurm
