"""Every metric the pages show, in plain words: one source for the /glossary page (which the
pages' help icons link to) and for docs/glossary.md (`markdown()`; a test holds the file to it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from parallab.core.stats import median_ranks, t_power

MEASURED_LOG_SPREAD = 0.262
"""The standard deviation of log(median step time) between runs of one configuration measured on
a shared 2-core host (benchmarks/run_to_run_spread.json, 12 runs of 100 steps): the spread the
verdict's power is stated at, and the simulation test's."""

_MEDIAN_COVERAGE = ", ".join(f"{n}: {median_ranks(n)[2]:.1%}" for n in range(2, 11))
_T_COVERAGE = ", ".join(f"{n}: 95%" for n in range(2, 11))
_POWER = ", ".join(f"{n}: {t_power(math.log(1.5), MEASURED_LOG_SPREAD, n):.0%}" for n in range(2, 11))


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
        "samples-per-s",
        "Samples/s",
        "Sequences per second: the global batch (sequences per optimizer step) divided by the same median step time as "
        "tokens/s, so tokens/s = samples/s × sequence length. Higher is better.",
    ),
    Term(
        "peak-memory",
        "Peak memory (allocated)",
        "The most memory the allocator held on a rank during the measured steps, parameters included: the CUDA "
        "allocator's peak on GPU, the profiler's allocated total on CPU. Shown for the busiest rank, in binary units (GiB). "
        "On GPU the card also gives what the caching allocator reserved from the device (allocated plus its cached, "
        "unused blocks): what another process on that GPU could not have.",
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
        "communication were free. The number to cut; bigger buckets, prefetching or another layout lower it. On a "
        "pipeline stage it includes a receive waiting for the previous stage (as HTA counts it): the bubble, measured "
        "apart from the schedule's actions, says how much of the step is that wait.",
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
        "(p−1)/(m+p−1) for p stages and m micro-batches (GPipe, 1F1B), (p−1)/(v·m+p−1) for interleaved 1F1B with v "
        "stages a rank; parallab measures it per rank (all its stages together) and shows both.",
    ),
    Term(
        "stage-imbalance",
        "Stage imbalance (pipeline)",
        "How much longer the busiest pipeline stage works than the average stage, apart from the bubble: each stage's busy "
        "time (the time some action of its runs, within each profiled step's window) summed over the profiled steps, then "
        "the busiest stage's over the mean of the stages, less 1. 0 means every stage carries the same work; the last "
        "stage, which also holds the head and the loss, is usually the busiest.",
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
        "the precision. It catches errors the loss cannot (a gradient scaled by a constant under AdamW). For an MoE "
        "model the fp32 reference takes the experts the run's ranks chose (except under a pipeline or context "
        "parallelism), so a token whose top-k flips under 16-bit rounding is not counted as a gradient error. A 16-bit "
        "run's tolerance is twice its format's own noise on the workload (single in that precision against fp32), never "
        "above the flat bound of the format.",
    ),
    Term(
        "routing-check",
        "Routing check",
        "The gradient check's reference replays the experts the run chose; this check holds the reference's own top-k "
        "choice of each token against them. A disagreement where the experts differ by less than the precision's "
        "near-tie gap in router probability is rounding; more than 1% of tokens disagreeing otherwise fails it (a router "
        "sending tokens to the wrong experts).",
    ),
    Term(
        "frozen-check",
        "End-of-run check",
        "Every parameter with a gradient at the gradient check's step must have moved by the end of the run (beyond a "
        "pure rescaling, which is weight decay). A parameter that stopped training after the checked step (its gradient "
        "zeroed, left out of the optimizer) fails it, even where the loss stays within its tolerance.",
    ),
    Term(
        "verified",
        "Verified, stated, not checked",
        "Verified: the lab's own worker ran it. An upload never is, whatever it carries: its summary is recomputed from "
        "its ranks, but its gradient and replica checks are stated by the uploader (the lab cannot recompute them), "
        "its loss reference is stated unless the lab holds its own curve for the workload (which then decides, the "
        "uploaded one kept beside it), and a check it does not carry is not checked — never counted as passed. The "
        "leaderboard's passed only keeps runs with every check present and passed; verified keeps the lab's runs only.",
    ),
    Term(
        "reproduce",
        "Reproduce an upload",
        "The lab re-runs an uploaded configuration on a pool (a traced run of its own worker, linked to the upload) and "
        "sets throughput, step time, peak memory and communication bytes measured beside stated: reproduced within X % "
        "when every figure both carry agrees within 10 %, else not reproduced, naming the figure and the gap.",
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
        "replica-check",
        "Replica check",
        "Every copy that should be identical (data-parallel replicas, tensor-parallel replicated norms and biases, a "
        "replicated router or embedding, a pipeline's copies across its data-parallel groups), compared across the ranks "
        "that hold it, twice: step 0's gradients after the strategy's synchronisation and the parameters after the last "
        "step. Each rank sends a float64 checksum of each copy; where checksums differ, the copies are exchanged and "
        "max |copy − first| / max |first| is taken against the lowest rank's copy. It fails above the gradient check's "
        "tolerance and names the parameter and the ranks. It catches what the gradient check cannot: that check reads "
        "one copy, so a copy on another rank that drifted away passes it.",
    ),
    Term(
        "median-interval",
        "Median, interval (with its coverage) and n",
        "Where a configuration (strategy and world size) has several runs, the leaderboard ranks it by the median of "
        "its runs' tokens/s, never by its luckiest run, and a sweep with repeats shows the same median. n is how many "
        "runs. The interval is the median's interval from order statistics: the k-th lowest and k-th highest run, "
        "with k the largest rank for which fewer than k runs fall below the true median with probability at most 2.5% "
        "(a Binomial(n, ½) count). It needs no assumption about the distribution and no random seed. With few runs no "
        "pair of runs reaches 95%: the interval is then the range of the runs, and the page gives the coverage it "
        "really has, 1 − 2·(½)ⁿ for the range. Coverage by n: " + _MEDIAN_COVERAGE + ". One run has no interval.",
    ),
    Term(
        "verdict",
        "Verdict (compare)",
        "Which configuration is faster, by how much, how sure, and where the time went. The test is Student's t on the "
        "logarithms of the runs' step times (a loaded host slows steps by a factor, so a ratio is a shift of the logs): "
        "the factor is the ratio of the geometric means (baseline over other), the interval its 95% t interval "
        "exponentiated, and the verdict is decided when the two-sided test at 5% separates the runs. Equal run counts "
        "use the pooled variance (95% coverage at every n from 2 a side when both share a relative spread, and robust "
        "to unequal spreads at equal n); unequal counts use Welch's t on Hsu's min(m, n) − 1 degrees of freedom "
        "(at least 95%, and at most 5% "
        "false positives whichever side is noisier). Coverage of the factor's interval by runs a "
        "side: " + _T_COVERAGE + ". Mann–Whitney, used before, cannot go below p = 0.1 at 3 runs against 3 (and 0.33 "
        "at 2 against 2), so it could never decide there; t can. Its power to find a 1.5× difference at the "
        f"run-to-run spread measured on a shared 2-core host (standard deviation {MEASURED_LOG_SPREAD} of the log step "
        "time, BENCHMARKS.md) by runs a side: " + _POWER + ". When the runs do not decide, the line says how many "
        'runs a side would find a difference as large as the one seen, at the spread seen, 4 times in 5 ("run 3 '
        'more each"); a difference too small to chase with 50 runs a side is called equal. Under 2 runs a side there '
        "is no spread to test against. The milliseconds that follow split the difference into exposed communication, "
        "compute (overlapped communication included) and idle: each run's profiled step split into shares, averaged, "
        "and scaled to the configuration's timed median, so the parts add up to the difference of the medians (checked "
        "within 5%). The interval width column is the median's interval over the median: how far apart runs of one "
        "configuration land.",
    ),
    Term(
        "noisy-host",
        "Noisy host",
        "The host was doing something else while the run ran, so its times may measure the sharing rather than the "
        "strategy. The worker reads /proc before the ranks start and after they end, and marks the run noisy when it had "
        "more ranks than physical cores, when the 1-minute load average before the start plus its own ranks exceeded "
        "the logical CPUs, when the hypervisor stole more than 5% of the CPU time, or when other torchrun jobs ran on "
        "the host. The badge names the reasons; no measured number is changed. Repeat the run on a quiet host.",
    ),
    Term(
        "spearman",
        "Spearman ρ, predicted vs measured (sweeps)",
        "How well the planner's ranking of a sweep's configurations by predicted tokens/s matches the ranking by "
        "measured tokens/s: 1 the same order, 0 unrelated, −1 reversed. Its 95% interval is the Fisher-z interval with "
        "the variance 1.06/(n − 3) for rank correlations, so it needs at least 4 measured configurations. The ranking is "
        "established only when the interval lies above 0.",
    ),
    Term(
        "prediction",
        "Predicted step time, tokens/s and memory (plan, sweeps)",
        "The planner's estimate for the busiest rank, before anything runs: step = (compute + exposed communication) / "
        "(1 − bubble) + optimizer, each part from the pool's calibration (measured GEMM rates, memory bandwidth and bus "
        "bandwidth per op) or, uncalibrated, from the device's datasheet; tokens/s is the global tokens per step over "
        "that step. Memory per rank is model state plus activations; a configuration whose memory exceeds 90% of the "
        "device's is rejected. docs/planner.md has the whole model.",
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


METRIC_TERMS: dict[str, str] = {
    "tokens_per_s": "tokens-per-s",
    "samples_per_s": "samples-per-s",
    "step_time_median": "step-time",
    "step_time_p90": "step-time",
    "tflops_per_s": "tflops",
    "mfu": "mfu",
    "peak_allocated_bytes_max": "peak-memory",
    "peak_rss_bytes_max": "peak-rss",
    "model_state_bytes": "model-state",
    "predicted_model_state_bytes": "model-state",
    "activation_bytes": "activations",
    "predicted_activation_bytes": "activations",
    "comm_time_fraction": "comm-fraction",
    "exposed_comm_fraction": "exposed-comm",
    "comm_bytes_per_step": "buffer-bytes",
    "wire_bytes_per_step": "wire-bytes",
    "bubble_fraction": "bubble",
    "loss_max_rel_diff": "loss-vs-reference",
    "loss_check": "loss-vs-reference",
    "gradient_check": "gradient-check",
    "gradient_max_rel_err": "gradient-check",
    "gradient_worst_param": "gradient-check",
    "replica_check": "replica-check",
    "gradient_tolerance": "gradient-check",
    "routing_check": "routing-check",
    "frozen_check": "frozen-check",
    "noise": "noisy-host",
    "flags": "flags",
}
"""The term that explains each metric row of the compare table (`backend.services.compare.METRICS`' keys)."""


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
