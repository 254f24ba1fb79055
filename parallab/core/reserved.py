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
  beside its kept output (12 B per vocabulary entry and token with the output; V/tp wide under
  loss parallel, as the prediction's gradient is) — the loss runs uncompiled, and the 16-bit copy
  of the gradient the head's matmul reads comes after nll_loss's gradient is freed (6 B, lower).
- FSDP buffers: FSDP2 holds a block's gathered parameters while the next is prefetched (2 × the
  block's parameters in the gathered dtype) and the fp32 reduce-scatter input of the block being
  reduced and of the one in flight (2 × 4 B), per the FSDP paper's (Zhao et al. 2023, §3.3)
  rate limiter of two in-flight all-gathers.
- budget: the device's memory less `allocator.context_bytes` (the CUDA context, cuBLAS workspaces
  and NCCL's buffers, which the allocator does not see).
- allocator: reserved over allocated, × `allocator.reserved_over_allocated` (eager) or
  `reserved_over_allocated_compiled`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.costs import gathered_param_bytes
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
    head = acts["head"] + 2 * acts["logits_gradient"]  # log-softmax's backward: nll_loss's gradient and its own
    per_layer = param_counts(cfg).per_layer // tp
    fsdp = 2 * per_layer * gathered_param_bytes(wl.precision) + 2 * per_layer * 4 if dp_shard > 1 else 0
    allocated = state + blocks + head + fsdp
    share = profile.reserved_share(compiled)
    rows = [
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
            "formula": "head kept + 2 × fp32 logits' gradient (log-softmax's backward; V/tp under loss parallel)",
            "entry": "-",
        },
        {"name": "FSDP buffers", "bytes": int(fsdp), "formula": "2 × block params × gathered bytes + 2 × block params × 4 B", "entry": "-"},
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
