"""The planner: a step-time estimate for any job on any hardware, and the ranking of every
configuration of a workload on a cluster (`parallab plan --device`, `GET /api/v1/plan?mode=rank`,
sweeps). The model is stated in docs/planner.md; in short, per rank and optimizer step:

    step = (compute + exposed communication) / (1 − bubble) + optimizer

- compute: every GEMM of the rank's share of the forward (the model's weights at the rank's
  token count and tensor-parallel split, the attention core at half its square for the causal
  mask, the LM head where it lives) timed at the FLOP/s the pool's calibration measured for that
  shape and precision (interpolated in GEMM volume) — or the datasheet's dense peak ×
  `MATMUL_EFFICIENCY` uncalibrated; backward is twice the forward; recomputation adds the forward
  it recomputes. Memory-bound work — the elementwise ops (≈ `ELEMENTWISE_ACCESSES` per token and
  layer), autocast's weight casts, the loss — at the measured (or datasheet ×
  `MEMORY_EFFICIENCY`) memory bandwidth; plus the host time of every op launched.
- communication: each `CommItem` of the strategy's descriptor — bytes per call × nccl-tests' bus
  factor / the bus bandwidth at that message size (calibrated busbw by op and size; uncalibrated,
  or across nodes, the link bandwidth × `LINK_EFFICIENCY` plus a latency per call). The share the
  strategy can overlap (DDP's buckets but the last, FSDP's prefetched groups, the ring's and the
  pipeline's asynchronous P2P) hides under compute as far as compute lasts, scaled by what the
  device can overlap (GPUs 1; CPU ranks share their cores with gloo: 0).
- bubble: the descriptor's bubble fraction, (p−1)/(m+p−1) for a pipeline.
- optimizer: AdamW reads and writes 28 bytes per local parameter (fp32 master, grads, 2 moments).

Tokens/s = global tokens per step / step. The ranking resolves every candidate with
`resolve_job` (its SpecErrors are a rejection's reasons), predicts its memory per rank
(`prediction.predict`: model state + activations) against the device's usable memory, and asks
the device whether it can train in the precision (`hardware.precision_problem`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import product
from typing import Any

from pydantic import ValidationError

from parallab.core.costs import activation_dtype_bytes, model_tensors
from parallab.core.hardware import DeviceDescription, DeviceSpec, HardwareProfile, precision_problem
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.metrics import busbw_factor
from parallab.core.model import PRESETS
from parallab.core.problems import SpecError
from parallab.core.recipes import micro_batch_size
from parallab.core.spec import JobSpec

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
ELEMENTWISE_ACCESSES = (30, 5)
"""(a, b): a forward block reads and writes ≈ a·h + b·f/tp elements per token (norms, rotary,
residuals, SwiGLU's activation and product, casts); backward twice that."""
OPS_PER_LAYER = 40
"""aten ops one block's forward launches (backward twice that)."""
ADAMW_BYTES = 28
"""AdamW per fp32 parameter: reads param, grad, two moments (16 B), writes param and moments (12 B)."""
P2P_OPS = {"send": "send_recv", "recv": "send_recv"}
"""The calibrated curve a descriptor's op is timed on."""


# ---- hardware ----


@dataclass(frozen=True)
class Hardware:
    """What a plan runs on: a catalogue entry, optionally a pool's calibrated profile, and the cluster's shape."""

    spec: DeviceSpec
    profile: HardwareProfile | None = None
    nodes: int = 1
    devices_per_node: int | None = None

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
        source = f"calibrated on {self.profile.world_size} rank(s)" if self.profile is not None else "datasheet"
        return f"{self.nodes} × {self.per_node} {self.spec.name} ({source})"

    def matmul_flops(self, precision: str, m: int, n: int, k: int) -> float:
        """FLOP/s of an (m, n, k) GEMM: measured when calibrated in this precision, else the datasheet."""
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
        return self.spec.memory_bandwidth * MEMORY_EFFICIENCY

    @property
    def op_overhead_s(self) -> float:
        if self.profile is not None and self.profile.op_overhead_s is not None:
            return self.profile.op_overhead_s
        return self.spec.op_overhead_s

    def crosses_nodes(self, group_size: int, stride: int) -> bool:
        return self.nodes > 1 and group_size * stride > self.per_node

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
    catalogue_spec: DeviceSpec, *, profile: HardwareProfile | None = None, nodes: int = 1, devices_per_node: int | None = None
) -> Hardware:
    """A `Hardware`; a CPU profile's ranks are the node (they share one host)."""
    if profile is not None and profile.device.kind == "cpu" and devices_per_node is None:
        devices_per_node = profile.world_size
    return Hardware(spec=catalogue_spec, profile=profile, nodes=nodes, devices_per_node=devices_per_node)


# ---- the step-time estimate ----


@dataclass(frozen=True)
class Layout:
    """The rank's share of one step, for the compute estimate (the busiest rank: a pipeline's last stage)."""

    tokens: int
    """Tokens through one forward on this rank."""
    forwards: int
    """Forwards per optimizer step (accumulation micro-steps × pipeline micro-batches)."""
    layers: int
    context: int
    """Keys each query attends to (the whole sequence, under ring attention too)."""
    tp: int
    ep: int
    head: bool


def layout(job: ResolvedJob) -> Layout:
    """From the descriptor's mesh: tokens per forward, forwards per step, blocks and splits of the busiest rank."""
    dims = {d.name: d.size for d in job.mesh}
    pp, cp = dims.get("pp", 1), dims.get("cp", 1)
    microbatches = getattr(job.options, "microbatches", None) if pp > 1 else None
    m = microbatches if isinstance(microbatches, int) and microbatches > 0 else 1
    sequences = max(job.micro_batch_size // m, 1)
    return Layout(
        tokens=sequences * job.model.seq_len // cp,
        forwards=job.accum_steps * m,
        layers=job.model.num_layers // pp,
        context=job.model.seq_len,
        tp=dims.get("tp", 1),
        ep=dims.get("ep", 1),
        head=True,
    )


@dataclass(frozen=True)
class StepTimeEstimate:
    """One rank's step, by part (seconds); `step_s` is what tokens/s divides."""

    compute_s: float
    comm_s: float
    exposed_comm_s: float
    bubble_s: float
    optimizer_s: float
    step_s: float
    tokens_per_s: float
    calibrated: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gemm(hw: Hardware, precision: str, m: int, k: int, n: int) -> float:
    """Forward seconds of (m×k)@(k×n)."""
    return 2 * m * n * k / hw.matmul_flops(precision, m, n, k) if m and n and k else 0.0


def _block_parts(job: ResolvedJob, hw: Hardware, lay: Layout) -> tuple[float, float, float]:
    """One block's forward on this rank: (weight GEMMs, attention core, memory-bound) seconds."""
    cfg, precision, t, tp = job.model, job.workload.precision, lay.tokens, lay.tp
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    gemms = 3 * _gemm(hw, precision, t, h, h // tp) + _gemm(hw, precision, t, h // tp, h)
    if cfg.is_moe:
        local_experts = max(cfg.num_experts // lay.ep, 1)
        rows = max(t * cfg.top_k // local_experts, 1)
        gemms += _gemm(hw, precision, t, h, cfg.num_experts)
        gemms += local_experts * (2 * _gemm(hw, precision, rows, h, f) + _gemm(hw, precision, rows, f, h))
        width = f * cfg.top_k
    else:
        gemms += 2 * _gemm(hw, precision, t, h, f // tp) + _gemm(hw, precision, t, f // tp, h)
        width = f // tp
    heads = max(cfg.num_heads // tp, 1)
    attention = 0.5 * heads * 2 * _gemm(hw, precision, t, cfg.head_dim, lay.context)  # QKᵀ and PV, causal half
    a, b = ELEMENTWISE_ACCESSES
    memory = t * (a * h + b * width) * activation_dtype_bytes(precision) / hw.memory_bandwidth
    return gemms, attention, memory


def _recomputed_blocks(mode: str, layers: int) -> float:
    return {"full": layers, "alternate": math.ceil(layers / 2)}.get(mode, 0)


def compute_seconds(job: ResolvedJob, hw: Hardware, lay: Layout | None = None) -> float:
    """Forward, backward and recomputation of one optimizer step on the busiest rank."""
    lay = lay or layout(job)
    cfg, wl = job.model, job.workload
    precision, mode = wl.precision, wl.activation_checkpointing
    gemms, attention, memory = _block_parts(job, hw, lay)
    block = gemms + attention + memory
    forward = lay.layers * block
    if lay.head:
        vocab = cfg.vocab_size // lay.tp
        forward += _gemm(hw, precision, lay.tokens, cfg.hidden_size, vocab)
        forward += lay.tokens * vocab * 4 * 3 / hw.memory_bandwidth  # fp32 logits: softmax, loss
    recompute = _recomputed_blocks(mode, lay.layers) * block
    if mode == "selective":
        recompute = lay.layers * (attention + memory)
    ops = OPS_PER_LAYER * lay.layers * (3 + (1 if mode != "none" else 0)) * hw.op_overhead_s
    casts = 0.0
    if precision != "fp32":  # autocast casts every weight it multiplies, in each forward (and recompute)
        casts = _local_params(job) * 6 * (2 if mode in ("full", "alternate") else 1) / hw.memory_bandwidth
    per_forward = 3 * forward + recompute + ops + casts
    return lay.forwards * per_forward


def _local_params(job: ResolvedJob) -> int:
    return max(job.descriptor.param_elements_per_rank(job))


def optimizer_seconds(job: ResolvedJob, hw: Hardware) -> float:
    """AdamW over the rank's parameters (and the accumulation adds into the grads)."""
    local = _local_params(job)
    tensors = len(model_tensors(job.model))
    accumulate = (job.accum_steps - 1) * local * 12
    return (local * ADAMW_BYTES + accumulate) / hw.memory_bandwidth + tensors * 10 * hw.op_overhead_s


def estimate_step_time(job: ResolvedJob, hw: Hardware) -> StepTimeEstimate:
    """The step-time estimate of `job` on `hw` (see the module docstring and docs/planner.md)."""
    compute = compute_seconds(job, hw)
    comm = exposed = hidden_want = 0.0
    overlap_ok = hw.spec.comm_overlap
    for item in job.descriptor.comm_items(job) if job.world_size > 1 else []:
        seconds = hw.comm_seconds(item.op, item.bytes_per_call, item.calls, item.group_size, item.stride)
        if item.op == "recv":
            continue  # a P2P transfer is timed once, on its send
        comm += seconds
        share = item.overlap * overlap_ok
        exposed += seconds * (1 - share)
        hidden_want += seconds * share
    exposed += max(0.0, hidden_want - compute)
    bubble_fraction = job.descriptor.bubble_fraction(job) or 0.0
    busy = compute + exposed
    bubble = busy * bubble_fraction / (1 - bubble_fraction) if bubble_fraction < 1 else 0.0
    optimizer = optimizer_seconds(job, hw)
    step = busy + bubble + optimizer
    return StepTimeEstimate(
        compute_s=compute,
        comm_s=comm,
        exposed_comm_s=exposed,
        bubble_s=bubble,
        optimizer_s=optimizer,
        step_s=step,
        tokens_per_s=job.tokens_per_step / step if step > 0 else 0.0,
        calibrated=hw.calibrated,
    )


# ---- ranking ----

STRATEGY_GRID: dict[str, list[dict[str, Any]]] = {
    "ddp": [{}],
    "fsdp": [{"reshard_after_forward": True}, {"reshard_after_forward": False}],
    "tp": [{"sequence_parallel": False}, {"sequence_parallel": True}],
    "pp": [{"schedule": s, "microbatches": k} for s in ("1f1b", "gpipe") for k in (1, 2, 4)],
    "ring": [{"zigzag": False}, {"zigzag": True}],
    "moe": [{}],
    "hybrid": [{"tp": t, "sequence_parallel": sp} for t in (2, 4, 8, 16) for sp in (False, True)],
}
"""The options each strategy is planned with (pp's `microbatches` and hybrid's `tp` as multiples
of the stages / as degrees; candidates that break a rule are rejected with the rule's reason)."""
DEFAULT_PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
DEFAULT_CHECKPOINTING = ("none", "selective", "alternate", "full")
DEFAULT_ACCUMULATION = (1, 2, 4)


@dataclass
class PlanRow:
    """One configuration of the workload on the cluster: its dimensions, prediction and verdict."""

    spec: dict[str, Any]
    strategy: str
    options: dict[str, Any]
    mesh: dict[str, int]
    precision: str
    activation_checkpointing: str
    grad_accumulation_steps: int
    microbatches: int | None
    micro_batch_size: int | None
    memory_per_rank_bytes: int | None = None
    model_state_bytes: int | None = None
    activation_bytes: int | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    estimate: dict[str, Any] | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def label(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items() if k != "microbatches")
        world = self.spec.get("strategy", {}).get("world_size", 1)
        dims = " × ".join(f"{k}{v}" for k, v in self.mesh.items() if v > 1) or f"×{world}"
        return f"{self.strategy}[{opts}] {dims}" if opts else f"{self.strategy} {dims}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "label": self.label}


@dataclass
class Ranking:
    hardware: str
    world_size: int
    workload: dict[str, Any]
    fits: list[PlanRow]
    rejected: list[PlanRow]

    def as_dict(self, *, top: int | None = None) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "world_size": self.world_size,
            "workload": self.workload,
            "fits": [r.as_dict() for r in self.fits[:top]],
            "fitting": len(self.fits),
            "rejected": [r.as_dict() for r in self.rejected],
            "rejected_by_reason": rejected_by_reason(self.rejected),
        }


MESH_DIMS = ("dp", "tp", "pp", "cp", "ep")


def candidate_specs(
    workload: dict[str, Any],
    world_size: int,
    *,
    strategies: Iterable[str] | None = None,
    precisions: Iterable[str] = DEFAULT_PRECISIONS,
    checkpointing: Iterable[str] = DEFAULT_CHECKPOINTING,
    accumulation: Iterable[int] = DEFAULT_ACCUMULATION,
) -> list[dict[str, Any]]:
    """Every (strategy, options, precision, recomputation, accumulation) of `workload` on `world_size` ranks, as raw specs.

    `single` only on one rank; `moe` only for a model with experts (on a dense preset it would
    train another model); a pipeline's micro-batch counts are multiples of its stages.
    """
    preset = PRESETS.get(str(workload.get("model")))
    is_moe = bool(workload.get("num_experts") or (preset is not None and preset.config.num_experts))
    names = list(strategies) if strategies is not None else list(STRATEGY_GRID)
    out = []
    if world_size == 1:
        names = ["single"]
    for name in names:
        if name == "moe" and not is_moe:
            continue
        grid = [{}] if name == "single" else STRATEGY_GRID.get(name, [{}])
        for options in grid:
            opts = dict(options)
            if name == "pp":
                opts["microbatches"] = opts["microbatches"] * world_size
            for precision, mode, accum in product(precisions, checkpointing, accumulation):
                out.append(
                    {
                        "workload": {
                            **workload,
                            "precision": precision,
                            "activation_checkpointing": mode,
                            "grad_accumulation_steps": accum,
                        },
                        "strategy": {"name": name, "world_size": world_size, "options": opts},
                    }
                )
    return out


def _row(raw: dict[str, Any], job: ResolvedJob | None) -> PlanRow:
    wl, st = raw["workload"], raw["strategy"]
    mesh = {d: 1 for d in MESH_DIMS}
    micro = None
    if job is not None:
        mesh.update({d.name: d.size for d in job.mesh})
        micro = micro_batch_size(job)
    return PlanRow(
        spec=raw,
        strategy=st["name"],
        options=dict(st.get("options") or {}),
        mesh=mesh,
        precision=str(wl.get("precision", "fp32")),
        activation_checkpointing=str(wl.get("activation_checkpointing", "none")),
        grad_accumulation_steps=int(wl.get("grad_accumulation_steps", 1)),
        microbatches=(st.get("options") or {}).get("microbatches"),
        micro_batch_size=micro,
    )


def evaluate(raw: dict[str, Any], hw: Hardware) -> PlanRow:
    """One candidate: resolved (its SpecErrors are the reasons), then memory, device and time."""
    from parallab.core.prediction import predict  # prediction imports this module for step_time_s

    try:
        job = resolve_job(JobSpec.model_validate(raw), Limits())
    except SpecError as exc:
        row = _row(raw, None)
        row.reasons = [str(p) for p in exc.problems]
        return row
    except ValidationError as exc:
        row = _row(raw, None)
        row.reasons = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        return row
    row = _row(raw, job)
    row.spec = job.spec.model_dump(mode="json", exclude_none=True)
    if job.world_size > hw.devices:
        row.reasons.append(f"strategy.world_size: {job.world_size} ranks but the cluster has {hw.devices} devices")
    problem = precision_problem(job.workload.precision, hw.device)
    if problem:
        row.reasons.append(f"workload.precision: {problem}")
    prediction = predict(job)
    state = sum(prediction["model_state_bytes_per_rank"].values())
    activations = int(prediction.get("activation_bytes_per_rank") or 0)
    row.model_state_bytes, row.activation_bytes, row.memory_per_rank_bytes = state, activations, state + activations
    budget = hw.memory_budget
    if state + activations > budget:
        row.reasons.append(
            f"memory: needs {gib(state + activations)} per rank (model state {gib(state)}, activations {gib(activations)}); "
            f"{hw.spec.name} gives a rank {gib(budget)} ({USABLE_MEMORY:.0%} of its memory)"
        )
    estimate = estimate_step_time(job, hw)
    row.step_time_s, row.tokens_per_s, row.estimate = estimate.step_s, estimate.tokens_per_s, estimate.as_dict()
    return row


def rank(specs: Sequence[dict[str, Any]], hw: Hardware, *, workload: dict[str, Any] | None = None, world_size: int = 0) -> Ranking:
    """Evaluate every candidate; those that fit, fastest first, and those that don't, with why."""
    rows = [evaluate(raw, hw) for raw in specs]
    fits = sorted((r for r in rows if r.fits), key=lambda r: -(r.tokens_per_s or 0.0))
    rejected = [r for r in rows if not r.fits]
    return Ranking(hardware=hw.label, world_size=world_size, workload=workload or {}, fits=fits, rejected=rejected)


def plan_cluster(
    workload: dict[str, Any],
    hw: Hardware,
    *,
    world_size: int | None = None,
    strategies: Iterable[str] | None = None,
    precisions: Iterable[str] = DEFAULT_PRECISIONS,
    checkpointing: Iterable[str] = DEFAULT_CHECKPOINTING,
    accumulation: Iterable[int] = DEFAULT_ACCUMULATION,
) -> Ranking:
    """Rank every configuration of `workload` on all of `hw`'s devices (or `world_size` of them).

    Without a global batch in the workload, the preset's is rounded up to a multiple of the world
    size, so every data-parallel degree can split it (the same batch for every candidate).
    """
    world = world_size or hw.devices
    wl = dict(workload)
    if not wl.get("global_batch_size") and wl.get("model") in PRESETS:
        preset = PRESETS[str(wl["model"])].global_batch_size
        wl["global_batch_size"] = -(-preset // world) * world
    specs = candidate_specs(
        wl, world, strategies=strategies, precisions=precisions, checkpointing=checkpointing, accumulation=accumulation
    )
    return rank(specs, hw, workload=wl, world_size=world)


def rejected_by_reason(rows: Iterable[PlanRow]) -> list[dict[str, Any]]:
    """The rejections grouped by the kind of reason (the field it names), most common first."""
    groups: dict[str, list[PlanRow]] = {}
    for row in rows:
        for reason in row.reasons:
            key = reason.split(":", 1)[0]
            groups.setdefault(key, []).append(row)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        example = members[0]
        out.append(
            {
                "field": key,
                "count": len(members),
                "example": example.label,
                "reason": next(r for r in example.reasons if r.startswith(key)),
            }
        )
    return out


def gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


# ---- how well a prediction ranked what was measured ----


def ranks_of(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks, ties averaged); None under 3 pairs or with no spread."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks_of(xs), ranks_of(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = math.sqrt(sum((r - mx) ** 2 for r in rx))
    sy = math.sqrt(sum((r - my) ** 2 for r in ry))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)

