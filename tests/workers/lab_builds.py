"""Entry points that break the module family's contract, each in its own way (put on the
allow-list by the tests, as a lab would put its module): the rank side must refuse each with an
error naming `workload.module` and what is wrong (the last four only when a pipeline cuts
them: their splits are wrong) — and one (`stores_its_head_count`) that no declaration check can
see, which tensor parallelism's gradient check must catch."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from examples.lab_model import Attention
from examples.lab_model import build as example


def returns_a_module_alone(cfg: Any) -> Any:
    return example(cfg)[0]


def returns_a_tensor_first(cfg: Any) -> Any:
    return torch.zeros(1), example(cfg)[1]


def declares_one_parameter_too_many(cfg: Any) -> Any:
    model, spec = example(cfg)
    return model, {**spec, "params": spec["params"] + 1}


def declares_missing_blocks(cfg: Any) -> Any:
    model, spec = example(cfg)
    return model, {**spec, "blocks": "layers"}


def declares_a_block_that_is_no_container(cfg: Any) -> Any:
    model, spec = example(cfg)
    return model, {**spec, "blocks": "norm"}


def declares_an_unknown_style(cfg: Any) -> Any:
    model, spec = example(cfg)
    return model, {**spec, "tp_plan": {"head": "diagonal"}}


def declares_a_missing_plan_path(cfg: Any) -> Any:
    model, spec = example(cfg)
    return model, {**spec, "block_tp_plan": {"attn.qkv": "colwise"}}


class Summed(nn.Module):
    """Returns one number per sequence, not logits."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(tokens).sum(dim=(1, 2))
        return out


def returns_no_logits(cfg: Any) -> Any:
    model, spec = example(cfg)
    return Summed(model), {**spec, "blocks": "inner.blocks", "tp_plan": {}, "first_stage": (), "last_stage": ()}


def counted(cfg: Any) -> Any:
    """No declared counts: the parameters are counted, FLOPs are 6·Ψ."""
    model, spec = example(cfg)
    return model, {"blocks": spec["blocks"]}


def declares_a_rowwise_layer_colwise(cfg: Any) -> Any:
    """The MLP's down projection declared colwise: the pair has no end, its output would stay sharded."""
    model, spec = example(cfg)
    return model, {**spec, "block_tp_plan": {**spec["block_tp_plan"], "mlp.proj": "colwise"}}


def declares_a_norm_colwise(cfg: Any) -> Any:
    model, spec = example(cfg)
    return model, {**spec, "tp_plan": {**spec["tp_plan"], "norm": "colwise"}}


class StoredHeads(Attention):
    """The example's attention reshaped by a head count stored at construction: right on one rank;
    under tensor parallelism its column shard holds heads/tp heads, which this splits into `heads`
    narrower ones — it runs, and computes something else."""

    heads: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b, t, self.heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        result: torch.Tensor = self.o(out.transpose(1, 2).reshape(b, t, -1))
        return result


def stores_its_head_count(cfg: Any) -> Any:
    """The example with `StoredHeads` attention (the same parameters, the same numbers on one rank)."""
    model, spec = example(cfg)
    for block in model.blocks.values():
        block.attn.__class__ = StoredHeads
        block.attn.heads = cfg.num_heads
    return model, spec


def declares_no_last_stage(cfg: Any) -> Any:
    """Builds and trains unsplit; a pipeline cannot tell which modules the last stage keeps."""
    model, spec = example(cfg)
    return model, {**spec, "last_stage": ()}


def leaves_positions_off_the_first_stage(cfg: Any) -> Any:
    """The position table in no end: every stage would keep a copy of it."""
    model, spec = example(cfg)
    return model, {**spec, "first_stage": ("tok",)}


def keeps_its_blocks_in_a_list(cfg: Any) -> Any:
    """Blocks in a ModuleList: a stage that dropped the first ones would renumber the rest."""
    model, spec = example(cfg)
    model.blocks = nn.ModuleList(model.blocks.values())
    return model, spec


def ties_its_head_to_the_embedding(cfg: Any) -> Any:
    """One matrix on the first stage's embedding and the last stage's head."""
    model, spec = example(cfg)
    model.head.weight = model.tok.weight
    return model, {**spec, "params": None}


def scales_its_logits_on_rank_one(cfg: Any) -> Any:
    """A fault no declaration check can see: under data parallelism rank 1's logits are 1.5× the
    model's, so its gradients are not the batch's — the gradient check must fail (and `parallab
    bench` must say so and exit non-zero)."""
    model, spec = example(cfg)
    forward = model.forward

    def skewed(tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = forward(tokens)
        return out * 1.5 if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1 else out

    model.forward = skewed  # type: ignore[method-assign]
    return model, spec


KEPT: list[torch.Tensor] = []
"""The extra copies `keeps_a_copy_of_each_activation` holds until the next step's forward."""


def keeps_a_copy_of_each_activation(cfg: Any) -> Any:
    """The example, but each block keeps a copy of its output until the next step: a memory
    mutation the timeline must show as activations, made in that block's forward."""
    model, spec = example(cfg)
    model.register_forward_pre_hook(lambda _m, _a: KEPT.clear())
    for block in model.blocks.values():
        block.register_forward_hook(lambda _m, _a, out: KEPT.append(out.detach().clone()))
    return model, spec
