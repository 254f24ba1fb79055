"""A cluster in a box: nodes as Linux network namespaces joined by shaped links.

Every rank of this machine talks over loopback at memory speed, so a layout that would crawl
across a real inter-node link looks fine here. A network namespace is a host of its own as far as
the network goes — its own interfaces and addresses — so gloo's traffic between two of them
crosses a real link that `tc` can shape. `EmulatedCluster` makes N of them:

- node i is the namespace `plb<tag>n<i>` with one veth whose inner end is `eth0` at 10.200.0.(i+1);
  the outer ends hang on a bridge `plb<tag>br` in this namespace (no address on it: nothing of this
  namespace is reachable from the nodes, nor the other way round);
- each node's `eth0` egress is shaped — `tbf` for the rate, `netem` above it for latency and
  jitter — so a byte from node a to node b crosses exactly one shaped queue (a's), and a round
  trip pays the latency twice;
- packet loss is an nftables rule on each node's `eth0` ingress (`numgen random` drops that share
  of the packets arriving over the link): a packet that crossed the link is lost on arrival, and
  the sender learns of it only as TCP does, by its retransmission timer — netem's loss without
  netem, on kernels built without `sch_netem`;
- the ranks of one node share its namespace: between them, traffic stays on that namespace's
  loopback path, unshaped (the "NVLink" of the box).

One cluster at a time per machine (a lock file holding the owner's pid and tag): a second says so.
On exit, on an exception and on Ctrl-C everything made is removed (processes left in the
namespaces first); a cluster whose owner was SIGKILLed is swept by the next one, since its lock is
free and its names are ours. Needs root and iproute2; `netem` only for latency or jitter; nftables
(the `nft` tool and the kernel's nf_tables with `numgen`) only for loss.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

RANKS_PER_CORE = 4
"""The most ranks an emulated cluster may run per core of this machine: beyond it a step measures
the scheduler, not the link."""
LOCK_PATH = Path(os.environ.get("PARALLAB_EMULATE_LOCK", "/run/parallab-emulate.lock"))
SUBNET = "10.200.0"
INNER_IF = "eth0"
_NAME = re.compile(r"^plb[0-9a-f]{4}(n\d+|br|h\d+)$")
_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class Refused(RuntimeError):
    """The machine cannot emulate (not root, no iproute2, no netem), or one emulation is already up."""


class BadShape(ValueError):
    """An impossible cluster: the message names the flag and the problem."""


def parse_rate(text: str, *, flag: str = "--inter-node") -> float:
    """'1gbit', '200mbit', '125mbps' (bytes) → bits per second; refused naming `flag` unless > 0."""
    match = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if match is not None and float(match.group(1)) <= 0:
        raise BadShape(f"{flag}: the bandwidth must be above 0 (got {text!r})")
    if match is None or match.group(2) not in _UNITS:
        raise BadShape(f"{flag}: {text!r} is not a rate (a number and one of {', '.join(_UNITS)}: '1gbit', '200mbit')")
    bits = float(match.group(1)) * _UNITS[match.group(2)]
    if bits <= 0:
        raise BadShape(f"{flag}: the bandwidth must be above 0 (got {text!r})")
    return bits


def parse_time(text: str, *, flag: str) -> float:
    """'200us', '1ms', '0' → seconds; refused naming `flag` when negative or malformed."""
    match = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*(s|ms|us)?\s*", text.lower())
    if match is None:
        raise BadShape(f"{flag}: {text!r} is not a time (a number and s, ms or us: '200us')")
    seconds = float(match.group(1)) * _TIMES[match.group(2) or "s"]
    if seconds < 0:
        raise BadShape(f"{flag}: must not be negative (got {text!r})")
    return seconds


BURST_S = 0.001
"""tbf's bucket: a millisecond of the rate, or `MIN_BURST_BYTES` where that is more. The bucket
refills while the link idles and what it holds crosses at memory speed, so every collective after
a compute gap had its first bucketful free: 256 KiB at 3 mbit (the old floor) was 0.7 s of the
link, 10 ms of the rate at 1 gbit (the old rule) let a 400 KB all-gather cross in 1 ms instead of
3.2 — the link's cost depended on the compute around it. At a millisecond the bucket is a few
frames' worth and a sustained 8 MB still crosses 1 gbit at 93–95 % of the rate (measured here;
tbf sleeps on a high-resolution timer, and cuts a GSO super-packet larger than the bucket into
segments itself)."""
MIN_BURST_BYTES = 16 * 1024
"""The bucket's floor: ten MTU-sized frames."""


QUEUE_LIMIT_BYTES = 64 << 20
"""tbf's queue: deeper than what the node's TCP connections can have in flight (4 MiB of send
buffer each, a few connections a rank), so the shaper delays and never drops. A queue bounded by
200 ms of the rate (75 KB at 3 mbit) dropped a third of a collective's packets at low rates, and
TCP's retransmission timer (200 ms and up) turned each drop into a stall: the link's time varied
by a second a step. Loss is the `--loss` rule's, on purpose, not the shaper's by accident."""


@dataclass(frozen=True)
class LinkShape:
    """One node's link to the others: rate in bit/s, one-way latency and jitter in s, loss in %."""

    rate_bps: float
    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss_pct: float = 0.0

    @property
    def needs_netem(self) -> bool:
        return self.latency_s > 0 or self.jitter_s > 0

    def problems(self) -> list[str]:
        said = []
        if not self.rate_bps > 0:
            said.append(f"--inter-node: the bandwidth must be above 0 (got {self.rate_bps:g} bit/s)")
        if self.latency_s < 0:
            said.append("--latency: must not be negative")
        if self.jitter_s < 0:
            said.append("--jitter: must not be negative")
        if self.jitter_s > 0 and self.latency_s == 0:
            said.append("--jitter: needs a --latency to vary around")
        if not 0 <= self.loss_pct < 100:
            said.append(f"--loss: a percentage in [0, 100) (got {self.loss_pct:g})")
        return said

    def tc_commands(self, dev: str) -> list[list[str]]:
        """The qdiscs of one node's egress: netem (delay, jitter) at the root when asked, tbf for the rate."""
        burst = max(MIN_BURST_BYTES, int(self.rate_bps / 8 * BURST_S))
        tbf = ["tbf", "rate", f"{int(self.rate_bps)}bit", "burst", str(burst), "limit", str(QUEUE_LIMIT_BYTES)]
        if not self.needs_netem:
            return [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf]]
        netem = ["netem", "delay", f"{self.latency_s * 1e6:.0f}us"]
        if self.jitter_s > 0:
            netem += [f"{self.jitter_s * 1e6:.0f}us"]
        return [
            ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *netem, "limit", "100000"],
            ["tc", "qdisc", "add", "dev", dev, "parent", "1:", "handle", "2:", *tbf],
        ]


LOSS_SCALE = 100_000
"""`numgen random mod LOSS_SCALE`: loss settable to 0.001 %."""


def loss_ruleset(dev: str, loss_pct: float) -> str:
    """The nftables table that drops `loss_pct` % of the packets arriving on `dev` (its ingress: after
    the link, before the stack), counting them; empty (no table) for none."""
    drop = round(loss_pct / 100 * LOSS_SCALE)
    if drop <= 0:
        return ""
    return (
        "table netdev plbloss {\n"
        "  chain ingress {\n"
        f'    type filter hook ingress device "{dev}" priority 0; policy accept;\n'
        f"    numgen random mod {LOSS_SCALE} < {drop} counter drop\n"
        "  }\n"
        "}\n"
    )


@dataclass(frozen=True)
class ClusterSpec:
    """N emulated nodes of G ranks each, joined by links of one shape."""

    nodes: int
    ranks_per_node: int
    link: LinkShape

    def problems(self, cores: int | None = None) -> list[str]:
        said = []
        if self.nodes < 2:
            said.append(f"--nodes: an emulated cluster has at least 2 nodes (got {self.nodes})")
        if self.nodes > 250:
            said.append(f"--nodes: at most 250 nodes on one /24 (got {self.nodes})")
        if self.ranks_per_node < 1:
            said.append(f"--ranks-per-node: at least 1 (got {self.ranks_per_node})")
        cores = cores or os.cpu_count() or 1
        if self.nodes * self.ranks_per_node > cores * RANKS_PER_CORE:
            said.append(
                f"--ranks-per-node: {self.nodes} nodes × {self.ranks_per_node} ranks is more than "
                f"{RANKS_PER_CORE} ranks per core on this machine's {cores} cores"
            )
        return said + self.link.problems()


@dataclass(frozen=True)
class Node:
    index: int
    netns: str
    address: str

    @property
    def host(self) -> str:
        """The host name its worker registers (what a run's hardware block lists)."""
        return f"node{self.index}"


def _run(cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip() or 'exit ' + str(out.returncode)}")
    return out


def _nft(netns: str, ruleset: str) -> subprocess.CompletedProcess[str]:
    """Load an nftables ruleset into `netns`."""
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=ruleset, capture_output=True, text=True, timeout=30, check=False
    )


def preflight(link: LinkShape) -> None:
    """Refuse, saying why, where this machine cannot make namespaces or shape links as asked."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise Refused("parallab lab emulate needs root (network namespaces and tc): run it as root, or in a container with CAP_NET_ADMIN")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise Refused(f"parallab lab emulate needs iproute2 ('{tool}' is not on PATH): install the iproute2 package")
    probe = f"plbprobe{os.getpid() % 100000}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        raise Refused(f"this machine does not allow network namespaces: {made.stderr.strip()}")
    try:
        _run(["ip", "-n", probe, "link", "set", "lo", "up"])
        kinds = [["tbf", "rate", "1mbit", "burst", "64k", "latency", "50ms"]] + ([["netem", "delay", "1ms"]] if link.needs_netem else [])
        for kind in kinds:
            said = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "replace", "dev", "lo", "root", *kind], check=False)
            if said.returncode != 0:
                flags = "--latency and --jitter need" if kind[0] == "netem" else "the link's rate needs"
                raise Refused(f"{flags} the kernel's '{kind[0]}' qdisc, which this kernel lacks ({said.stderr.strip()})")
        if link.loss_pct > 0:
            if shutil.which("nft") is None:
                raise Refused("--loss needs nftables ('nft' is not on PATH): install the nftables package")
            said = _nft(probe, loss_ruleset("lo", link.loss_pct))
            if said.returncode != 0:
                raise Refused(
                    f"--loss needs the kernel's nf_tables with netdev ingress and numgen, which this kernel refused ({said.stderr.strip()})"
                )
    finally:
        _run(["ip", "netns", "del", probe], check=False)


def our_leftovers() -> dict[str, list[str]]:
    """Namespaces and links named like an emulation's (`plb<tag>…`) on this machine."""
    spaces = [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines() if line.strip()]
    links = [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", _run(["ip", "-o", "link", "show"], check=False).stdout, re.M)]
    return {"netns": [n for n in spaces if _NAME.match(n)], "links": [n for n in links if _NAME.match(n)]}


def _kill_inside(netns: str) -> None:
    """SIGKILL every process left in `netns` (workers' ranks, probes) and wait for them to go."""
    for _ in range(50):
        pids = [int(p) for p in _run(["ip", "netns", "pids", netns], check=False).stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def sweep(names: dict[str, list[str]] | None = None) -> None:
    """Remove the given (default: all) emulation namespaces and links, killing what runs inside."""
    names = names if names is not None else our_leftovers()
    for netns in names.get("netns", []):
        _kill_inside(netns)
        _run(["ip", "netns", "del", netns], check=False)
    for link in names.get("links", []):
        _run(["ip", "link", "del", link], check=False)


@dataclass
class EmulatedCluster:
    """`with EmulatedCluster(spec) as cluster:` — the nodes exist inside, and nothing after.

    `cluster.nodes[i].netns` is where node i's ranks run (`cluster.exec_args(node)` prefixes a
    command), `cluster.worker_env(node)` the environment of that node's `parallab worker`."""

    spec: ClusterSpec
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:4])
    nodes: list[Node] = field(default_factory=list)
    _lock: IO[str] | None = None

    @property
    def bridge(self) -> str:
        return f"plb{self.tag}br"

    def _acquire(self) -> None:
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        lock = LOCK_PATH.open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            held = lock.read().strip() or "{}"
            lock.close()
            owner = json.loads(held) if held.startswith("{") else {}
            raise Refused(
                f"an emulated cluster is already up (pid {owner.get('pid', '?')}, tag {owner.get('tag', '?')}): "
                "stop it (Ctrl-C) before starting another"
            ) from None
        sweep()  # the lock was free: whatever carries our names is a crashed owner's
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps({"pid": os.getpid(), "tag": self.tag}))
        lock.flush()
        self._lock = lock

    def up(self) -> EmulatedCluster:
        said = self.spec.problems()
        if said:
            raise BadShape("; ".join(said))
        preflight(self.spec.link)
        self._acquire()
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "link", "set", self.bridge, "up"])
            for i in range(self.spec.nodes):
                self.nodes.append(self._make_node(i))
        except BaseException:
            self.down()
            raise
        return self

    def _make_node(self, i: int) -> Node:
        node = Node(i, f"plb{self.tag}n{i}", f"{SUBNET}.{i + 1}")
        outer, inner = f"plb{self.tag}h{i}", f"plb{self.tag}i{i}"
        _run(["ip", "netns", "add", node.netns])
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", inner, "netns", node.netns])
        _run(["ip", "link", "set", outer, "master", self.bridge, "up"])
        inside = ["ip", "-n", node.netns]
        _run([*inside, "link", "set", inner, "name", INNER_IF])
        _run([*inside, "addr", "add", f"{node.address}/24", "dev", INNER_IF])
        _run([*inside, "link", "set", INNER_IF, "up"])
        _run([*inside, "link", "set", "lo", "up"])
        for cmd in self.spec.link.tc_commands(INNER_IF):
            _run(["ip", "netns", "exec", node.netns, *cmd])
        if self.spec.link.loss_pct > 0:
            self.set_loss(node, self.spec.link.loss_pct)
        return node

    def _wire_sized(self, node: Node) -> None:
        """One segment per wire packet on node `node`'s link (no 64 KiB GSO super-packets), so a loss
        rate counts the packets a real link would carry; both ends of the veth."""
        for cmd in (["ip", "-n", node.netns, "link", "set", INNER_IF], ["ip", "link", "set", f"plb{self.tag}h{node.index}"]):
            _run([*cmd, "gso_max_segs", "1"], check=False)

    def set_loss(self, node: Node, loss_pct: float) -> None:
        """Drop `loss_pct` % of what arrives at node `node` over its link from now on (0: none)."""
        if not 0 <= loss_pct < 100:
            raise BadShape(f"--loss: a percentage in [0, 100) (got {loss_pct:g})")
        _nft(node.netns, "table netdev plbloss\ndelete table netdev plbloss\n")  # declare, then delete: idempotent
        ruleset = loss_ruleset(INNER_IF, loss_pct)
        if ruleset:
            self._wire_sized(node)
            said = _nft(node.netns, ruleset)
            if said.returncode != 0:
                raise RuntimeError(f"nft in {node.netns}: {said.stderr.strip()}")

    def dropped(self, node: Node) -> int:
        """Packets the loss rule has dropped on node `node`'s link (0 without one)."""
        said = _run(["ip", "netns", "exec", node.netns, "nft", "list", "table", "netdev", "plbloss"], check=False)
        match = re.search(r"counter packets (\d+)", said.stdout)
        return int(match.group(1)) if match else 0

    def set_link(self, node: Node, *, up: bool) -> None:
        """Cut node `node` off the others (a partition) or join it again."""
        _run(["ip", "link", "set", f"plb{self.tag}h{node.index}", "up" if up else "down"])

    def exec_args(self, node: Node) -> list[str]:
        return ["ip", "netns", "exec", node.netns]

    def worker_env(self, node: Node) -> dict[str, str]:
        """What node `node`'s worker needs on top of its settings: its host, address, namespace, ranks;
        gloo and TensorPipe bind the node's own interface (the namespace's only route out)."""
        return {
            "PARALLAB_WORKER_HOST": node.host,
            "PARALLAB_WORKER_ADDRESS": node.address,
            "PARALLAB_WORKER_NETNS": node.netns,
            "PARALLAB_WORKER_DEVICES": str(self.spec.ranks_per_node),
            "GLOO_SOCKET_IFNAME": INNER_IF,
            "TP_SOCKET_IFNAME": INNER_IF,
        }

    def down(self) -> None:
        """Remove every namespace and link this cluster made (and what runs in them); release the lock."""
        mine = {
            "netns": [n.netns for n in self.nodes] or [f"plb{self.tag}n{i}" for i in range(self.spec.nodes)],
            "links": [self.bridge] + [f"plb{self.tag}h{i}" for i in range(self.spec.nodes)],
        }
        present = our_leftovers()
        sweep({kind: [n for n in names if n in present[kind]] for kind, names in mine.items()})
        self.nodes = []
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> EmulatedCluster:
        return self.up()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.down()


def link_bytes(node: Node) -> dict[str, int]:
    """Bytes node `node` has sent and received on its link (its `eth0` counters): what crossed nodes."""
    read = _run(["ip", "netns", "exec", node.netns, "cat", *(f"/sys/class/net/{INNER_IF}/statistics/{k}_bytes" for k in ("tx", "rx"))])
    tx, rx = (int(v) for v in read.stdout.split())
    return {"tx": tx, "rx": rx}
