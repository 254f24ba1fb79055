"""An emulated cluster for tests: `emulated_cluster(...)`, and the check that it left nothing behind.

    with emulated_cluster(nodes=2, ranks_per_node=2, rate="200mbit") as cluster:
        a, b = cluster.nodes                     # namespaces plb<tag>n0, plb<tag>n1 at 10.200.0.1, .2
        subprocess.run([*cluster.exec_args(a), "python", ...])   # runs inside node a
        env = cluster.worker_env(a)              # a `parallab worker` standing for node a

On the way out — a passing body, a failing one, Ctrl-C — the namespaces, links and whatever ran in
them are removed, and the helper fails the test if any emulation name is still on the machine.
Needs root (as on this machine and in CI).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from workers.netns import ClusterSpec, EmulatedCluster, LinkShape, our_leftovers, parse_rate, sweep


def assert_nothing_left() -> None:
    left = our_leftovers()
    if any(left.values()):
        sweep(left)
        raise AssertionError(f"the emulation left {left} behind (now swept)")


@contextmanager
def emulated_cluster(*, nodes: int = 2, ranks_per_node: int = 2, rate: str = "1gbit", loss_pct: float = 0.0) -> Iterator[EmulatedCluster]:
    """`nodes` namespaces of `ranks_per_node` ranks each, links shaped to `rate` (dropping `loss_pct` %
    of the packets that arrive over them); removed on exit."""
    cluster = EmulatedCluster(ClusterSpec(nodes, ranks_per_node, LinkShape(parse_rate(rate), loss_pct=loss_pct)))
    try:
        yield cluster.up()
    finally:
        cluster.down()
        assert_nothing_left()
