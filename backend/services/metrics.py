"""Formulas that turn per-rank measurements into a run's summary (shared/DESIGN.md).

Pure functions over plain data: used by the worker's aggregation, by CI uploads (to recompute or
check a summary) and by the pages. No torch, no database.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

# Peak dense bf16 FLOP/s of devices we know (for MFU); unknown devices, CPUs included, give None.
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
}

# nccl-tests' bus-bandwidth factors: busbw = algbw × factor(n).
_BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor for `op` at `world_size` ranks (1 for unknown ops and P2P)."""
    if world_size <= 1:
        return 1.0
    return _BUSBW.get(op, lambda n: 1.0)(world_size)


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
    for key, peak in DEVICE_PEAK_FLOPS.items():
        if key in device_name:
            return peak
    return None


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
    pairs = [(v, r) for v, r in zip(values, reference) if r != 0]
    if not pairs:
        return None
    return max(abs(v - r) / abs(r) for v, r in pairs)


def summarize(
    *,
    ranks: list[Mapping[str, Any]],
    tokens_per_step: int,
    samples_per_step: int,
    flops_per_token: float | None,
    device_name: str | None,
    world_size: int,
    loss: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `summary` block from the rank records.

    A step ends when its slowest rank ends, so the step time is, per step, the max over ranks,
    and the run's step time is the median of those.
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

    comm_fracs = [r["comm_time_fraction"] for r in ranks if r.get("comm_time_fraction") is not None]
    comm_bytes: dict[str, int] = {}
    for r in ranks:
        for op in r.get("comm") or []:
            comm_bytes[op["op"]] = max(comm_bytes.get(op["op"], 0), int(op["bytes"]))
    bubbles = [r["bubble_fraction"] for r in ranks if r.get("bubble_fraction") is not None]
    peaks = [r["peak_allocated_bytes"] for r in ranks if r.get("peak_allocated_bytes") is not None]
    rss = [r["peak_rss_bytes"] for r in ranks if r.get("peak_rss_bytes") is not None]

    values = list((loss or {}).get("values") or [])
    reference = (loss or {}).get("reference")
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
        "comm_bytes_per_step": comm_bytes,
        "bubble_fraction": max(bubbles) if bubbles else None,
        "loss_max_rel_diff_vs_reference": max_rel_diff(values, reference) if reference else None,
        "final_loss": values[-1] if values else None,
    }


FLAG_TOLERANCE = 0.10
"""A measured figure further than this (relative) from its prediction is flagged (shared/DESIGN.md)."""


def _gap(predicted: float, measured: float) -> float:
    return abs(measured - predicted) / abs(predicted) if predicted else (1.0 if measured else 0.0)


def prediction_flags(
    *,
    prediction: Mapping[str, Any],
    summary: Mapping[str, Any],
    ranks: list[Mapping[str, Any]],
    precision: str = "fp32",
    tolerance: float = FLAG_TOLERANCE,
) -> list[dict[str, Any]]:
    """`flags`: every measured figure more than `tolerance` from its prediction.

    Compared: communication bytes per step by op (the summary's max over ranks; an op nobody
    predicted is flagged only above 1% of the predicted total, so a stray scalar all-reduce is
    not), model-state bytes per rank (the max over ranks; per component in fp32, the total in
    mixed precision, where autocast keeps 4+4+8 bytes per parameter against ZeRO's 2+2+12), and
    the pipeline bubble.
    """
    flags: list[dict[str, Any]] = []

    def check(metric: str, predicted: float, measured: float) -> None:
        gap = _gap(predicted, measured)
        if gap > tolerance:
            flags.append({"metric": metric, "predicted": float(predicted), "measured": float(measured), "rel_gap": gap})

    predicted_comm = dict(prediction.get("comm_bytes_per_step") or {})
    measured_comm = dict(summary.get("comm_bytes_per_step") or {})
    total = sum(predicted_comm.values())
    for op in sorted(set(predicted_comm) | set(measured_comm)):
        p, m = predicted_comm.get(op, 0), measured_comm.get(op, 0)
        if not p and m <= 0.01 * total:
            continue
        check(f"comm_bytes_per_step.{op}", p, m)

    state = prediction.get("model_state_bytes_per_rank")
    measured_states = [r["model_state_bytes"] for r in ranks if r.get("model_state_bytes")]
    if state and measured_states:
        parts = ("params", "grads", "optimizer")
        if precision == "fp32":
            for part in parts:
                check(f"model_state_bytes_per_rank.{part}", state[part], max(s[part] for s in measured_states))
        else:
            check("model_state_bytes_per_rank.total", sum(state[p] for p in parts),
                  max(sum(s[p] for p in parts) for s in measured_states))

    if prediction.get("bubble_fraction") is not None and summary.get("bubble_fraction") is not None:
        check("bubble_fraction", prediction["bubble_fraction"], summary["bubble_fraction"])
    return flags
