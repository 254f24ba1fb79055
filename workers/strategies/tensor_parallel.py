"""The tp dimension (the `tp` preset, and every layout with tp; `compose` applies it): Megatron
tensor parallelism with `torch.distributed.tensor.parallel`, on the plan the
model family declares (`parallab.core.families`: module path → style name; `style` turns a name
into torch's style) — or, for a lab's own module, the plan its spec declares (`Transformer.tp_plan`).
For the `parallab` family, per block: wq/wk/wv column-parallel (each rank
holds heads/tp whole heads and kv_heads/tp K/V heads — `Attention` infers its local head counts
from the projections' widths), wo row-parallel; w1/w3 column-parallel, w2
row-parallel, and each attention and MLP block's input is prepared once (PrepareModuleInput). So
a block costs Megatron's 4 all-reduces of (b, s, h): one after the attention and one after the
MLP forward, one at each block's input backward. The embedding is row-parallel over the
vocabulary, the LM head column-parallel with its logits gathered (replicated) so the loss is the
plain cross-entropy on every rank.

`sequence_parallel`: the residual stream and the norms are sharded over the sequence
(SequenceParallel on norms); each all-reduce becomes a reduce-scatter (row-parallel output
Shard(1)) plus an all-gather before the next column-parallel input (PrepareModuleInput).
Every tp rank of a data-parallel group sees the group's whole rows (tp splits no batch).

After the last backward of a step, `lay_out_grads` lays every gradient out like its parameter,
as Megatron's plan has it: the vocab-parallel embedding's gradient comes back from DTensor's
embedding backward replicated (the whole V×h on every rank) and keeps only this rank's rows (a
local slice, no communication); under SP the norms' gradients are partial sums over the
sequence shards and are all-reduced over tp (Korthikanti et al. 2022), one call per norm.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from parallab.core.model import ModelConfig
from workers.harness.model import Transformer


def _inputs(module: nn.Module) -> int:
    """How many positional inputs the module's forward takes (PrepareModuleInput lays out each)."""
    return len(inspect.signature(module.forward).parameters)


class _ReduceRotaryKeyGradient(torch.autograd.Function):
    """Identity forward; backward all-reduces the last `width` columns of the gradient over `group`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, width: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.width, ctx.group = width, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.clone()
        key = grad[..., -ctx.width :].contiguous()
        dist.all_reduce(key, group=ctx.group)
        grad[..., -ctx.width :] = key
        return grad, None, None


class RotaryKeyGradient(ParallelStyle):
    """Multi-head latent attention's kv_a_proj_with_mqa, whole on every tp rank: its output ends in
    the rotary key all heads share (`width` columns), which each rank's own heads read, so that
    part of its gradient is a partial sum over the ranks and is all-reduced as it leaves; the
    latent part arrives whole (kv_b_proj, column-parallel, all-reduced its input gradient)."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group, width = device_mesh.get_group(), self.width

        def reduce_key(_: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = _ReduceRotaryKeyGradient.apply(output, width, group)
            return out

        module.register_forward_hook(reduce_key)
        return module


def style(name: str, module: nn.Module, *, cfg: ModelConfig, residual: Placement, sequence_parallel: bool) -> ParallelStyle | None:
    """torch's parallel style for one of the family's style names (`parallab.core.families.base.TPStyle`)
    on `module` of a model of shape `cfg`; None: nothing to do (a norm without sequence parallelism)."""
    if name == "colwise":
        return ColwiseParallel(use_local_output=True)
    if name == "rowwise":
        return RowwiseParallel(output_layouts=residual)
    if name == "embedding":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if name == "head":
        return ColwiseParallel(input_layouts=residual, output_layouts=Replicate(), use_local_output=True)
    if name == "input":
        # One input preparation per attention block and one per MLP block (torchtitan's Llama plan):
        # the block's input becomes a replicated DTensor once, and wq/wk/wv (w1/w3) all read that
        # same DTensor, so their input gradients add up as one Partial DTensor and are all-reduced
        # once, in this preparation's backward. Without it each column-parallel linear would wrap
        # the plain input on its own and all-reduce its own input gradient (3 + 2 per block).
        # With SP the preparation also all-gathers the sequence (its backward reduce-scatters).
        rest = (None,) * (_inputs(module) - 1)
        return PrepareModuleInput(input_layouts=(residual, *rest), desired_input_layouts=(Replicate(), *rest))
    if name == "input_kwarg":  # the same preparation, for a module called with hidden_states=... (Hugging Face's attention)
        return PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": residual}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        )
    if name == "norm":
        return SequenceParallel() if sequence_parallel else None
    if name == "rotary_key":
        return RotaryKeyGradient(cfg.qk_rope_head_dim)
    raise ValueError(f"unknown tensor-parallel style {name!r}")


def _apply(
    root: nn.Module, plan: Mapping[str, str], mesh: DeviceMesh, *, cfg: ModelConfig, residual: Placement, sequence_parallel: bool
) -> None:
    styles = {
        path: style(name, root.get_submodule(path), cfg=cfg, residual=residual, sequence_parallel=sequence_parallel)
        for path, name in plan.items()
    }
    parallelize_module(root, mesh, {path: s for path, s in styles.items() if s is not None})


def _held(root: nn.Module, path: str) -> bool:
    """Whether every module on `path` is there (a pipeline stage sets the roots it lacks to None)."""
    module: nn.Module | None = root
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    return True


def parallelize(model: Transformer, mesh: DeviceMesh, *, sequence_parallel: bool) -> Transformer:
    """Apply the model's plan (`Transformer.tp_plan`: its family's, or a lab module's spec's) to
    `model` (root modules, then each block) on the 1-D `mesh`; a pipeline stage holds some of the
    root modules and some blocks: the plan covers what it holds."""
    plan = model.tp_plan()
    residual: Placement = Shard(1) if sequence_parallel else Replicate()
    root_plan = {path: name for path, name in plan.root.items() if _held(model, path)}
    _apply(model, root_plan, mesh, cfg=model.cfg, residual=residual, sequence_parallel=sequence_parallel)
    blocks = model.get_submodule(plan.blocks)
    assert isinstance(blocks, nn.ModuleDict | nn.ModuleList), "blocks are kept in a ModuleDict or a ModuleList"
    for key, block in blocks.named_children():  # keys "0".."L-1" either way (a pipeline stage keeps its blocks' keys)
        parallelize_block(block, plan.block(int(key)), mesh, cfg=model.cfg, sequence_parallel=sequence_parallel)
    return model


def parallelize_block(
    block: nn.Module, plan: Mapping[str, str], mesh: DeviceMesh, *, cfg: ModelConfig, sequence_parallel: bool
) -> nn.Module:
    """One block's part of the plan (`plan`: its paths → style names) on the 1-D `mesh`; the
    calibration times a block so (`workers.harness.wrapped_blocks`). Norms run on the sequence
    shard under SP (the attention's rotary tables are plain, full-sequence tensors)."""
    residual: Placement = Shard(1) if sequence_parallel else Replicate()
    _apply(block, plan, mesh, cfg=cfg, residual=residual, sequence_parallel=sequence_parallel)
    return block


def lay_out_grads(model: nn.Module) -> None:
    """Give every DTensor gradient its parameter's placements: a replicated gradient of a sharded
    weight (the vocab-parallel embedding's) keeps this rank's shard, a partial one (a norm's under
    SP) is all-reduced over its mesh. Without it the embedding's gradient stays V×h on every rank
    and the norms' partial sums reach the optimizer unreduced."""
    with torch.no_grad():
        for p in model.parameters():
            if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
