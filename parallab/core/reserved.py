"""Memory as the allocator sees it on a GPU with a device profile: the peak that
`torch.cuda.max_memory_reserved` reports (what torchtitan and most published runs print), by
category, each with its formula and the profile entry it used.

- model state: the prediction's params, grads and optimizer state of the rank (`prediction`).
- blocks' activations: the prediction's, × `allocator.compiled_activation_share` under
  torch.compile (the partitioner recomputes fused pointwise ops instead of keeping them), except
  under recomputation: full keeps only each block's input, and a selective policy's tags decide
  what a block keeps (AOTAutograd's partitioner saves what the policy marks MUST_SAVE, as eager
  does), so no fusion removes either.
- head and loss: the head's kept tensors (among them the fp32 log-softmax) and, at the peak,
  log-softmax's backward: nll_loss's dense fp32 gradient and log-softmax's own fp32 gradient
  beside its kept output (12 B per vocabulary entry and token with the output) — the loss runs
  uncompiled, and the 16-bit copy of the gradient the head's matmul reads comes after nll_loss's
  gradient is freed (6 B, lower). Under loss parallel (V/tp wide) torch's fused backward holds
  three fp32 tensors beside the output, 16 B (`activations.loss_backward_temporaries`). A
  compiled loss keeps the 16-bit logits and writes their 16-bit gradient beside them, 4 B.
- FSDP buffers: FSDP2 holds a block's gathered parameters while the next is prefetched (2 × the
  block's parameters in the gathered dtype) and the fp32 reduce-scatter input of the block being
  reduced and of the one in flight (2 × 4 B), per the FSDP paper's (Zhao et al. 2023, §3.3)
  rate limiter of two in-flight all-gathers.
- FSDP2 under a pipeline (pp > 1): the schedule runs every micro-batch's backward but the last
  with `set_reshard_after_backward(False)` and `set_requires_gradient_sync(False)` (torch's
  `PipelineStage.backward_maybe_with_nosync`; torchtitan also turns `reshard_after_forward` off
  under pp, `apply_fsdp` in parallelize_llama.py), so the rank holds its stages' parameters
  unsharded (the gathered dtype) from the first micro-batch to the last, and — with more than one
  micro-batch — their unsharded gradients, accumulated in the reduce dtype (fp32: FSDP2's
  `to_accumulated_grad_if_needed` upcasts each micro-batch's gradient), reduce-scattered only after
  the last micro-batch's backward. These replace the two blocks' gathered parameters above; the
  reduce-scatter inputs stay.
- budget: the device's memory less `allocator.context_bytes` (the CUDA context, cuBLAS workspaces
  and NCCL's buffers, which the allocator does not see).
- allocator: reserved over allocated, × `allocator.reserved_over_allocated` (eager) or
  `reserved_over_allocated_compiled`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.costs import gathered_param_bytes, state_bytes_per_param
from parallab.core.device_profile import DeviceProfile
from parallab.core.families import param_counts

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


def reserved_memory(job: ResolvedJob, prediction: dict[str, Any], profile: DeviceProfile) -> list[dict[str, Any]]:
    """The reserved peak of the busiest rank by category (module docstring); the last is the total."""
    wl, cfg = job.workload, job.model
    dims = job.degrees
    tp, dp_shard = dims["tp"], job.fsdp_shards
    compiled = bool(wl.compile)
    acts = prediction["activations"]
    state = sum(prediction["model_state_bytes_per_rank"].values())
    # under full recomputation a block keeps only its input, under a selective policy what the
    # policy tags: the partitioner removes neither
    shrink = compiled and wl.activation_checkpointing not in ("full", "selective")
    blocks = (acts["blocks"] + acts["weight_copies"]) * (profile.allocator.compiled_activation_share if shrink else 1.0)
    # the loss's backward: nll_loss's gradient and log-softmax's own, loss parallel's fused three,
    # or a compiled loss's one
    temporaries = int(acts.get("loss_backward_temporaries", 2))
    head = acts["head"] + temporaries * acts["logits_gradient"]
    per_layer = param_counts(cfg).per_layer // tp
    fsdp = 2 * per_layer * gathered_param_bytes(wl.precision) + 2 * per_layer * 4 if dp_shard > 1 else 0
    held = held_grads = 0
    pp, microbatches = dims["pp"], int(getattr(job.options, "microbatches", 1) or 1)
    if dp_shard > 1 and pp > 1:
        # the stage's parameters whole on the rank (its local elements × the shards), and their gradients
        unsharded = prediction["model_state_bytes_per_rank"]["params"] // state_bytes_per_param(wl.precision)[0] * dp_shard
        held = unsharded * gathered_param_bytes(wl.precision)
        held_grads = unsharded * 4 if microbatches > 1 else 0
        fsdp = 2 * per_layer * 4
    allocated = state + blocks + head + fsdp + held + held_grads
    share = profile.reserved_share(compiled)
    rows: list[dict[str, Any]] = [
        {"name": "model state", "bytes": int(state), "formula": "params + grads + optimizer (4+4+8 B per local parameter)", "entry": "-"},
        {
            "name": "blocks' activations",
            "bytes": int(blocks),
            "formula": "kept per block × blocks (+ one block's recompute)" + (" × compiled share" if shrink else ""),
            "entry": "allocator.compiled_activation_share" if shrink else "-",
        },
        {
            "name": "head and loss",
            "bytes": int(head),
            "formula": "head kept + 2 × fp32 logits' gradient (log-softmax's backward; 3 × and V/tp under loss parallel)"
            if temporaries != 1
            else "head kept (16-bit logits) + their 16-bit gradient (a compiled loss's fused backward)",
            "entry": "-",
        },
        {
            "name": "FSDP buffers",
            "bytes": int(fsdp),
            "formula": "2 × block params × 4 B (reduce-scatter inputs)" + (" + 2 × block params × gathered bytes" if not held else ""),
            "entry": "-",
        },
        *(
            [
                {
                    "name": "FSDP under pp: stage parameters held unsharded",
                    "bytes": int(held),
                    "formula": "stage params × gathered bytes (reshard after backward off until the last micro-batch)",
                    "entry": "-",
                },
                {
                    "name": "FSDP under pp: gradients held unsharded",
                    "bytes": int(held_grads),
                    "formula": "stage params × 4 B (fp32 reduce dtype; gradient sync off until the last micro-batch)",
                    "entry": "-",
                },
            ]
            if held
            else []
        ),
        {
            "name": "allocator reserve",
            "bytes": int(allocated * (share - 1)),
            "formula": f"allocated × ({share:.2f} − 1)",
            "entry": "allocator.reserved_over_allocated" + ("_compiled" if compiled else ""),
        },
    ]
    rows.append({"name": "reserved peak", "bytes": int(allocated * share), "formula": "sum", "entry": "-"})
    return rows


def reserved_budget(memory_bytes: int, profile: DeviceProfile) -> int:
    """What the allocator may reserve on one device (module docstring)."""
    return memory_bytes - profile.allocator.context_bytes
