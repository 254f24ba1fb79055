"""The `collectives` job kind: an nccl-tests-style sweep of the interconnect itself.

For each op and each message size (doubling from `min_bytes` to `max_bytes`), `warmup_iters`
untimed then `iters` timed calls between barriers; the time of a size is the slowest rank's mean
per call (every rank reports the same point). Sizes follow nccl-tests' buffer convention — the
buffer for all_reduce and broadcast, the gathered output for all_gather, the full input for
reduce_scatter and all_to_all, the message for send_recv (each rank sends to the next and
receives from the previous at once) — and algbw = size / time, busbw = algbw × nccl-tests' factor.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from parallab.core.metrics import bandwidths_gbps
from parallab.core.result import CollectivePoint
from parallab.core.strategies.collectives import CollectivesOptions

DTYPE = torch.float32


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, 2·min_bytes, ... up to max_bytes (inclusive when it lands on it)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def _op(name: str, size_bytes: int, rank: int, world: int, device: torch.device) -> tuple[Callable[[], None], int]:
    """A closure running one call of `name` on buffers for `size_bytes`, and the size it really uses."""
    elem = torch.tensor([], dtype=DTYPE).element_size()
    numel = max(size_bytes // elem // world, 1) * world  # divisible by the world for the split ops
    buf = torch.ones(numel, dtype=DTYPE, device=device)
    if name == "all_reduce":
        return (lambda: dist.all_reduce(buf)), numel * elem
    if name == "broadcast":
        return (lambda: dist.broadcast(buf, src=0)), numel * elem
    if name == "all_gather":
        shard = torch.ones(numel // world, dtype=DTYPE, device=device)
        return (lambda: dist.all_gather_into_tensor(buf, shard)), numel * elem
    if name == "reduce_scatter":
        shard = torch.empty(numel // world, dtype=DTYPE, device=device)
        return (lambda: dist.reduce_scatter_tensor(shard, buf)), numel * elem
    if name == "all_to_all":
        out = torch.empty_like(buf)
        return (lambda: dist.all_to_all_single(out, buf)), numel * elem
    if name == "send_recv":
        inbox = torch.empty_like(buf)

        def send_recv() -> None:
            ops = [dist.P2POp(dist.isend, buf, (rank + 1) % world), dist.P2POp(dist.irecv, inbox, (rank - 1) % world)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return send_recv, numel * elem
    raise ValueError(f"unknown collective {name!r}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_collectives(rank: int, world_size: int, device: torch.device, options: CollectivesOptions) -> list[CollectivePoint]:
    """Sweep every op over every size; one point per (op, size), the same on every rank."""
    device = torch.device(device)
    points: list[CollectivePoint] = []
    for name in options.ops:
        for size in sizes(options.min_bytes, options.max_bytes):
            call, nbytes = _op(name, size, rank, world_size, device)
            for _ in range(options.warmup_iters):
                call()
            _sync(device)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(options.iters):
                call()
            _sync(device)
            elapsed = torch.tensor([(time.perf_counter() - start) / options.iters], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            seconds = float(elapsed.item())
            algbw, busbw = bandwidths_gbps(name, nbytes, seconds, world_size)
            points.append(CollectivePoint(op=name, size_bytes=nbytes, time_s=seconds, algbw_gbps=algbw or 0.0, busbw_gbps=busbw or 0.0))
    return points
