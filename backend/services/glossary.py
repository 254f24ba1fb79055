"""Every metric the pages show, in plain words: one source for the /glossary page (which the
pages' help icons link to) and for docs/glossary.md (`markdown()`; a test holds the file to it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    anchor: str
    name: str
    text: str


TERMS: tuple[Term, ...] = (
    Term(
        "tokens-per-s",
        "Throughput (tokens/s)",
        "Global tokens per optimizer step (global batch × sequence length) divided by the median step time of the timed "
        "steps. Warm-up and the profiled window are left out, so the profiler's overhead never lowers it. Higher is better.",
    ),
    Term(
        "step-time",
        "Step time (median, p90)",
        "Wall-clock time of one optimizer step (every micro-batch, the gradient synchronisation and the optimizer), measured "
        "between two device synchronisations. The median is the run's figure; p90 shows how steady it was.",
    ),
    Term(
        "mfu",
        "MFU (model FLOPs utilisation)",
        "Achieved FLOP/s over the device's peak dense bf16 FLOP/s. Achieved = model FLOPs per token (6·N + 12·L·H·Q·T, "
        "PaLM's appendix B) × tokens/s. Recomputed activations do not count, so recomputation lowers MFU. Empty on CPU, "
        "whose peak parallab does not know.",
    ),
    Term("tflops", "TFLOP/s", "The achieved model FLOP/s in units of 10¹², the numerator of MFU."),
    Term(
        "peak-memory",
        "Peak memory (allocated)",
        "The most memory the allocator held on a rank during the measured steps, parameters included: the CUDA "
        "allocator's peak on GPU, the profiler's allocated total on CPU. Shown for the busiest rank, in binary units (GiB).",
    ),
    Term(
        "peak-rss",
        "Peak RSS",
        "The most resident memory the rank's process used (the operating system's view): allocator, libraries, buffers.",
    ),
    Term(
        "model-state",
        "Model state (params, grads, optimizer)",
        "Bytes of parameters, gradients and optimizer state a rank holds, counted exactly from its own tensors (its shards "
        "under FSDP or TP). The prediction follows the ZeRO paper; the paper's tables state decimal GB (10⁹ bytes), "
        "parallab shows GiB (2³⁰).",
    ),
    Term(
        "activations",
        "Activations and temporaries",
        "Memory that the forward pass keeps for the backward pass (activations), and short-lived buffers (temporaries), at "
        "the rank's peak: MemTracker on CPU, the CUDA snapshot on GPU. Recomputation trades activations for time.",
    ),
    Term(
        "comm-fraction",
        "Communication share",
        "Time in collectives and point-to-point operations over the step time, on the busiest rank. Some of it may run "
        "while compute goes on (overlapped); it is the ceiling of what communication could cost.",
    ),
    Term(
        "exposed-comm",
        "Exposed communication",
        "Communication time that no compute on the same rank overlaps, over the step time: what the step would lose if "
        "communication were free. The number to cut; bigger buckets, prefetching or another layout lower it.",
    ),
    Term(
        "overlapped-comm",
        "Overlapped communication",
        "Communication that ran while the rank computed: it costs bandwidth but no step time. Drawn hatched under compute.",
    ),
    Term("compute", "Compute", "Time a rank spends in kernels of its own work: forward, backward, optimizer."),
    Term(
        "bubble",
        "Bubble / idle",
        "Time a rank waits with nothing to do. In a pipeline, the bubble is the stages' wait for micro-batches, theory "
        "(p−1)/(m+p−1) for p stages and m micro-batches; parallab measures it per stage and shows both.",
    ),
    Term(
        "imbalance",
        "Load imbalance (MoE)",
        "Tokens routed to the busiest expert over the mean per expert. 1.0 is perfect balance; the capacity factor drops "
        "tokens above the limit (dropped tokens).",
    ),
    Term(
        "busbw",
        "Bus bandwidth (busbw)",
        "Algorithm bandwidth (bytes / time) times a factor that makes collectives comparable with each other and with the "
        "link's speed: all-reduce 2(n−1)/n, all-gather and reduce-scatter (n−1)/n, all-to-all (n−1)/n, broadcast and "
        "point-to-point 1 (nccl-tests' definitions). In GB/s of 10⁹ bytes, as nccl-tests and the vendors state it.",
    ),
    Term("algbw", "Algorithm bandwidth (algbw)", "An operation's buffer bytes divided by its time, in GB/s of 10⁹ bytes."),
    Term(
        "buffer-bytes",
        "Communication per step (buffer bytes)",
        "Per op, the full buffer each rank passes: the buffer for all-reduce and broadcast, the gathered output for "
        "all-gather, the full input for reduce-scatter and all-to-all, the message for send/recv (nccl-tests' convention). "
        "Predicted beside measured.",
    ),
    Term(
        "wire-bytes",
        "Bytes on the wire",
        "What each rank actually sends over the links for those buffers with a ring algorithm: an all-reduce of B bytes "
        "sends 2(n−1)/n·B. This is what bandwidth limits.",
    ),
    Term(
        "loss-vs-reference",
        "Loss vs reference",
        "The largest relative difference between this run's loss and the single-process reference's, over the steps, "
        "for the same data and initial weights. Near zero means the layout trains the same model.",
    ),
    Term(
        "gradient-check",
        "Gradient check",
        "The first step's gradients of every parameter, against the single-process reference's, within a tolerance for "
        "the precision. It catches errors the loss cannot (a gradient scaled by a constant under AdamW).",
    ),
    Term(
        "flags",
        "Predicted vs measured (flags)",
        "Every prediction sits beside its measurement; a gap above 10% is flagged. A large gap usually means the planner's "
        "speeds are datasheet figures: calibrate the pool.",
    ),
    Term(
        "scaling-efficiency",
        "Scaling efficiency",
        "Measured tokens/s over ideal linear scaling from a baseline (the single-process run, or the strategy's smallest "
        "world size). The baseline itself has no efficiency: one world size has nothing to scale against.",
    ),
    Term(
        "phases",
        "Run phases",
        "What a running job does, in order: the gradient check's step, warm-up (untimed), the timed steps, the profiled "
        "window (traced, extra steps), the single-process reference (unless one is cached), the gradient comparison, "
        "and storing the result.",
    ),
)
"""The terms, in the order the glossary lists them."""


def markdown() -> str:
    """docs/glossary.md, from TERMS."""
    lines = [
        "# Glossary",
        "",
        "Every metric on parallab's pages, in plain words. The same text is the `/glossary` page that the pages'",
        "help icons (?) link to; this file is generated from `backend/services/glossary.py` (a test keeps them equal).",
        "",
    ]
    for term in TERMS:
        lines += [f'## {term.name} <a id="{term.anchor}"></a>', "", term.text, ""]
    return "\n".join(lines)
