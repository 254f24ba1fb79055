"""torchrun script (not a test module): the gradient check against strategies broken on purpose.

Launched once by test_gradcheck.py at 2 ranks. For each strategy it builds the test job's model,
applies the strategy as a run does, and runs the check's own code (`workers.harness.gradcheck`:
step 0's forward, backward and sync, whole gradients on rank 0, compared with the fp32 `single`
reference of `workers.harness.main.reference_gradients`) twice: on the strategy as it is, and on
a mutant with one realistic fault injected here and nowhere else:

- ddp: a comm hook that sums the gradient buckets instead of averaging them (missing 1/N);
- fsdp: every reduce-scattered gradient shard multiplied by N (a sum, missing 1/N);
- tp: rank 1's shard of one column-parallel weight gradient dropped (zeroed);
- ring: `sync_grads` all-reduces without the 1/ring scale (missing 1/N);
- moe: expert gradients not divided by the EP size (missing 1/N on experts only);
- pp (unbroken only): stage gradients sent to rank 0 by name.

Every check's verdict, worst parameter and error go to --out as JSON from rank 0.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from parallab.core.jobs import ResolvedJob
from parallab.core.reference import reference_key
from tests.workers.conftest import make_job
from tests.workers.driver_context import gloo_context
from workers import strategies
from workers.harness import gradcheck
from workers.harness.main import new_model, reference_gradients
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy, flat_all_reduce_
from workers.strategies.expert_parallel import _is_expert

Mutant = Callable[[Applied, RunContext, Strategy[Any, Any]], Strategy[Any, Any]]


def _sum_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-reduce SUM with no division by the world size."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()  # type: ignore[union-attr]
    return fut.then(lambda f: f.value()[0])


# DDP checks the hook's annotations as objects; this module's are strings (postponed evaluation).
_sum_hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def ddp_mutant(applied: Applied, ctx: RunContext, strategy: Strategy[Any, Any]) -> Strategy[Any, Any]:
    applied.model.register_comm_hook(None, _sum_hook)  # type: ignore[operator]
    return strategy


class Wrapped:
    """A strategy that delegates everything to `inner` but what a subclass overrides (a mutant's sync)."""

    def __init__(self, inner: Strategy[Any, Any]):
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class ShardSum(Wrapped):
    """Wraps a strategy: after its sync, every sharded gradient is N times its mean — a reduce-scatter
    that sums (FSDP2's own divide factor needs ReduceOp.PREMUL_SUM, which gloo lacks)."""

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        for p in applied.model.parameters():
            if isinstance(p.grad, DTensor):
                p.grad.to_local().mul_(ctx.world_size)


class DropShard(Wrapped):
    """Wraps a strategy: after its sync, rank 1 loses its shard of `param`'s gradient."""

    def __init__(self, inner: Strategy[Any, Any], param: str):
        super().__init__(inner)
        self.param = param

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        grad = dict(applied.model.named_parameters())[self.param].grad
        assert isinstance(grad, DTensor), f"{self.param} is not sharded"
        if ctx.rank == 1:
            grad.to_local().zero_()


class RingSum(Wrapped):
    """Ring attention whose gradient all-reduce forgets the 1/ring scale."""

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        grads = [p.grad for p in applied.model.parameters() if p.grad is not None]
        flat_all_reduce_(grads, ctx.mesh_dim("cp").get_group(), scale=1.0)


class MoESum(Wrapped):
    """Expert parallelism that averages the replicated gradients but not the experts'."""

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        ep = ctx.mesh_dim("ep")
        params, expert = list(applied.model.parameters()), _is_expert(applied.model)
        flat_all_reduce_([p.grad for p in params if p.grad is not None and not expert[id(p)]], ep.get_group(), scale=1.0 / ep.size())


MUTANTS: dict[str, Mutant | None] = {
    "ddp": ddp_mutant,
    "fsdp": lambda applied, ctx, s: ShardSum(s),  # type: ignore[return-value]
    "tp": lambda applied, ctx, s: DropShard(s, "layers.0.feed_forward.w1.weight"),  # type: ignore[return-value]
    "ring": lambda applied, ctx, s: RingSum(s),  # type: ignore[return-value]
    "moe": lambda applied, ctx, s: MoESum(s),  # type: ignore[return-value]
    "pp": None,
}


def check(job: ResolvedJob, ctx: RunContext, reference: gradcheck.Gradients | None, mutant: Mutant | None) -> dict[str, Any] | None:
    strategy = strategies.get(job.strategy)
    applied = strategy.apply(new_model(job), ctx, job.options)
    if mutant is not None:
        strategy = mutant(applied, ctx, strategy)
    grads = gradcheck.strategy_gradients(applied, strategy, job.options, ctx, job)
    if grads is None or reference is None:
        return None
    result = gradcheck.compare(grads, reference, tol=gradcheck.tolerance(job.workload.precision))
    return result.model_dump(exclude={"per_param", "method"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results: dict[str, dict[str, Any]] = {}
    references: dict[str, gradcheck.Gradients] = {}
    for name, mutant in MUTANTS.items():
        job = make_job(name, 2, trace=False)
        ctx = gloo_context(job)
        key = reference_key(job)
        if ctx.rank == 0 and key not in references:
            references[key] = reference_gradients(job, ctx)
        reference = references.get(key)
        results[name] = {"unbroken": check(job, ctx, reference, None)}
        if mutant is not None:
            results[name]["broken"] = check(job, ctx, reference, mutant)
    if dist.get_rank() == 0:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
