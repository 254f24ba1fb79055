"""`tp`: Megatron tensor parallelism with `torch.distributed.tensor.parallel`.

Per block: wq/wk/wv column-parallel (each rank holds heads/tp whole heads — `Attention` infers its
local head count from the projection's width), wo row-parallel; w1/w3 column-parallel, w2
row-parallel, and each attention and MLP block's input is prepared once (PrepareModuleInput). So
a block costs Megatron's 4 all-reduces of (b, s, h): one after the attention and one after the
MLP forward, one at each block's input backward. The embedding is row-parallel over the
vocabulary, the LM head column-parallel with its logits gathered (replicated) so the loss is the
plain cross-entropy on every rank.

`sequence_parallel`: the residual stream and the norms are sharded over the sequence
(SequenceParallel on norms); each all-reduce becomes a reduce-scatter (row-parallel output
Shard(1)) plus an all-gather before the next column-parallel input (PrepareModuleInput).
Every rank sees the whole batch, so `local_batch` is the default (no "dp" dim on this mesh).
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from parallab.core.strategies.tp import TPOptions
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy


def parallelize(model: Transformer, mesh: DeviceMesh, *, sequence_parallel: bool) -> Transformer:
    """Apply the Megatron plan to `model` (embedding, blocks, head) on the 1-D `mesh`."""
    sp = sequence_parallel
    residual: Placement = Shard(1) if sp else Replicate()
    root_plan: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "output": ColwiseParallel(input_layouts=residual, output_layouts=Replicate(), use_local_output=True),
    }
    if sp:
        root_plan["norm"] = SequenceParallel()
    parallelize_module(model, mesh, root_plan)
    for block in model.layers.values():
        # One input preparation per attention block and one per MLP block (torchtitan's Llama plan):
        # the block's input becomes a replicated DTensor once, and wq/wk/wv (w1/w3) all read that
        # same DTensor, so their input gradients add up as one Partial DTensor and are all-reduced
        # once, in this preparation's backward. Without it each column-parallel linear would wrap
        # the plain input on its own and all-reduce its own input gradient (3 + 2 per block).
        # With SP the preparation also all-gathers the sequence (its backward reduce-scatters).
        plan: dict[str, ParallelStyle] = {
            "attention": PrepareModuleInput(input_layouts=(residual, None, None), desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(use_local_output=True),
            "attention.wk": ColwiseParallel(use_local_output=True),
            "attention.wv": ColwiseParallel(use_local_output=True),
            "attention.wo": RowwiseParallel(output_layouts=residual),
            "feed_forward": PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(use_local_output=True),
            "feed_forward.w3": ColwiseParallel(use_local_output=True),
            "feed_forward.w2": RowwiseParallel(output_layouts=residual),
        }
        if sp:
            # Norms run on the sequence shard (the attention's rotary tables are plain, full-sequence tensors).
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, mesh, plan)
    return model


class TensorParallel(Strategy[TPOptions, Applied]):
    name = "tp"

    def apply(self, model: Transformer, ctx: RunContext, options: TPOptions) -> Applied:
        model = model.to(ctx.device)
        return Applied(parallelize(model, ctx.mesh_dim("tp"), sequence_parallel=options.sequence_parallel))


STRATEGY = TensorParallel()
