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
- pp: the last micro-batch of each step dropped (its loss, and so its gradients, zeroed).

Faults that only a copy on another rank shows — what the replica check
(`workers.harness.replicas`, its step-0 scan of the synced gradients) is for — run as their own
cases (`REPLICA_CASES`), each with a mutant:

- ddp_unreduced: rank 1 keeps its own, never all-reduced, gradient of one weight;
- tp_norm: a replicated norm of sequence-parallel TP whose gradient is reduced on rank 0 only
  (rank 1 keeps its own partial one).

Every check's verdict, worst parameter and error go to --out as JSON from rank 0 (the replica
check's beside the gradient check's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

from parallab.core.jobs import ResolvedJob
from parallab.core.reference import reference_key
from tests.workers.conftest import make_job
from tests.workers.driver_context import finish, gloo_context, start
from workers import strategies
from workers.harness import gradcheck, replicas
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


class KeepLocal(Wrapped):
    """Wraps a strategy: rank 1 keeps its own gradient of `param` — what its backward produced before
    any reduction (a tensor hook sees it first) — in place of the synced one."""

    def __init__(self, inner: Strategy[Any, Any], applied: Applied, ctx: RunContext, param: str):
        super().__init__(inner)
        self.rank = ctx.rank
        self.param = next(p for n, p in applied.model.named_parameters() if gradcheck.canonical(n) == param)
        self.local: torch.Tensor | None = None
        self.param.register_hook(self._keep)

    def _keep(self, grad: torch.Tensor) -> None:
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        self.local = local.detach().clone()

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        grad = self.param.grad
        if self.rank == 1 and grad is not None and self.local is not None:
            (grad.to_local() if isinstance(grad, DTensor) else grad).copy_(self.local)


def drop_microbatch(applied: Applied, ctx: RunContext, strategy: Strategy[Any, Any]) -> Strategy[Any, Any]:
    """The pipeline's last stage zeroes the loss of each step's last micro-batch: its gradients never count."""
    schedule = applied.schedule  # type: ignore[attr-defined]
    loss_fn, calls = schedule._loss_fn, [0]
    m = schedule._n_microbatches

    def dropping(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        loss = loss_fn(output, target)
        return loss * 0.0 if calls[0] % m == 0 else loss

    schedule._loss_fn = dropping
    return strategy


class ReduceOnRankZero(Wrapped):
    """Wraps sequence-parallel TP: `param`'s gradient (a pending sum over the TP ranks) is reduced,
    but only rank 0 keeps the sum — rank 1 keeps its own part, both then held as replicated copies.
    It takes the place of the strategy's own reduction of that gradient (`lay_out_grads` skips a
    gradient already laid out like its parameter)."""

    def __init__(self, inner: Strategy[Any, Any], param: str):
        super().__init__(inner)
        self.param = param

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        p = dict((gradcheck.canonical(n), q) for n, q in applied.model.named_parameters())[self.param]
        grad = p.grad
        assert isinstance(grad, DTensor), f"{self.param} is not a DTensor"
        whole = grad.full_tensor()
        local = whole if ctx.rank == 0 else grad.to_local()
        p.grad = DTensor.from_local(local.clone(), grad.device_mesh, [Replicate()], run_check=False)
        self.inner.sync_grads(applied, ctx, options)


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
    "pp": drop_microbatch,
}
REPLICA_CASES: dict[str, tuple[str, dict[str, Any], Mutant]] = {
    "ddp_unreduced": ("ddp", {}, lambda applied, ctx, s: KeepLocal(s, applied, ctx, "layers.0.feed_forward.w1.weight")),  # type: ignore[dict-item]
    "tp_norm": ("tp", {"sequence_parallel": True}, lambda applied, ctx, s: ReduceOnRankZero(s, "layers.0.ffn_norm.weight")),  # type: ignore[dict-item]
}


def check(job: ResolvedJob, ctx: RunContext, reference: gradcheck.Gradients | None, mutant: Mutant | None) -> dict[str, Any] | None:
    strategy = strategies.get(job.strategy)
    applied = strategy.apply(new_model(job), ctx, job.options)
    if mutant is not None:
        strategy = mutant(applied, ctx, strategy)
    tol = gradcheck.tolerance(job.workload.precision)
    scans: list[replicas.Scan] = []
    grads = gradcheck.strategy_gradients(
        applied,
        strategy,
        job.options,
        ctx,
        job,
        on_synced=lambda model: scans.append(replicas.scan(model, ctx, of="step-0 gradients", grads=True, tol=tol)),
    )
    if grads is None or reference is None:
        return None
    result = gradcheck.compare(grads, reference, tol=tol)
    copies = replicas.verdict(scans, tol=tol)
    return {**result.model_dump(exclude={"per_param", "method"}), "replicas": copies.model_dump(exclude={"method"})}


def main() -> None:
    out = start()
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
    for case, (name, options, mutant) in REPLICA_CASES.items():
        job = make_job(name, 2, options, trace=False)
        ctx = gloo_context(job)
        key = reference_key(job)
        if ctx.rank == 0 and key not in references:
            references[key] = reference_gradients(job, ctx)
        reference = references.get(key)
        results[case] = {"unbroken": check(job, ctx, reference, None), "broken": check(job, ctx, reference, mutant)}
    finish(results, out)


if __name__ == "__main__":
    main()
