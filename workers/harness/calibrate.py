"""The `calibrate` job kind on the ranks: measure what the planner needs, every rank at once.

Each measurement runs on all ranks together between barriers, and its time is the slowest rank's
(one all-reduce MAX), so CPU ranks sharing cores — or GPUs sharing a host's PCIe — report what
each gets while the others work, which is what a training job on the same ranks sees. Each
point is timed over at least `MIN_TIMED_S` of calls (the count agreed from the slowest rank's first
call): CPU ranks that outnumber the cores are scheduled in slices of milliseconds, and three
sub-millisecond GEMMs measured whether a rank happened to hold a core, not its share of one:

- GEMM FLOP/s: (m×k)@(k×n) for every (k, n) of `gemm_shapes` (the workload's model, split by
  each TP degree) and every token count m, in each precision the device supports (the others are
  skipped and said so on stderr); 2·m·n·k FLOPs per call.
- the workload's own block (the parallab family's dense decoder block), forward and backward at
  the smallest token counts, in each precision and under each recomputation (none, selective,
  full): what the planner times a block by where it is the block planned (no tensor or context
  parallelism), since a training step's norms, rotary, activations, attention and autograd
  bookkeeping cost far more on CPU ranks than their bytes over a large copy's bandwidth.
- memory bandwidth: a 64 MiB copy, read + write.
- op overhead: the host time of a one-element add, end to end; and what a linear on DTensors
  (a replicated input, a weight sharded over all ranks: tensor parallelism's dispatch) costs on
  top of the same plain linear; and what an op costs inside a region under selective
  recomputation's policy (its caching mode sees every op in forward and again in the recompute).
- the same block as tensor parallelism and FSDP2 run it (`workers.harness.wrapped_blocks`): what
  DTensor's dispatch and FSDP2's copies and hooks add beyond the block and its collectives.
- the collectives sweep of the `collectives` job (`workers.harness.collectives`), skipped on one rank.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from parallab.core.hardware import (
    BlockPoint,
    BusbwPoint,
    DeviceDescription,
    HardwareProfile,
    MatmulPoint,
    block_signature,
    precision_problem,
)
from parallab.core.interconnect import CollectivesOptions
from parallab.core.model import ModelConfig
from parallab.core.result import CollectivePoint
from parallab.core.strategies.calibrate import CalibrateOptions, gemm_shapes
from workers.harness import collectives
from workers.harness.everyrank import BLOCK_RECOMPUTE, BLOCK_TOKEN_COUNTS, block_step, gemm_dtype, timed

COPY_BYTES = 64 * 1024 * 1024
OVERHEAD_CALLS = 2000


def measure_matmuls(
    model: ModelConfig, options: CalibrateOptions, device: torch.device, world_size: int, describe: DeviceDescription
) -> list[MatmulPoint]:
    points = []
    for precision in options.precisions:
        problem = precision_problem(precision, describe)
        if problem is not None:
            print(f"calibrate: skipping {precision}: {problem}", file=sys.stderr)
            continue
        dtype = gemm_dtype(precision)
        for k, n in gemm_shapes(model, options.tp_degrees):
            for m in options.token_counts:
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                seconds = timed(functools.partial(torch.matmul, a, b), options.matmul_iters, device, world_size)
                points.append(MatmulPoint(precision=precision, m=m, n=n, k=k, flops_per_s=2 * m * n * k / seconds))
    return points


def measure_blocks(
    model: ModelConfig, options: CalibrateOptions, device: torch.device, world_size: int, describe: DeviceDescription
) -> list[BlockPoint]:
    """The workload's block, forward and backward, at the smallest token counts that are whole
    sequences, in each precision the device supports and under each recomputation; none for a model
    the parallab family does not build or for an MoE block (its routing varies with the data)."""
    if model.family != "parallab" or model.is_moe or model.is_mla:
        return []
    from workers.harness.model import Block, rope_tables

    counts = sorted(t for t in options.token_counts if t % model.seq_len == 0)[:BLOCK_TOKEN_COUNTS]
    points = []
    for precision in options.precisions:
        if precision == "fp8" or precision_problem(precision, describe) is not None:
            continue  # fp8's block is torchao's Float8Linear layers, not timed here
        for recompute in BLOCK_RECOMPUTE:
            torch.manual_seed(0)
            block = Block(model, 0).to(device)
            block.recompute = recompute  # what `apply_activation_checkpointing` sets on every block
            cos, sin = rope_tables(torch.arange(model.seq_len, device=device), model.head_width, model.rope_theta)
            for tokens in counts:
                x = torch.randn(tokens // model.seq_len, model.seq_len, model.hidden_size, device=device, requires_grad=True)
                step = functools.partial(block_step, block, x, torch.randn_like(x), cos, sin, precision)
                seconds = timed(step, 1, device, world_size)
                points.append(BlockPoint(precision=precision, recompute=recompute, tokens=tokens, seconds=seconds))
    return points


def memory_bandwidth(device: torch.device, world_size: int) -> float:
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / timed(lambda: dst.copy_(src), 5, device, world_size)


def op_overhead(device: torch.device, world_size: int) -> float:
    one = torch.ones(1, device=device)
    return timed(lambda: [one.add(one) for _ in range(OVERHEAD_CALLS)], 1, device, world_size) / OVERHEAD_CALLS


def dtensor_overhead(device: torch.device, world_size: int) -> float:
    """Seconds a small linear on DTensors takes beyond the same plain linear (sharding propagation, dispatch)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(device.type, (world_size,))
    x, w = torch.randn(8, 16, device=device), torch.randn(16 * world_size, 16, device=device)
    dx, dw = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(w, mesh, [Shard(0)])
    local = dw.to_local()
    plain = timed(lambda: [torch.nn.functional.linear(x, local) for _ in range(OVERHEAD_CALLS // 10)], 1, device, world_size)
    sharded = timed(lambda: [torch.nn.functional.linear(dx, dw) for _ in range(OVERHEAD_CALLS // 10)], 1, device, world_size)
    return max(sharded - plain, 0.0) / (OVERHEAD_CALLS // 10)


SELECTIVE_OPS = 20


def selective_overhead(device: torch.device, world_size: int) -> float:
    """Seconds per op that selective recomputation's policy adds to a region's forward and backward."""
    from torch.utils.checkpoint import checkpoint

    from workers.harness.model import selective_contexts

    x = torch.ones(8, device=device, requires_grad=True)

    def region(t: torch.Tensor) -> torch.Tensor:
        for _ in range(SELECTIVE_OPS):
            t = t * 1.0001
        return t

    def plain() -> None:
        region(x).sum().backward()

    def selective() -> None:
        checkpoint(region, x, use_reentrant=False, context_fn=selective_contexts).sum().backward()

    calls = OVERHEAD_CALLS // SELECTIVE_OPS

    def repeat(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                step()

        return run

    base = timed(repeat(plain), 1, device, world_size)
    under = timed(repeat(selective), 1, device, world_size)
    return max(under - base, 0.0) / (calls * SELECTIVE_OPS)


def busbw_points(points: list[CollectivePoint]) -> list[BusbwPoint]:
    return [BusbwPoint(op=p.op, size_bytes=p.size_bytes, busbw_gbps=p.busbw_gbps, time_s=p.time_s) for p in points]


def run_calibration(
    *, model: ModelConfig, options: CalibrateOptions, rank: int, world_size: int, device: torch.device, describe: DeviceDescription
) -> tuple[HardwareProfile, list[CollectivePoint]]:
    """The pool's profile and the collectives sweep's points (the same on every rank)."""
    matmul = measure_matmuls(model, options, device, world_size, describe)
    blocks = measure_blocks(model, options, device, world_size, describe)
    bandwidth = memory_bandwidth(device, world_size)
    overhead = op_overhead(device, world_size)
    dtensor = dtensor_overhead(device, world_size) if dist.is_initialized() else None
    selective = selective_overhead(device, world_size)
    from workers.harness.wrapped_blocks import measure_fsdp_overhead, measure_tp_blocks, measure_tp_roots

    tp_blocks = measure_tp_blocks(model, options, device, world_size, describe) if blocks else []
    tp_roots = measure_tp_roots(model, options, device, world_size, describe) if blocks else []
    fsdp = measure_fsdp_overhead(model, options, device, world_size) if blocks else []
    sweep: list[CollectivePoint] = []
    if world_size > 1 and options.ops:
        fields = CollectivesOptions.model_fields
        sweep = collectives.run_collectives(rank, world_size, device, CollectivesOptions(**{k: getattr(options, k) for k in fields}))
    profile = HardwareProfile(
        device=describe,
        world_size=world_size,
        matmul=matmul,
        memory_bandwidth=bandwidth,
        op_overhead_s=overhead,
        dtensor_op_overhead_s=dtensor,
        selective_op_overhead_s=selective,
        collectives=busbw_points(sweep),
        blocks=blocks,
        block_model=block_signature(model) if blocks else None,
        tp_blocks=tp_blocks,
        tp_roots=tp_roots,
        fsdp_overhead=fsdp,
    )
    return profile, sweep
