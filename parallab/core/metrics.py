"""Formulas that turn per-rank measurements into a run's summary.

Pure functions over plain data: used by the worker's aggregation, by CI uploads (to recompute or
check a summary) and by the ranks (bandwidths). No torch, no database.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEVICE_PEAK_FLOPS: dict[str, float] = {
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
}
"""Peak dense bf16 FLOP/s of devices we know (for MFU); unknown devices, CPUs included, give None."""

_BUSBW: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
"""nccl-tests' bus-bandwidth factors, busbw = algbw × factor(n); broadcast and P2P are 1."""


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor for `op` at `world_size` ranks (1 for broadcast, P2P and unknown ops)."""
    if world_size <= 1 or op not in _BUSBW:
        return 1.0
    return _BUSBW[op](world_size)


def wire_bytes(op: str, nbytes: int, world_size: int) -> int:
    """Bytes one rank sends for an op of `nbytes` (nccl-tests' buffer convention) in a ring
    implementation: the buffer × the busbw factor — e.g. 2(n−1)/n·S for an all-reduce of S."""
    return round(nbytes * busbw_factor(op, world_size))


def bandwidths_gbps(op: str, nbytes: float, seconds: float, world_size: int) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s (1e9 bytes) for one op's bytes moved in `seconds`."""
    if seconds <= 0 or nbytes <= 0:
        return None, None
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, world_size)


def peak_flops_for(device_name: str | None) -> float | None:
    """Peak dense bf16 FLOP/s for a device name such as 'NVIDIA H100 80GB HBM3'; None if unknown."""
    if not device_name:
        return None
    return next((peak for key, peak in DEVICE_PEAK_FLOPS.items() if key in device_name), None)


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) — numpy's default, without numpy."""
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    pos = (len(data) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def max_rel_diff(values: list[float], reference: list[float]) -> float | None:
    """max over steps of |loss − loss_ref| / |loss_ref|; None when there is nothing to compare."""
    pairs = [(v, r) for v, r in zip(values, reference, strict=False) if r != 0]
    if not pairs:
        return None
    return max(abs(v - r) / abs(r) for v, r in pairs)


def _present(ranks: Sequence[Mapping[str, Any]], key: str) -> list[Any]:
    return [r[key] for r in ranks if r.get(key) is not None]


def exposed_comm_fraction(rank: Mapping[str, Any]) -> float | None:
    """A rank's communication time that no compute overlaps, over its step time: from its
    `step_time_breakdown` (both from the same profiled steps), else `exposed_comm_time_s` over the
    median of its step times; None when the rank measured no exposed time."""
    split = rank.get("step_time_breakdown")
    if split and split.get("step_s"):
        return min(float(split["exposed_comm_s"]) / float(split["step_s"]), 1.0)
    exposed, times = rank.get("exposed_comm_time_s"), rank.get("step_times_s")
    if exposed is None or not times:
        return None
    median = statistics.median(times)
    return min(float(exposed) / median, 1.0) if median > 0 else None


@dataclass(frozen=True)
class PipelineBubble:
    """The pipeline's bubble over the profiled steps, from every stage's actions on one clock."""

    per_stage: list[float]
    """Each stage's idle time within the step's window (the first action on any stage to the last
    on any stage) over that window, in the order of the ranks given."""
    mean: float
    """Their mean: what (p−1)/(m+p−1) describes (every stage idles p−1 of m+p−1 slots)."""
    imbalance: float
    """max / mean − 1 of the stages' busy time: a slower stage (the last one's head and loss)
    shows here, as a number of its own."""
    busy_per_stage: list[float] = field(default_factory=list)
    """Each stage's busy time (some action of its running), µs summed over the steps counted."""


def _covered(intervals: Iterable[Sequence[float]]) -> float:
    """Length covered by [start, end) intervals, overlaps counted once."""
    total, end = 0.0, -math.inf
    for a, b in sorted((float(i[0]), float(i[1])) for i in intervals if i[1] > i[0]):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def pipeline_bubble(stages: Sequence[Sequence[Sequence[Sequence[float]]]]) -> PipelineBubble | None:
    """The bubble from `stages[s][step]`: stage s's action intervals in that profiled step (µs on a
    clock every stage shares). Per step, the window runs from the first action on any stage to the
    last on any stage; a stage's idle is the window less the time some action of its ran. The
    before-the-first and after-the-last idle — where the first and last stages' bubbles sit —
    are counted. None without at least one step with actions on every stage."""
    steps = min((len(stage) for stage in stages), default=0)
    if not stages or steps == 0:
        return None
    window = [0.0] * len(stages)
    idle, busy = [0.0] * len(stages), [0.0] * len(stages)
    for i in range(steps):
        acts = [stage[i] for stage in stages]
        if not all(acts):
            continue
        start = min(a[0] for stage in acts for a in stage)
        end = max(a[1] for stage in acts for a in stage)
        for s, stage in enumerate(acts):
            covered = _covered(stage)
            window[s] += end - start
            busy[s] += covered
            idle[s] += max(end - start - covered, 0.0)
    if not any(window):
        return None
    per_stage = [idle[s] / window[s] if window[s] > 0 else 0.0 for s in range(len(stages))]
    mean_busy = sum(busy) / len(busy)
    return PipelineBubble(
        per_stage=per_stage,
        mean=sum(per_stage) / len(per_stage),
        imbalance=(max(busy) / mean_busy - 1.0) if mean_busy > 0 else 0.0,
        busy_per_stage=busy,
    )


def unequal_stages_bubble(busy: Sequence[float], microbatches: int) -> float:
    """(p−1)/(m+p−1) for stages whose times per micro-batch differ (t_s ∝ `busy`[s]): the slowest
    stage sets the steady state, and fill and drain pass every stage once, so a step takes
    (m−1)·max t + Σ t (GPipe's and 1F1B's alike), and the stages' mean idle over it is
    1 − m·mean t / ((m−1)·max t + Σ t). Equal stages give (p−1)/(m+p−1); what a measured
    imbalance adds to the stages' idle is this less that."""
    if not busy or microbatches < 1 or max(busy) <= 0:
        raise ValueError("need every stage's busy time (> 0) and at least one micro-batch")
    m, p = microbatches, len(busy)
    mean = sum(busy) / p
    return 1.0 - m * mean / ((m - 1) * max(busy) + p * mean)


def rank_bubbles(ranks: Sequence[Mapping[str, Any]]) -> PipelineBubble | None:
    """`pipeline_bubble` of the ranks that recorded pipeline actions (`pipeline_actions_us`)."""
    stages = [r["pipeline_actions_us"] for r in ranks if r.get("pipeline_actions_us")]
    return pipeline_bubble(stages) if stages else None


UNTRACED_FIELDS = ("comm_bytes_per_step", "wire_bytes_per_step", "comm_time_fraction", "exposed_comm_fraction", "bubble_fraction")
"""What only the profiled window measures: a run whose ranks profiled no step has none of it."""


def not_measured(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary fields nobody measured: `UNTRACED_FIELDS` when every rank says it profiled no
    step (`profiled_steps` 0: an untraced run), else none (a rank that does not say is taken as measured)."""
    if ranks and all(r.get("profiled_steps") == 0 for r in ranks):
        return list(UNTRACED_FIELDS)
    return []


def summarize(
    *,
    ranks: Sequence[Mapping[str, Any]],
    tokens_per_step: int,
    samples_per_step: int,
    flops_per_token: float | None,
    device_name: str | None,
    world_size: int,
    loss: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `summary` block from the rank records.

    A step ends when its slowest rank ends, so the step time is, per step, the max over ranks,
    and the run's step time is the median of those. `comm_time_fraction` (every comm span over
    the step) and `exposed_comm_fraction` (what no compute overlaps) are each the max over ranks;
    `comm_bytes_per_step` and `wire_bytes_per_step` (each op's bytes on the wire from its calls'
    group sizes, only when the ranks recorded them) are the largest over ranks, by op.
    """
    per_rank = [r["step_times_s"] for r in ranks if r.get("step_times_s")]
    if not per_rank:
        raise ValueError("no rank recorded any step time")
    steps = min(len(t) for t in per_rank)
    step_max = [max(t[i] for t in per_rank) for i in range(steps)]
    median = statistics.median(step_max)
    tokens_per_s = tokens_per_step / median if median > 0 else 0.0
    tflops = tokens_per_s * flops_per_token / 1e12 if flops_per_token else None
    peak = peak_flops_for(device_name)
    mfu = (tokens_per_s * flops_per_token / (peak * world_size)) if (peak and flops_per_token) else None

    comm_bytes: dict[str, int] = {}
    wire: dict[str, int] = {}
    for r in ranks:
        for op in r.get("comm") or []:
            comm_bytes[op["op"]] = max(comm_bytes.get(op["op"], 0), int(op["bytes"]))
            if op.get("wire_bytes") is not None:
                wire[op["op"]] = max(wire.get(op["op"], 0), int(op["wire_bytes"]))
    comm_fracs, bubbles = _present(ranks, "comm_time_fraction"), _present(ranks, "bubble_fraction")
    pipeline = rank_bubbles(ranks)
    # Stages' actions on one clock give the bubble the formula describes (the mean over stages);
    # a document without them keeps the older per-rank figure (its max).
    bubble = pipeline.mean if pipeline else (max(bubbles) if bubbles else None)
    stage_figures = {"bubble_per_stage": pipeline.per_stage, "stage_imbalance": pipeline.imbalance} if pipeline else {}
    exposed = [f for f in (exposed_comm_fraction(r) for r in ranks) if f is not None]
    peaks, rss = _present(ranks, "peak_allocated_bytes"), _present(ranks, "peak_rss_bytes")

    values = list((loss or {}).get("values") or [])
    reference = (loss or {}).get("reference")
    # Only where the ranks recorded wire bytes: an older document's stated figure is kept as stated.
    measured_wire = {"wire_bytes_per_step": wire} if wire else {}
    return {
        "tokens_per_s": tokens_per_s,
        "samples_per_s": samples_per_step / median if median > 0 else 0.0,
        "step_time_s": {"median": median, "p90": percentile(step_max, 90)},
        "model_flops_per_token": flops_per_token,
        "tflops_per_s": tflops,
        "mfu": mfu,
        "peak_allocated_bytes_max": max(peaks) if peaks else None,
        "peak_rss_bytes_max": max(rss) if rss else None,
        "comm_time_fraction": max(comm_fracs) if comm_fracs else None,
        "exposed_comm_fraction": max(exposed) if exposed else None,
        "comm_bytes_per_step": comm_bytes,
        "bubble_fraction": bubble,
        "loss_max_rel_diff_vs_reference": max_rel_diff(values, reference) if reference else None,
        "final_loss": values[-1] if values else None,
        "not_measured": not_measured(ranks),
        **measured_wire,
        **stage_figures,
    }
