"""The calibrate job's blocks as the wrapped strategies run them: under the tp plan, and under FSDP2.

On CPU ranks a block wrapped by tensor parallelism or FSDP2 costs far more than its GEMMs split and
its collectives: every op on a DTensor pays sharding propagation and Python dispatch (the norms'
too under sequence parallelism, and again under selective recomputation's mode), and FSDP2 copies
parameters into and out of each all-gather, copies gradients into each reduce-scatter and lays the
shards out as DTensors, from Python hooks. Each is timed here on the workload's own block, every
rank at once, with the block's own collectives timed alone on the same groups and taken out — the
planner times those from the collectives sweep — so what is stored is the wrapping's cost:

- `measure_tp_blocks`: the block under the family's tp plan on a (world / tp, tp) mesh (the tp
  groups side by side, as a hybrid job runs them), per tp degree, sequence parallelism off and on,
  recomputation and the smallest token counts (`TpBlockPoint`).
- `measure_tp_roots`: the model's two ends (embedding, final norm, head, loss) under the same plan
  (`TpRootPoint`): the vocab-parallel embedding and the head run on DTensors too.
- `measure_fsdp_overhead`: the block under `fully_shard` over every rank, reshard after forward off
  and on, less the plain block and its all-gather(s) and reduce-scatter (`FsdpOverhead`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from parallab.core.costs import activation_dtype_bytes
from parallab.core.dims.base import residual_stream_bytes
from parallab.core.dims.tp import block_collectives, root_collectives
from parallab.core.families import family_of
from parallab.core.hardware import DeviceDescription, FsdpOverhead, TpBlockPoint, TpRootPoint, precision_problem
from parallab.core.model import ModelConfig
from parallab.core.strategies.calibrate import CalibrateOptions
from workers.harness.everyrank import BLOCK_RECOMPUTE, BLOCK_TOKEN_COUNTS, block_step, gemm_dtype, timed

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

COLLECTIVES = {
    "all_reduce": lambda buf, shard, group: dist.all_reduce(buf, group=group),
    "all_gather": lambda buf, shard, group: dist.all_gather_into_tensor(buf, shard, group=group),
    "reduce_scatter": lambda buf, shard, group: dist.reduce_scatter_tensor(shard, buf, group=group),
}
"""Each op on a buffer of nccl-tests' size (`buf`) and its 1/n shard, on `group`."""


def _wrappable(model: ModelConfig, world_size: int) -> bool:
    return model.family == "parallab" and not model.is_moe and not model.is_mla and world_size > 1 and dist.is_initialized()


def _collectives_seconds(calls: list[tuple[str, int, int]], group: dist.ProcessGroup, device: torch.device, world_size: int) -> float:
    """Seconds of `calls` ((op, bytes per call, calls)) on `group`, each timed alone, every rank at once."""
    n = dist.get_world_size(group)
    total = 0.0
    for op, nbytes, count in calls:
        buf = torch.zeros(max(nbytes // 4 // n, 1) * n, device=device)
        shard = torch.zeros(buf.numel() // n, device=device)
        total += count * timed(functools.partial(COLLECTIVES[op], buf, shard, group), 3, device, world_size)
    return total


def _token_counts(model: ModelConfig, options: CalibrateOptions) -> list[int]:
    return sorted(t for t in options.token_counts if t % model.seq_len == 0)[:BLOCK_TOKEN_COUNTS]


def _inputs(model: ModelConfig, tokens: int, device: torch.device, *, shards: int = 1) -> tuple[torch.Tensor, ...]:
    from workers.harness.model import rope_tables

    cos, sin = rope_tables(torch.arange(model.seq_len, device=device), model.head_width, model.rope_theta)
    x = torch.randn(tokens // model.seq_len, model.seq_len // shards, model.hidden_size, device=device, requires_grad=True)
    return x, torch.randn_like(x), cos, sin


def measure_tp_blocks(
    model: ModelConfig, options: CalibrateOptions, device: torch.device, world_size: int, describe: DeviceDescription
) -> list[TpBlockPoint]:
    """The block under each tp degree of `options.tp_degrees` that divides the ranks and the heads,
    sequence parallelism off and on, each recomputation, at the smallest token counts, in each
    precision the device supports (fp8's Float8 styles are not wired into the plan): seconds less
    its collectives (`block_collectives`) timed alone on the same tp groups."""
    if not _wrappable(model, world_size):
        return []
    from workers.harness.model import Block
    from workers.strategies.tensor_parallel import parallelize_block

    points = []
    plan = family_of(model).block_plan(model, 0)
    for tp, mesh, precision, sp in _tp_cases(model, options, device, world_size, describe):
        for recompute in BLOCK_RECOMPUTE:
            torch.manual_seed(0)
            block = Block(model, 0).to(device)
            block.recompute = recompute
            parallelize_block(block, plan, mesh, cfg=model, sequence_parallel=sp)
            for tokens in _token_counts(model, options):
                x, grad, cos, sin = _inputs(model, tokens, device, shards=tp if sp else 1)
                seconds = timed(functools.partial(block_step, block, x, grad, cos, sin, precision), 1, device, world_size)
                stream = residual_stream_bytes(precision, fsdp=False)
                calls = block_collectives(
                    tokens, model.hidden_size, act=activation_dtype_bytes(precision), stream=stream, sequence_parallel=sp
                )
                alone = _collectives_seconds(calls, mesh.get_group(), device, world_size)
                points.append(
                    TpBlockPoint(
                        tp=tp,
                        sequence_parallel=sp,
                        precision=precision,
                        recompute=recompute,
                        tokens=tokens,
                        seconds=max(seconds - alone, 0.0),
                    )
                )
    return points


def _tp_cases(
    model: ModelConfig, options: CalibrateOptions, device: torch.device, world_size: int, describe: DeviceDescription
) -> Iterator[tuple[int, DeviceMesh, str, bool]]:
    """(tp, its mesh, precision, sequence parallel) of every wrapped point the calibration times:
    each tp degree on a (world / tp, tp) mesh, each precision the device runs (fp8 is not timed
    wrapped), with and without sequence parallelism where the sequence splits over tp."""
    from torch.distributed.device_mesh import init_device_mesh

    for tp in _tp_degrees(model, options, world_size):
        mesh = init_device_mesh(device.type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))["tp"]
        for precision in options.precisions:
            if precision == "fp8" or precision_problem(precision, describe) is not None:
                continue
            for sp in (False, True):
                if not (sp and model.seq_len % tp):
                    yield tp, mesh, precision, sp


def measure_tp_roots(
    model: ModelConfig, options: CalibrateOptions, device: torch.device, world_size: int, describe: DeviceDescription
) -> list[TpRootPoint]:
    """The model without its blocks — the embedding, the final norm, the head and the loss — under the
    family's tp plan, for the degrees and sequence splits `measure_tp_blocks` times, at the smallest
    token counts, in each precision: seconds less its collectives (`root_collectives`) timed alone."""
    if not _wrappable(model, world_size):
        return []
    from torch import nn

    from workers.harness.model import Transformer
    from workers.strategies.tensor_parallel import parallelize

    points = []
    for tp, mesh, precision, sp in _tp_cases(model, options, device, world_size, describe):
        torch.manual_seed(0)
        root = Transformer(model)
        root.layers = nn.ModuleDict()
        parallelize(root.to(device), mesh, sequence_parallel=sp)
        for tokens in _token_counts(model, options):
            ids = torch.randint(0, model.vocab_size, (tokens // model.seq_len, model.seq_len), device=device)
            seconds = timed(functools.partial(root_step, root, ids, precision), 1, device, world_size)
            calls = root_collectives(
                tokens,
                model.hidden_size,
                model.vocab_size,
                act=activation_dtype_bytes(precision),
                stream=residual_stream_bytes(precision, fsdp=False),
                sequence_parallel=sp,
            )
            alone = _collectives_seconds(calls, mesh.get_group(), device, world_size)
            points.append(
                TpRootPoint(
                    tp=tp,
                    sequence_parallel=sp,
                    precision=precision,
                    vocab_size=model.vocab_size,
                    tokens=tokens,
                    seconds=max(seconds - alone, 0.0),
                )
            )
    return points


def root_step(root: torch.nn.Module, ids: torch.Tensor, precision: str) -> None:
    """The ends' forward to the loss and backward, as a training step runs them (autocast in 16 bits)."""
    root.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=gemm_dtype(precision), enabled=precision != "fp32"):
        loss = root(ids, labels=ids)
    loss.backward()


def _tp_degrees(model: ModelConfig, options: CalibrateOptions, world_size: int) -> list[int]:
    """The tp degrees of `options` the ranks and the model's heads, K/V heads and MLP split evenly."""
    return sorted(
        t
        for t in set(options.tp_degrees)
        if 1 < t <= world_size and world_size % t == 0 and not (model.num_heads % t or model.kv_heads % t or model.ffn_hidden_size % t)
    )


def measure_fsdp_overhead(model: ModelConfig, options: CalibrateOptions, device: torch.device, world_size: int) -> list[FsdpOverhead]:
    """FSDP2's own cost per group and micro-step, reshard after forward off and on: the block under
    `fully_shard` over every rank, forward and backward in fp32 at the smallest token count, less
    the same block unwrapped and less its all-gather (two when resharding) and reduce-scatter of
    the dim-0 padded parameters timed alone."""
    if not _wrappable(model, world_size):
        return []
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from workers.harness.model import Block

    mesh = init_device_mesh(device.type, (world_size,))
    tokens = _token_counts(model, options)[:1] or [model.seq_len]
    out = []
    for reshard in (False, True):
        torch.manual_seed(0)
        block = Block(model, 0).to(device)
        x, grad, cos, sin = _inputs(model, tokens[0], device)
        plain = timed(functools.partial(block_step, block, x, grad, cos, sin, "fp32"), 1, device, world_size)
        padded = sum(-(-p.shape[0] // world_size) * world_size * p[0].numel() for p in block.parameters()) * 4
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        wrapped = timed(functools.partial(block_step, block, x, grad, cos, sin, "fp32"), 1, device, world_size)
        calls = [("all_gather", padded, 2 if reshard else 1), ("reduce_scatter", padded, 1)]
        alone = _collectives_seconds(calls, mesh.get_group(), device, world_size)
        out.append(FsdpOverhead(reshard_after_forward=reshard, seconds=max(wrapped - plain - alone, 0.0)))
    return out
