"""The hardware a plan runs on: a catalogue device, optionally a pool's calibration and topology,
and the cluster's shape — and the rates the planner reads off it: a GEMM's FLOP/s, the memory
bandwidth, a collective's seconds (calibrated busbw curves inside a node, the α–β ring on a pool
that knows its wiring, else the catalogue's links), the host's per-op overheads and the memory a
rank may plan to use. The step-time model that reads these rates is `parallab.core.planner`."""

from __future__ import annotations

from dataclasses import dataclass

from parallab.core.costs import activation_dtype_bytes
from parallab.core.device_profile import DeviceProfile, load_profile
from parallab.core.hardware import DeviceDescription, DeviceSpec, HardwareProfile
from parallab.core.metrics import busbw_factor
from parallab.core.pools import PoolTopology

MATMUL_EFFICIENCY = 0.7
"""Share of the datasheet's dense peak a large GEMM reaches (uncalibrated devices)."""
MEMORY_EFFICIENCY = 0.8
"""Share of the datasheet's memory bandwidth a streaming kernel reaches (uncalibrated)."""
LINK_EFFICIENCY = 0.8
"""Share of the datasheet's link bandwidth a large collective's busbw reaches (uncalibrated)."""
LATENCY_S = {"intra": 10e-6, "inter": 20e-6}
"""Per-call latency of a collective without a calibrated curve (within a node, across nodes)."""
USABLE_MEMORY = 0.9
"""Share of a device's memory a job may plan to use (allocator fragmentation, the context)."""
P2P_OPS = {"send": "send_recv", "recv": "send_recv"}
"""The calibrated curve a descriptor's op is timed on."""
RING_STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0, "broadcast": 1.0}
"""Latency terms of a ring collective over n ranks, in units of (n − 1): all-reduce is a
reduce-scatter then an all-gather, 2(n − 1) steps each paying the link's latency once; a P2P
transfer (send, recv) pays it once."""


def ring_steps(op: str, group_size: int) -> float:
    """Steps of `op`'s ring algorithm on `group_size` ranks, each paying the path's α once:
    2(n − 1) for an all-reduce, n − 1 for an all-gather or reduce-scatter, 1 for a P2P transfer."""
    return RING_STEPS.get(op, 0.0) * (group_size - 1) or 1.0


@dataclass(frozen=True)
class Hardware:
    """What a plan runs on: a catalogue entry, optionally a pool's calibrated profile, and the cluster's shape."""

    spec: DeviceSpec
    profile: HardwareProfile | None = None
    nodes: int = 1
    devices_per_node: int | None = None
    topology: PoolTopology | None = None
    """The pool's wiring (`parallab.core.pools.PoolTopology`): where given, a collective whose group
    spans nodes is timed on its inter-node link — measured, else declared — and one inside a node
    on its measured intra-node path unless the pool's calibration has a curve for it."""

    @property
    def per_node(self) -> int:
        return self.devices_per_node or self.spec.devices_per_node

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node

    @property
    def calibrated(self) -> bool:
        return self.profile is not None

    @property
    def device(self) -> DeviceDescription:
        return self.profile.device if self.profile is not None else self.spec.description()

    @property
    def label(self) -> str:
        if self.profile is not None:
            source = f"calibrated on {self.profile.world_size} rank(s)"
        else:
            source = "device profile" if self.device_profile is not None else "datasheet"
        return f"{self.nodes} × {self.per_node} {self.spec.name} ({source})"

    @property
    def device_profile(self) -> DeviceProfile | None:
        """The packaged profile of the device kind (`parallab.core.device_profile`), on an uncalibrated GPU."""
        if self.profile is not None or self.spec.kind == "cpu":
            return None
        return load_profile(self.spec.key)

    def peak_flops(self, precision: str) -> float:
        return self.spec.flops.get(precision) or self.spec.flops.get("bf16") or self.spec.flops["fp32"]

    def matmul_flops(self, precision: str, m: int, n: int, k: int) -> float:
        """FLOP/s of an (m, n, k) GEMM: measured when calibrated in this precision, else the device
        profile's share of the peak on the roofline, else the datasheet × `MATMUL_EFFICIENCY`."""
        device_profile = self.device_profile
        if device_profile is not None:
            flops = 2.0 * m * n * k
            moved = (m * k + k * n + m * n) * activation_dtype_bytes(precision)
            seconds = max(flops / (self.peak_flops(precision) * device_profile.gemm_share(precision)), moved / self.spec.memory_bandwidth)
            return flops / seconds
        if self.profile is not None:
            measured = self.profile.matmul_flops(precision, m, n, k) or (
                self.profile.matmul_flops("bf16", m, n, k) if precision == "fp8" else None
            )
            if measured:
                return measured
        peak = self.spec.flops.get(precision) or self.spec.flops.get("bf16") or self.spec.flops["fp32"]
        return peak * MATMUL_EFFICIENCY

    @property
    def memory_bandwidth(self) -> float:
        if self.profile is not None and self.profile.memory_bandwidth:
            return self.profile.memory_bandwidth
        device_profile = self.device_profile
        share = device_profile.memory_bound.bandwidth_share if device_profile is not None else MEMORY_EFFICIENCY
        return self.spec.memory_bandwidth * share

    @property
    def op_overhead_s(self) -> float:
        if self.profile is not None and self.profile.op_overhead_s is not None:
            return self.profile.op_overhead_s
        return self.spec.op_overhead_s

    @property
    def dtensor_op_overhead_s(self) -> float:
        """Calibrated only (GPUs hide host time behind their kernels; uncalibrated CPUs get none)."""
        return (self.profile.dtensor_op_overhead_s or 0.0) if self.profile is not None else 0.0

    @property
    def selective_op_overhead_s(self) -> float:
        """Calibrated only, as `dtensor_op_overhead_s`."""
        return (self.profile.selective_op_overhead_s or 0.0) if self.profile is not None else 0.0

    def fsdp_group_overhead_s(self, reshard_after_forward: bool) -> float:
        """FSDP2's own seconds per group and micro-step (`HardwareProfile.fsdp_overhead`): calibrated
        only, 0 where the calibration did not measure it (GPUs hide FSDP2's host work behind their
        kernels: the device profiles carry none)."""
        return self.profile.fsdp_group_overhead_s(reshard_after_forward) if self.profile is not None else 0.0

    @property
    def ranks_per_core(self) -> float:
        """CPU ranks time-share the host's cores: how many ranks each core serves (1 on GPUs, or unknown cores)."""
        cores = self.device.cores
        if self.device.kind != "cpu" or not cores:
            return 1.0
        return max(1.0, self.per_node / cores)

    def crosses_nodes(self, group_size: int, stride: int) -> bool:
        return self.nodes > 1 and group_size * stride > self.per_node

    def link_sharers(self, group_size: int, stride: int) -> int:
        """Groups of one dimension whose traffic leaves a node over its one link at once: a node holds
        `per_node` ranks, `members` of each crossing group, so per_node / members groups each run a
        ring through it (2 × 2 with dp_shard across and tp inside: the two dp_shard groups share it)."""
        members = min(group_size, max(1, self.per_node // max(stride, 1)))
        return max(1, self.per_node // members)

    def topology_link(self, inter: bool) -> tuple[float, float] | None:
        """(β: bytes/s, α: seconds a step) of the path the pool's topology gives, or None where it
        gives none: across nodes the measured link (the declared rate × `LINK_EFFICIENCY` and the
        declared latency unmeasured), inside a node only a measured path (the declared default is
        the host's unshaped memory). α is the path's measured per-step cost
        (`LinkFigures.step_s`), not the wire's floor: on ranks that share cores a step waits
        for its peer to be scheduled, and that wait, not the wire, is most of a small collective."""
        topo = self.topology
        if topo is None:
            return None
        if inter:
            if topo.measured_inter_node is not None:
                return topo.measured_inter_node.bandwidth_bps / 8, topo.measured_inter_node.step_s
            return topo.inter_node.bandwidth_bps / 8 * LINK_EFFICIENCY, topo.inter_node.step_s
        said = topo.measured_intra_node or topo.intra_node
        return (said.bandwidth_bps / 8, said.step_s) if said is not None else None

    def comm_seconds(self, op: str, bytes_per_call: int, calls: int, group_size: int, stride: int = 1) -> float:
        """Time of `calls` calls of `op` on a group of `group_size` ranks `stride` apart."""
        if calls <= 0 or bytes_per_call <= 0 or group_size <= 1:
            return 0.0
        factor = busbw_factor(op, group_size)
        inter = self.crosses_nodes(group_size, stride)
        if self.profile is not None and not inter:
            busbw = self.profile.busbw(P2P_OPS.get(op, op), bytes_per_call)
            if busbw:
                return calls * bytes_per_call * factor / busbw
        said = self.topology_link(inter)
        if said is not None:
            # The α–β model of the ring: α per step of the algorithm, (bytes × bus factor) over β's share.
            beta, alpha = said
            share = beta / (self.link_sharers(group_size, stride) if inter else 1)
            return calls * (ring_steps(op, group_size) * alpha + bytes_per_call * factor / share)
        link = self.spec.inter_node_bandwidth if inter else self.spec.intra_node_bandwidth
        latency = LATENCY_S["inter" if inter else "intra"]
        return calls * (latency + bytes_per_call * factor / (link * LINK_EFFICIENCY))

    @property
    def memory_budget(self) -> int:
        """Bytes one rank may plan to use: the device's, or on CPU the host's split over its ranks."""
        memory = self.device.memory_bytes or self.spec.memory_bytes
        if self.device.kind == "cpu":
            memory //= max(self.per_node, 1)
        return int(memory * USABLE_MEMORY)


def hardware_for(
    catalogue_spec: DeviceSpec,
    *,
    profile: HardwareProfile | None = None,
    nodes: int = 1,
    devices_per_node: int | None = None,
    topology: PoolTopology | None = None,
) -> Hardware:
    """A `Hardware`; a CPU profile's ranks are the node (they share one host)."""
    if profile is not None and profile.device.kind == "cpu" and devices_per_node is None:
        devices_per_node = profile.world_size
    return Hardware(spec=catalogue_spec, profile=profile, nodes=nodes, devices_per_node=devices_per_node, topology=topology)
