"""torchrun script (not a test module): the gradient and replica checks against strategies broken on purpose.

Launched once at 2 ranks by test_gradcheck.py (the strategies) and once at 4 by
test_composed_mutants.py (the composed layouts of test_layouts.py): it runs the cases of the
world size it was launched at (`CASES`). For each it builds the test job's model, applies the
strategy as a run does, and runs the check's own code (`workers.harness.gradcheck`: step 0's
forward, backward and sync, whole gradients on rank 0, compared with the fp32 `single` reference
of `workers.harness.main.reference_gradients`; beside it the replica check,
`workers.harness.replicas`, its step-0 scan of the synced gradients) twice: on the strategy as it
is (once a job: ddp_unreduced's clean run is ddp's), and on a mutant with one realistic fault
injected here and nowhere else.

At 2 ranks:

- ddp: a comm hook that sums the gradient buckets instead of averaging them (missing 1/N);
- fsdp: the reduce-scatter summed (every shard N times the mean, missing 1/N);
- tp: rank 1's shard of one column-parallel weight gradient dropped (zeroed);
- tp_mla: tp on DeepSeek-V2's latent attention with the shared rotary key's gradient all-reduce
  dropped;
- tp_moe: tp on an MoE model, whose experts stay whole on each rank: the last MoE block's input
  gradient all-reduced over tp as a split MLP's would be (twice the true gradient upstream);
- ring: the ring's gradient all-reduce without the 1/ring scale (missing 1/N);
- moe: expert gradients not divided by the EP size (missing 1/N on experts only);
- pp: the last micro-batch of each step dropped (its loss, and so its gradients, zeroed);
- pp_interleaved (interleaved 1F1B, two chunks a rank): rank 0's second chunk (stage 2) left
  with twice its gradient (a chunk's loss share counted twice);

and faults that only a copy on another rank shows (what the replica check is for):

- ddp_unreduced: rank 1 keeps its own, never all-reduced, gradient of one weight;
- tp_norm: a replicated norm of sequence-parallel TP whose gradient is reduced on rank 0 only
  (rank 1 keeps its own partial one).

At 4 ranks, one fault in one dimension's reduction of each composed layout (`COMPOSED_MUTANTS`):
HSDP's replica all-reduce missing its 1/N on one replica only, a TP shard lost under FSDP, the
composer's flat all-reduce of replicas beside TP missing its 1/N, one pipeline stage's FSDP
reduce-scatter summed, TP's all-reduce of a block's input gradient skipped in a pipeline's
last stage (sequence-parallel norms, whose reduction the 2-rank tp_norm case breaks, are not
composed with pp), cp's all-reduce of the FSDP shards missing its 1/N on one cp rank only, and
the expert gradients beside FSDP left undivided by the EP size; and pp × tp on a lab's module
(the module family's example, cut by its spec and sharded by its plan) with its last block's
attention input gradient left unreduced.

Every check's verdict, worst parameter and error go to --out as JSON from rank 0 (the replica
check's beside the gradient check's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

from parallab.core.jobs import ResolvedJob
from parallab.core.reference import reference_key
from tests.core.hf_configs import TINY_DEEPSEEK_V2
from tests.workers.conftest import make_job
from tests.workers.driver_context import finish, gloo_context, start
from tests.workers.module_driver import MODULE_WORKLOAD
from tests.workers.test_layouts import LAYOUTS
from workers import strategies
from workers.harness import gradcheck, replicas
from workers.harness.main import new_model, reference_gradients
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy, local_grad
from workers.strategies.expert_parallel import _is_expert

Mutant = Callable[[Applied, RunContext, Strategy[Any, Any]], Any]
"""Injects a fault into an applied strategy; returns the strategy to run (itself, or a `Wrapped` one)."""


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


def at(ctx: RunContext, where: Mapping[str, int]) -> bool:
    """Whether this rank sits at every coordinate of `where` (mesh dim → index); `{}`: every rank."""
    return all(ctx.mesh_dim(dim).get_local_rank() == index for dim, index in where.items())


class Unscaled(Wrapped):
    """Wraps a strategy: after its sync, the ranks at `where` hold every gradient `dim`'s size times
    the mean — the reduction over `dim` summed where it should average (the missing 1/N of FSDP's
    reduce-scatter, HSDP's replica all-reduce or the composer's flat one). Multiplying afterwards
    gives the same numbers as a sum would (FSDP2's own divide factor needs ReduceOp.PREMUL_SUM,
    which gloo lacks) and breaks no collective: the other ranks keep the right mean."""

    def __init__(self, inner: Strategy[Any, Any], dim: str, where: Mapping[str, int] | None = None):
        super().__init__(inner)
        self.dim, self.where = dim, dict(where or {})

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        if not at(ctx, self.where):
            return
        size = ctx.mesh_dim(self.dim).size()
        for p in applied.model.parameters():
            if p.grad is not None:
                local_grad(p.grad).mul_(size)


class DropShard(Wrapped):
    """Wraps a strategy: after its sync, the ranks at `where` lose their shard of `param`'s gradient
    (the stages that do not hold `param` have nothing to lose)."""

    def __init__(self, inner: Strategy[Any, Any], param: str, where: Mapping[str, int]):
        super().__init__(inner)
        self.param, self.where = param, dict(where)

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        held = {gradcheck.canonical(n): p for n, p in applied.model.named_parameters()}
        if self.param not in held or not at(ctx, self.where):
            return
        grad = held[self.param].grad
        assert isinstance(grad, DTensor), f"{self.param} is not sharded"
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
        self.local = local_grad(grad).detach().clone()

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        grad = self.param.grad
        if self.rank == 1 and grad is not None and self.local is not None:
            local_grad(grad).copy_(self.local)


def drop_microbatch(applied: Applied, ctx: RunContext, strategy: Strategy[Any, Any]) -> Strategy[Any, Any]:
    """The pipeline's last stage zeroes the loss of each step's last micro-batch: its gradients never count."""
    schedule = applied.pipe.schedule  # type: ignore[attr-defined]
    loss_fn, calls = schedule._loss_fn, [0]
    m = schedule._n_microbatches

    def dropping(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        loss = loss_fn(output, target)
        return loss * 0.0 if calls[0] % m == 0 else loss

    schedule._loss_fn = dropping
    return strategy


class ChunkScaled(Wrapped):
    """Wraps a pipeline whose ranks hold several chunks: after its sync, pp rank 0's chunk
    `chunk` holds twice its gradient; every other chunk, and every other rank, is right."""

    def __init__(self, inner: Strategy[Any, Any], chunk: int):
        super().__init__(inner)
        self.chunk = chunk

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        if ctx.rank != 0:
            return
        for p in applied.model.chunks[self.chunk].parameters():  # type: ignore[union-attr,index]
            if p.grad is not None:
                local_grad(p.grad).mul_(2.0)


class Unreduced(torch.autograd.Function):
    """Identity forward; backward relabels a pending sum (Partial) as already reduced (Replicate)
    without reducing it, so the all-reduce that would have made it whole never runs."""

    @staticmethod
    def forward(ctx: Any, x: DTensor) -> DTensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: DTensor) -> DTensor:
        return DTensor.from_local(grad.to_local(), grad.device_mesh, [Replicate()] * grad.device_mesh.ndim, run_check=False)


def skip_input_reduce(module: str) -> Mutant:
    """TP's all-reduce of `module`'s input gradient skipped (by every tp rank, so no collective is
    left unpaired): each keeps its own heads' partial sum, and everything upstream — the norm before
    `module`, earlier blocks, a previous pipeline stage — trains on it. The stages that do not hold
    `module` run as they are."""

    def mutant(applied: Applied, ctx: RunContext, strategy: Strategy[Any, Any]) -> Strategy[Any, Any]:
        held = dict(applied.model.named_modules())
        if module in held:
            # After the input preparation's hook (registered first), which made the input a replicated DTensor.
            held[module].register_forward_pre_hook(lambda _, args: (Unreduced.apply(args[0]), *args[1:]))
        return strategy

    return mutant


class SummedOverTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the (already whole) gradient over the tp group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def moe_input_reduced(module: str) -> Mutant:
    """The MoE block `module` treated like a split MLP: its input gradient all-reduced over tp.
    Each tp rank computed the whole block, so that gradient was already whole: the sum doubles it,
    and everything upstream (the attention, the norms, earlier blocks, the embedding) trains on it."""

    def mutant(applied: Applied, ctx: RunContext, strategy: Strategy[Any, Any]) -> Strategy[Any, Any]:
        group = ctx.mesh_dim("tp").get_group()
        held = dict(applied.model.named_modules())
        held[module].register_forward_pre_hook(lambda _, args: (SummedOverTP.apply(args[0], group), *args[1:]))
        return strategy

    return mutant


def rotary_key_unreduced(applied: Applied, ctx: RunContext, strategy: Strategy[Any, Any]) -> Strategy[Any, Any]:
    """Multi-head latent attention under tp with the rotary key's gradient all-reduce dropped (the
    hook `RotaryKeyGradient` puts on kv_a_proj_with_mqa removed on every rank, so no collective is
    left unpaired): each rank's kv_a_proj_with_mqa, and everything upstream, trains on its own
    heads' part of that gradient."""
    for name, module in applied.model.named_modules():
        if name.endswith("kv_a_proj_with_mqa"):
            module._forward_hooks.clear()
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


class ExpertsSummed(Wrapped):
    """Wraps expert parallelism (alone or beside FSDP): after its sync the expert gradients hold ep
    times the mean — their division by the EP size forgotten — while the replicated gradients are
    averaged as they should be."""

    def sync_grads(self, applied: Applied, ctx: RunContext, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        size, expert = ctx.mesh_dim("ep").size(), _is_expert(applied.model)
        for p in applied.model.parameters():
            if p.grad is not None and expert[id(p)]:
                local_grad(p.grad).mul_(size)


@dataclass(frozen=True)
class Case:
    """One strategy and its options, checked as it is and with `mutant`'s fault injected."""

    strategy: str
    options: dict[str, Any]
    mutant: Mutant
    workload: dict[str, Any] = field(default_factory=dict)
    """On top of the test workload (a model with experts for ep)."""


W1 = "layers.0.feed_forward.w1.weight"
"""A column-parallel weight (of the first block)."""
STRATEGY_CASES: dict[str, Case] = {
    "ddp": Case("ddp", {}, ddp_mutant),
    "fsdp": Case("fsdp", {}, lambda applied, ctx, s: Unscaled(s, "dp_shard")),
    "tp": Case("tp", {}, lambda applied, ctx, s: DropShard(s, W1, where={"tp": 1})),
    "ring": Case("ring", {}, lambda applied, ctx, s: Unscaled(s, "cp")),
    "moe": Case("moe", {}, lambda applied, ctx, s: ExpertsSummed(s)),
    "pp": Case("pp", {}, drop_microbatch),
    "pp_interleaved": Case(
        "pp", {"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 4}, lambda applied, ctx, s: ChunkScaled(s, chunk=1)
    ),
    # Faults only another rank's copy shows.
    "ddp_unreduced": Case("ddp", {}, lambda applied, ctx, s: KeepLocal(s, applied, ctx, W1)),
    "tp_norm": Case("tp", {"sequence_parallel": True}, lambda applied, ctx, s: ReduceOnRankZero(s, "layers.0.ffn_norm.weight")),
    # tp on DeepSeek-V2's latent attention: the shared rotary key's gradient never all-reduced.
    "tp_mla": Case("tp", {}, rotary_key_unreduced, {"hf_config": TINY_DEEPSEEK_V2}),
    # tp on an MoE model (experts whole on each rank): the last MoE block's input gradient summed over tp.
    "tp_moe": Case("tp", {}, moe_input_reduced("layers.3.feed_forward"), {"num_experts": 4, "first_dense_layers": 1}),
}
COMPOSED_MUTANTS: dict[str, Mutant] = {
    # HSDP: replica 1's all-reduce over dp_replicate forgets its 1/dp_replicate; replica 0's is right.
    "dp_replicate×dp_shard": lambda applied, ctx, s: Unscaled(s, "dp_replicate", where={"dp_replicate": 1}),
    # FSDP over TP: tp rank 1's shard (on both FSDP ranks) of a column-parallel gradient lost.
    "dp_shard×tp": lambda applied, ctx, s: DropShard(s, W1, where={"tp": 1}),
    # Replicas beside tp: the composer's flat all-reduce over dp_replicate without its 1/N.
    "dp_replicate×tp": lambda applied, ctx, s: Unscaled(s, "dp_replicate"),
    # FSDP inside a pipeline: stage 0's reduce-scatter sums where it should average.
    "pp×dp_shard": lambda applied, ctx, s: Unscaled(s, "dp_shard", where={"pp": 0}),
    # TP inside a pipeline: the last block's attention input gradient never all-reduced over tp.
    "pp×tp": skip_input_reduce("layers.3.attention"),
    # cp beside FSDP: cp rank 1's all-reduce of the FSDP shards forgets its 1/cp; cp rank 0's is right.
    "cp×dp_shard": lambda applied, ctx, s: Unscaled(s, "cp", where={"cp": 1}),
    # ep beside FSDP: the expert shards left at ep times the mean.
    "ep×dp_shard": lambda applied, ctx, s: ExpertsSummed(s),
}
MODULE_PP_TP = "module pp×tp"
"""pp × tp on a lab's module (the module family's example: its spec's split and plan)."""
COMPOSED_CASES: dict[str, Case] = {
    key: Case(LAYOUTS[key][0], LAYOUTS[key][2], mutant, LAYOUTS[key][3]) for key, mutant in COMPOSED_MUTANTS.items()
} | {
    # The lab's module cut by its spec, its plan in each stage: block 1's attention input gradient never all-reduced over tp.
    MODULE_PP_TP: Case("layout", {"pp": 2, "tp": 2}, skip_input_reduce("lab.blocks.1.attn"), MODULE_WORKLOAD),
}
CASES: dict[int, dict[str, Case]] = {2: STRATEGY_CASES, 4: COMPOSED_CASES}
"""The cases of each world size the driver is launched at: the strategies at 2, the composed layouts at 4."""


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
    failing = sorted(name for name, err in result.per_param.items() if err > tol)
    return {**result.model_dump(exclude={"per_param", "method"}), "failing": failing, "replicas": copies.model_dump(exclude={"method"})}


def main() -> None:
    out = start()
    world = dist.get_world_size()
    results: dict[str, dict[str, Any]] = {}
    references: dict[str, gradcheck.Gradients] = {}
    unbroken: dict[str, dict[str, Any] | None] = {}
    """The clean check of each job, run once: cases that break the same job differently share it."""
    for name, case in CASES[world].items():
        job = make_job(case.strategy, world, case.options, case.workload, trace=False)
        ctx = gloo_context(job)
        key = reference_key(job)
        if ctx.rank == 0 and key not in references:
            references[key] = reference_gradients(job, ctx)
        reference = references.get(key)
        same = job.model_dump_json()
        if same not in unbroken:
            unbroken[same] = check(job, ctx, reference, None)
        results[name] = {"unbroken": unbroken[same], "broken": check(job, ctx, reference, case.mutant)}
    finish(results, out)


if __name__ == "__main__":
    main()
