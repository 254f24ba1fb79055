"""The planner's step-time estimate for any job on any hardware (stored as `prediction.step_time_s`;
the ranking of configurations built on it is `parallab.core.ranking`), and Spearman's rank
correlation that sweeps judge it by. The model is stated in docs/planner.md; in short, per rank
and optimizer step:

    step = (compute + exposed communication) / (1 − bubble) + optimizer

- compute: every GEMM of the rank's share of the forward (the model's weights at the rank's
  token count and tensor-parallel split, the attention core at half its square for the causal
  mask, the LM head where it lives) timed at the FLOP/s the pool's calibration measured for that
  shape and precision (interpolated in GEMM volume) — or the datasheet's dense peak ×
  `plan_hardware.MATMUL_EFFICIENCY` uncalibrated; backward is twice the forward; recomputation adds the forward
  it recomputes. Memory-bound work — the elementwise ops (≈ `ELEMENTWISE_ACCESSES` per token and
  layer), autocast's weight casts, the loss — at the measured (or datasheet ×
  `MEMORY_EFFICIENCY`) memory bandwidth; plus the host time of every op launched.
- communication: each `CommItem` of the strategy's descriptor, timed by the hardware
  (`parallab.core.plan_hardware.Hardware.comm_seconds`) — bytes per call × nccl-tests' bus
  factor / the bus bandwidth at that message size (calibrated busbw by op and size inside a node);
  on a pool that knows its topology, a group spanning nodes (or inside one, without a curve) runs
  the α–β ring: the path's measured α per step of the algorithm (`ring_steps`) plus the bytes
  over its β; without one, the catalogue link × `LINK_EFFICIENCY` plus a latency per call. The share the
  strategy can overlap (DDP's buckets but the last, FSDP's prefetched groups, the ring's and the
  pipeline's asynchronous P2P) hides under compute as far as compute lasts, scaled by what the
  device can overlap (GPUs 1; CPU ranks share their cores with gloo: 0). A collective fused with
  its GEMMs (async TP, `CommItem.pipelined`) hides under those alone: what exceeds (n − 1)/n of
  their time shows (`pipelined_exposed`). Under loss parallel the logits' gather is left out.
- bubble: the descriptor's bubble fraction, (p−1)/(m+p−1) for a pipeline.
- optimizer: AdamW reads and writes 28 bytes per local parameter (fp32 master, grads, 2 moments).

Tokens/s = global tokens per step / step.

On an uncalibrated GPU whose catalogue entry has a device profile (`parallab.core.device_profile`,
`parallab/core/profiles/<key>.json`), compute is timed kernel class by kernel class from the
profile's measured shares instead (`profile_terms`, `parallab.core.gpu_time`; docs/planner.md,
"Device profiles"), and GEMMs sit on the roofline at the profile's share of the peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from parallab.core.costs import activation_dtype_bytes
from parallab.core.dims.base import LOGITS_GATHER, CommItem, residual_stream_bytes
from parallab.core.dims.dp_shard import DIMENSION as FSDP_DIMENSION
from parallab.core.families import tensor_count
from parallab.core.gpu_time import Shares, Term, compute_terms, loss_bytes_per_entry
from parallab.core.jobs import ResolvedJob
from parallab.core.layout import last_stage_rank
from parallab.core.plan_hardware import Hardware
from parallab.core.pools import placed_stride
from parallab.core.run_recipe import PARALLAB, RunRecipe
from parallab.core.stats import spearman_rho
from parallab.core.strategies.base import MeshDim

ELEMENTWISE_ACCESSES = (30, 5)
"""(a, b): a forward block reads and writes ≈ a·h + b·f/tp elements per token (norms, rotary,
residuals, SwiGLU's activation and product, casts); backward twice that."""
OPS_PER_LAYER = 90
"""aten ops one block's forward launches (counted: tiny's forward launches 373 for its 4 blocks and
head); backward launches `BACKWARD_OPS` times as many (614)."""
BACKWARD_OPS = 1.65
DTENSOR_OPS_PER_LAYER = 7
"""Linears of a block that run on DTensors under tensor parallelism (q, k, v, o, w1, w3, w2): each
forward, and its two backward matmuls, pay DTensor's dispatch."""
ADAMW_BYTES = 28
"""AdamW per fp32 parameter: reads param, grad, two moments (16 B), writes param and moments (12 B)."""
ADAMW_LOOP_BYTES = 80
"""torch's single-tensor AdamW (`torch.optim.adam._single_tensor_adam`, its default for CPU
parameters, which no foreach kernel serves) per fp32 parameter, pass by pass: the decoupled weight
decay `param.mul_` (8 B), `exp_avg.lerp_(grad)` (12), `exp_avg_sq.mul_` (8) and `.addcmul_(grad,
grad)` (12), `exp_avg_sq.sqrt()` (8), its division (8), `.add_(eps)` (8), `param.addcdiv_(exp_avg,
denom)` (16)."""
ADAMW_LOOP_OPS = 10
"""Ops that loop launches per parameter tensor (the eight passes, the step count's increment and its `.item()`)."""
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
    dims = job.degrees
    pp, cp = dims["pp"], dims["cp"]
    microbatches = getattr(job.options, "microbatches", None) if pp > 1 else None
    m = microbatches if isinstance(microbatches, int) and microbatches > 0 else 1
    sequences = max(job.micro_batch_size // m, 1)
    return Layout(
        tokens=sequences * job.model.seq_len // cp,
        forwards=job.accum_steps * m,
        layers=_rank_layers(job)[-1] if pp > 1 else job.model.num_layers,
        context=job.model.seq_len,
        tp=dims["tp"],
        ep=dims["ep"],
        head=True,
    )


def _rank_layers(job: ResolvedJob) -> list[int]:
    """Blocks per pp rank, the rank holding the last stage (the head) last."""
    mesh = job.descriptor.layout(job.world_size, job.options)
    if mesh is None or mesh.pp == 1:
        return [job.model.num_layers]
    per_rank = mesh.rank_layers(job.model.num_layers)
    last = last_stage_rank(mesh.pp, mesh.virtual_stages, mesh.schedule)
    return [n for r, n in enumerate(per_rank) if r != last] + [per_rank[last]]


def busiest_layouts(job: ResolvedJob) -> list[Layout]:
    """The ranks that may be a pipeline's slowest: the one holding the head (`layout`) and, where
    stages are uneven (torchtitan's split), the one holding the most blocks without it."""
    lay = layout(job)
    most = max(_rank_layers(job))
    return [lay] if most <= lay.layers else [lay, replace(lay, layers=most, head=False)]


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
    comm_by_dim: dict[str, float] = field(default_factory=dict)
    """Communication seconds per step by the mesh dimension its group spans ('?' where none fits)."""
    exposed_by_dim: dict[str, float] = field(default_factory=dict)
    """The exposed share of `comm_by_dim`: what no compute hides (an overflow of hideable comm
    beyond compute split over the dimensions in proportion to what each wanted hidden)."""
    inter_node_dims: list[str] = field(default_factory=list)
    """Dimensions whose groups the estimate timed on the inter-node link."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gemm(hw: Hardware, precision: str, m: int, k: int, n: int) -> float:
    """Forward seconds of (m×k)@(k×n)."""
    return 2 * m * n * k / hw.matmul_flops(precision, m, n, k) if m and n and k else 0.0


def _block_parts(job: ResolvedJob, hw: Hardware, lay: Layout) -> tuple[float, float, float]:
    """One block's forward on this rank: (weight GEMMs, attention core, memory-bound) seconds."""
    cfg, precision, t, tp = job.model, job.workload.precision, lay.tokens, lay.tp
    h, f, up = cfg.hidden_size, cfg.ffn_hidden_size, cfg.mlp_matrices - 1
    if cfg.is_mla:
        gemms = _mla_gemms(job, hw, t)
    else:
        gemms = _gemm(hw, precision, t, h, h // tp) + 2 * _gemm(hw, precision, t, h, cfg.kv_dim // tp) + _gemm(hw, precision, t, h // tp, h)
    dense = up * _gemm(hw, precision, t, h, f // tp) + _gemm(hw, precision, t, f // tp, h)
    if cfg.is_moe:
        fe = cfg.expert_ffn
        local_experts = max(cfg.num_experts // lay.ep, 1)
        rows = max(t * cfg.top_k // local_experts, 1)
        shared = cfg.num_shared_experts * fe
        moe = _gemm(hw, precision, t, h, cfg.num_experts)
        moe += local_experts * (up * _gemm(hw, precision, rows, h, fe) + _gemm(hw, precision, rows, fe, h))
        moe += up * _gemm(hw, precision, t, h, shared) + _gemm(hw, precision, t, shared, h)
        share = cfg.moe_layers / cfg.num_layers  # the average block: the first blocks may be dense
        gemms += share * moe + (1 - share) * dense
        width = share * (fe * cfg.top_k + shared) + (1 - share) * f
    else:
        gemms += dense
        width = f // tp
    heads = max(cfg.num_heads // tp, 1)
    qk, pv = _gemm(hw, precision, t, cfg.qk_head_dim, lay.context), _gemm(hw, precision, t, cfg.value_head_dim, lay.context)
    attention = 0.5 * heads * (qk + pv)  # QKᵀ and PV (d_qk and d_v wide: head_dim both without MLA), causal half
    a, b = ELEMENTWISE_ACCESSES
    memory = t * (a * h + b * width) * activation_dtype_bytes(precision) / hw.memory_bandwidth
    return gemms, attention, memory


def _mla_gemms(job: ResolvedJob, hw: Hardware, t: int) -> float:
    """Multi-head latent attention's projections, forward (tensor parallelism is refused for it):
    the query (q_proj, or q_a_proj then q_b_proj), kv_a_proj_with_mqa, kv_b_proj and o_proj."""
    cfg, precision = job.model, job.workload.precision
    h, heads, rank, q_rank = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank, cfg.q_lora_rank
    query = heads * cfg.qk_head_dim
    q = _gemm(hw, precision, t, h, q_rank) + _gemm(hw, precision, t, q_rank, query) if q_rank else _gemm(hw, precision, t, h, query)
    latent = _gemm(hw, precision, t, h, rank + cfg.qk_rope_head_dim) + _gemm(
        hw, precision, t, rank, heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    )
    return q + latent + _gemm(hw, precision, t, heads * cfg.v_head_dim, h)


def _policy_recomputed_gemms(job: ResolvedJob, hw: Hardware, lay: Layout, policy: str) -> float:
    """One block's forward GEMMs a selective policy recomputes (`activations.SELECTIVE_POLICIES`):
    none under parallab's (it keeps every matmul's output); wk, wo and w3 under torchtitan's."""
    if policy != "torchtitan_op":
        return 0.0
    cfg, precision, t, tp = job.model, job.workload.precision, lay.tokens, lay.tp
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    return _gemm(hw, precision, t, h, cfg.kv_dim // tp) + _gemm(hw, precision, t, h // tp, h) + _gemm(hw, precision, t, h, f // tp)


def _recomputed_blocks(mode: str, layers: int) -> float:
    return {"full": layers, "alternate": math.ceil(layers / 2)}.get(mode, 0)


def profile_terms(job: ResolvedJob, hw: Hardware, lay: Layout | None = None, recipe: RunRecipe = PARALLAB) -> list[Term]:
    """The step's compute by term on a GPU with a device profile (`parallab.core.gpu_time`)."""
    device_profile = hw.device_profile
    if device_profile is None:
        return []
    lay = lay or layout(job)
    cfg, precision = job.model, job.workload.precision
    gemms, _, _ = _block_parts(job, hw, lay)
    vocab = cfg.vocab_size // lay.tp
    head = _gemm(hw, "bf16" if precision == "fp8" else precision, lay.tokens, cfg.hidden_size, vocab) if lay.head else 0.0
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    block_weights = lay.layers * (2 * h * h + 2 * h * cfg.kv_dim + (cfg.mlp_matrices) * h * f) // lay.tp
    sp = bool(getattr(job.options, "sequence_parallel", False))
    fsdp = job.degrees[FSDP_DIMENSION.name] > 1
    stream = residual_stream_bytes(precision, fsdp=fsdp)
    recomputed = _policy_recomputed_gemms(job, hw, lay, recipe.selective_policy)
    shares = Shares(lay.tokens, lay.layers, lay.context, lay.tp, lay.forwards, gemms, head, block_weights, sp, stream, recomputed)
    peak16 = hw.peak_flops("bf16" if precision != "fp32" else "fp32")
    return compute_terms(job, shares, device_profile, recipe, peak16=peak16, bandwidth=hw.spec.memory_bandwidth)


def compute_seconds(job: ResolvedJob, hw: Hardware, lay: Layout | None = None, recipe: RunRecipe = PARALLAB) -> float:
    """Forward, backward and recomputation of one optimizer step on the busiest rank."""
    if lay is None:
        return max(compute_seconds(job, hw, candidate, recipe) for candidate in busiest_layouts(job))
    if hw.device_profile is not None:
        return sum(term.seconds for term in profile_terms(job, hw, lay, recipe))
    lay = lay or layout(job)
    cfg, wl = job.model, job.workload
    precision, mode = wl.precision, wl.activation_checkpointing
    measured = measured_block_seconds(job, hw, lay, recipe.selective_policy)
    if measured is not None:
        return lay.forwards * (lay.layers * measured + _root_seconds(job, hw, lay))
    gemms, attention, memory = _block_parts(job, hw, lay)
    block = gemms + attention + memory
    forward = lay.layers * block
    if lay.head:
        vocab = cfg.vocab_size // lay.tp
        forward += _gemm(hw, precision, lay.tokens, cfg.hidden_size, vocab)
        forward += lay.tokens * vocab * loss_bytes_per_entry(precision, recipe) / hw.memory_bandwidth  # the logits: softmax, loss
    recompute = _recomputed_blocks(mode, lay.layers) * block
    if mode == "selective":
        recomputed = _policy_recomputed_gemms(job, hw, lay, recipe.selective_policy)
        recompute = lay.layers * (memory + (recomputed if recipe.selective_policy == "torchtitan_op" else attention))
    ops = OPS_PER_LAYER * lay.layers * (1 + BACKWARD_OPS + (1 if mode != "none" else 0)) * hw.op_overhead_s
    if mode == "selective":  # the policy's caching mode sees every op of the block
        ops += OPS_PER_LAYER * lay.layers * hw.selective_op_overhead_s
    if lay.tp > 1:
        ops += DTENSOR_OPS_PER_LAYER * lay.layers * 3 * hw.dtensor_op_overhead_s
    casts = 0.0
    if precision != "fp32":  # autocast casts every weight it multiplies, in each forward (and recompute)
        casts = _local_params(job) * 6 * (2 if mode in ("full", "alternate") else 1) / hw.memory_bandwidth
    per_forward = 3 * forward + recompute + ops + casts
    return lay.forwards * per_forward


def measured_block_seconds(job: ResolvedJob, hw: Hardware, lay: Layout, selective_policy: str = "every_matmul") -> float | None:
    """One block's forward, backward and recomputation from the pool's calibration of the workload's
    own block (`HardwareProfile.blocks`, at the rank's tokens: under context parallelism its share
    of the sequence): eager, under parallab's selective policy; alternate recomputation is its
    blocks' mean (every other block full). Split by tensor parallelism, the block's weight GEMMs are
    timed at their split shapes (and pay DTensor's dispatch) and the rest — norms, rotary,
    activations, attention, autograd — is what the whole block measured beyond its own GEMMs.
    None where the profile measured no such block."""
    profile = hw.profile
    if profile is None or not profile.blocks or job.workload.compile:
        return None
    mode, precision = job.workload.activation_checkpointing, job.workload.precision
    if mode == "selective" and selective_policy != "every_matmul":
        return None
    if mode == "alternate":
        full = profile.block_seconds(job.model, precision, "full", lay.tokens)
        none = profile.block_seconds(job.model, precision, "none", lay.tokens)
        if full is None or none is None:
            return None
        recomputed = math.ceil(lay.layers / 2) / max(lay.layers, 1)
        measured, gemm_passes = recomputed * full + (1 - recomputed) * none, 3 + recomputed
    else:
        found = profile.block_seconds(job.model, precision, mode, lay.tokens)
        if found is None:
            return None
        measured, gemm_passes = found, 4 if mode == "full" else 3
    if lay.tp == 1:
        return measured
    under_tp = _measured_tp_block(job, hw, lay)
    if under_tp is not None:
        return under_tp
    whole = _block_parts(job, hw, replace(lay, tp=1))[0]
    split = _block_parts(job, hw, lay)[0]
    rest = max(0.0, measured - gemm_passes * whole)
    return rest + gemm_passes * split + DTENSOR_OPS_PER_LAYER * 3 * hw.dtensor_op_overhead_s


def _measured_tp_block(job: ResolvedJob, hw: Hardware, lay: Layout) -> float | None:
    """One block's forward and backward as the calibration timed it under tensor parallelism at this
    degree and sequence parallelism (`HardwareProfile.tp_blocks`: its collectives taken out, which
    the tp dimension's items time); alternate recomputation as its blocks' mean. None where the
    calibration did not time the block so (then the block measured whole is split by its GEMMs)."""
    assert hw.profile is not None
    sp = bool(getattr(job.options, "sequence_parallel", False))
    mode, precision = job.workload.activation_checkpointing, job.workload.precision

    def read(recompute: str) -> float | None:
        assert hw.profile is not None
        return hw.profile.tp_block_seconds(job.model, lay.tp, sp, precision, recompute, lay.tokens)

    if mode != "alternate":
        return read(mode)
    full, none = read("full"), read("none")
    if full is None or none is None:
        return None
    recomputed = math.ceil(lay.layers / 2) / max(lay.layers, 1)
    return recomputed * full + (1 - recomputed) * none


def fsdp_overhead_seconds(job: ResolvedJob, hw: Hardware) -> float:
    """FSDP2's own work on the rank per step beyond its collectives — the copies around each
    all-gather and reduce-scatter and the hooks that drive them — as the calibration measured it per
    group and micro-step (`Hardware.fsdp_group_overhead_s`), times the groups (the busiest stage's
    blocks and the root) and the accumulation micro-steps; 0 without dp_shard or a measurement."""
    mesh = job.descriptor.layout(job.world_size, job.options)
    if mesh is None or mesh.fsdp_shards == 1:
        return 0.0
    groups = mesh.most_layers(job.model.num_layers) + 1
    return groups * job.accum_steps * hw.fsdp_group_overhead_s(mesh.reshard_after_forward)


def _dtensor_params(job: ResolvedJob) -> bool:
    """Whether the optimizer steps DTensor parameters (FSDP2 shards them as DTensors; tp's plan too)."""
    mesh = job.descriptor.layout(job.world_size, job.options)
    return mesh is not None and (mesh.fsdp_shards > 1 or mesh.tp > 1)


def _root_seconds(job: ResolvedJob, hw: Hardware, lay: Layout) -> float:
    """What a forward and backward spend outside the blocks on the rank holding the head: the head's
    GEMMs (backward twice the forward), the fp32 logits' softmax and loss, autocast's cast of the
    head's weight; the embedding's gather is negligible beside them. Under tp without a pipeline
    (the rank holds both ends), the calibration's ends as tp runs them where it timed them
    (`HardwareProfile.tp_roots`: DTensor's vocab-parallel embedding, head and norm, collectives out)."""
    if not lay.head:
        return 0.0
    cfg, precision = job.model, job.workload.precision
    if lay.tp > 1 and hw.profile is not None and job.degrees["pp"] == job.degrees["cp"] == 1:  # both ends, whole sequences: as calibrated
        sp = bool(getattr(job.options, "sequence_parallel", False))
        measured = hw.profile.tp_root_seconds(cfg, lay.tp, sp, precision, lay.tokens)
        if measured is not None:
            return measured
    vocab = cfg.vocab_size // lay.tp
    seconds = 3 * _gemm(hw, precision, lay.tokens, cfg.hidden_size, vocab)
    seconds += 3 * lay.tokens * vocab * 4 * 3 / hw.memory_bandwidth
    if precision != "fp32":
        seconds += vocab * cfg.hidden_size * 6 / hw.memory_bandwidth
    return seconds


_LOCAL_PARAMS: dict[str, int] = {}
"""Parameter elements on the busiest rank, by (strategy, world size, options, model): a ranking asks
for the same split under every recipe."""


def _local_params(job: ResolvedJob) -> int:
    key = f"{job.strategy}|{job.world_size}|{job.spec.strategy.options}|{job.model.model_dump_json()}"
    if key not in _LOCAL_PARAMS:
        if len(_LOCAL_PARAMS) > 4096:
            _LOCAL_PARAMS.clear()
        _LOCAL_PARAMS[key] = max(job.descriptor.param_elements_per_rank(job))
    return _LOCAL_PARAMS[key]


def optimizer_seconds(job: ResolvedJob, hw: Hardware) -> float:
    """AdamW over the rank's parameters (and the accumulation adds into the grads): on CPU ranks
    torch's single-tensor loop, pass by pass (`ADAMW_LOOP_BYTES`), each of its ops paying DTensor's
    dispatch on top where the parameters are DTensors (FSDP2, tp: the calibrated
    `dtensor_op_overhead_s`); elsewhere the ideal 28 B."""
    local = _local_params(job)
    tensors = tensor_count(job.model)
    accumulate = (job.accum_steps - 1) * local * 12
    cpu = hw.device.kind == "cpu"
    per_param = ADAMW_LOOP_BYTES if cpu else ADAMW_BYTES
    per_op = hw.op_overhead_s
    if cpu and _dtensor_params(job):  # each op of the loop dispatches through DTensor
        per_op += hw.dtensor_op_overhead_s
    return (local * per_param + accumulate) / hw.memory_bandwidth + tensors * ADAMW_LOOP_OPS * per_op


def placed_item_stride(job: ResolvedJob, group_size: int, stride: int) -> int:
    """The host-rank distance between a collective group's members (what decides whether it
    crosses nodes) for a group of `group_size` mesh ranks `stride` apart, under the job's placement
    order: `across` lays tp's groups over the nodes (`parallab.core.pools.placed_stride`)."""
    return placed_stride([(d.name, d.size) for d in job.mesh], job.placement_order, group_size, stride)


def _mesh_dim(mesh: Sequence[MeshDim], group_size: int, stride: int) -> str:
    """The mesh dimension (row-major, last innermost) whose groups are `group_size` ranks `stride` apart."""
    inner = 1
    for dim in reversed(mesh):
        if dim.size == group_size and inner == stride:
            return dim.name
        inner *= dim.size
    return "?"


def pipelined_exposed(hw: Hardware, precision: str, item: CommItem, seconds: float) -> float:
    """The exposed seconds of a collective micro-pipelined with its GEMMs (async TP,
    `CommItem.pipelined`): each call is cut into n chunks (n the group), and its transfer overlaps
    n − 1 of the n GEMM chunks — the first chunk of an all-gather is the local shard, multiplied
    while the first remote one is copied; the last of a reduce-scatter is the rank's own partial,
    computed while the previous one is pulled — so what exceeds (n − 1)/n of the GEMMs' time shows
    (the two-stage pipeline: max(n·c, c + (n − 1)·x) for chunks of c compute and x transfer). A
    reduce-scatter then sums the n partials it gathered (torch's `reduce_fn`): a memory-bound
    kernel reading the whole output and writing its 1/n, which an NCCL reduce-scatter does inside
    its kernel. The GEMM chunks are timed as the compute model times a GEMM (`_gemm`, m/n rows)."""
    n, calls = item.group_size, max(item.calls, 1)
    chunks = sum(n * _gemm(hw, precision, max(m // n, 1), k, width) for m, k, width in item.pipelined)
    per_call = max(0.0, seconds / calls - (n - 1) / n * chunks)
    if item.op == "reduce_scatter":
        per_call += item.bytes_per_call * (1 + 1 / n) / hw.memory_bandwidth
    return calls * per_call


def item_seconds(job: ResolvedJob, hw: Hardware, item: CommItem, recipe: RunRecipe = PARALLAB) -> tuple[float, float, float] | None:
    """One `CommItem` on `hw`: (its seconds, what of them is exposed outright, what asks to hide under
    the step's compute — `overlap` × what the device can overlap), or None where the step does not
    time it: a P2P receive (timed once, on its send), the logits' gather under loss parallel (the
    loss runs on the vocabulary shards). A micro-pipelined item (async TP) hides under its own
    GEMMs instead (`pipelined_exposed`)."""
    if item.op == "recv" or (recipe.loss_parallel and item.label == LOGITS_GATHER):
        return None
    placed = placed_item_stride(job, item.group_size, item.stride)
    seconds = hw.comm_seconds(item.op, item.bytes_per_call, item.calls, item.group_size, placed)
    share = item.overlap * hw.spec.comm_overlap
    if item.pipelined and hw.spec.comm_overlap:
        return seconds, pipelined_exposed(hw, job.workload.precision, item, seconds), 0.0
    return seconds, seconds * (1 - share), seconds * share


def estimate_step_time(job: ResolvedJob, hw: Hardware, recipe: RunRecipe = PARALLAB) -> StepTimeEstimate:
    """The step-time estimate of `job` on `hw` (see the module docstring and docs/planner.md) under
    `recipe`: how the head's loss runs and what selective recomputation keeps (`parallab.core.run_recipe`)."""
    compute = compute_seconds(job, hw, recipe=recipe)
    compute += fsdp_overhead_seconds(job, hw)
    comm = exposed = hidden_want = 0.0
    by_dim: dict[str, float] = {}
    exposed_dim: dict[str, float] = {}
    want_dim: dict[str, float] = {}
    crossing: list[str] = []
    mesh = job.mesh if job.world_size > 1 else ()
    for item in job.descriptor.comm_items(job) if job.world_size > 1 else []:
        timed = item_seconds(job, hw, item, recipe)
        if timed is None:
            continue
        seconds, shown, want = timed
        dim = _mesh_dim(mesh, item.group_size, item.stride)
        if hw.crosses_nodes(item.group_size, placed_item_stride(job, item.group_size, item.stride)) and dim not in crossing:
            crossing.append(dim)
        comm += seconds
        exposed += shown
        hidden_want += want
        by_dim[dim] = by_dim.get(dim, 0.0) + seconds
        exposed_dim[dim] = exposed_dim.get(dim, 0.0) + shown
        want_dim[dim] = want_dim.get(dim, 0.0) + want
    overflow = max(0.0, hidden_want - compute)
    exposed += overflow
    for dim, want in want_dim.items():
        if hidden_want > 0:
            exposed_dim[dim] += overflow * want / hidden_want
    bubble_fraction = job.descriptor.bubble_fraction(job) or 0.0
    busy = compute + exposed
    # The critical path — (m+p−1) micro-batch slots of a stage — at the stage's own speed. CPU ranks
    # that outnumber the cores run at the calibrated, time-shared rate only while all are busy: an
    # idle stage hands its core to the others, so the pipeline is bound by the larger of the
    # shared work and the critical path at the unshared speed (1/ranks_per_core of the shared time).
    critical = busy / hw.ranks_per_core / (1 - bubble_fraction) if bubble_fraction < 1 else busy
    bubble = max(0.0, critical - busy)
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
        comm_by_dim=by_dim,
        exposed_by_dim=exposed_dim,
        inter_node_dims=crossing,
    )


# ---- how well a prediction ranked what was measured ----


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation of predicted against measured (`parallab.core.stats`)."""
    return spearman_rho(xs, ys)
