"""Result documents for CI-upload tests (issue #11): a small valid one, and any document slowed down.

`slowed` scales every step time by a factor and the summary figures that follow from them
(throughput down by the same factor), so a server that recomputes the summary from the ranks'
step times and one that trusts it see the same slowdown — the same path as a real one.
"""

from __future__ import annotations

import copy
from typing import Any


def document(*, tokens_per_s: float = 1000.0, branch: str | None = "main", commit: str = "c0ffee0", **source: Any) -> dict[str, Any]:
    """A tiny ddp × 2 result on one CPU host whose step time gives `tokens_per_s` (512 tokens a step)."""
    step = 512 / tokens_per_s
    doc: dict[str, Any] = {
        "schema_version": 1,
        "name": "ci tiny ddp",
        "workload": {"model": "tiny", "hidden_size": 64, "num_layers": 4, "seq_len": 64, "global_batch_size": 8, "precision": "fp32"},
        "strategy": {"name": "ddp", "world_size": 2, "options": {}},
        "hardware": {"device": "cpu", "device_name": "ci-host"},
        "environment": {"torch": "2.13.0"},
        "summary": {
            "tokens_per_s": tokens_per_s,
            "samples_per_s": tokens_per_s / 64,
            "step_time_s": {"median": step, "p90": step},
            "peak_allocated_bytes_max": 8_000_000,
            "exposed_comm_fraction": 0.1,
            "comm_bytes_per_step": {"all_reduce": 1000},
        },
        "ranks": [
            {
                "rank": r,
                "model_state_bytes": {"params": 100, "grads": 100, "optimizer": 200},
                "peak_allocated_bytes": 8_000_000,
                "step_times_s": [step] * 5,
                "comm": [{"op": "all_reduce", "count": 1, "bytes": 1000, "time_s": step / 10}],
                # what summary.exposed_comm_fraction (0.1) is computed from: uploads are checked against their ranks
                "step_time_breakdown": {
                    "compute_s": 0.9 * step,
                    "exposed_comm_s": 0.1 * step,
                    "overlapped_comm_s": 0.0,
                    "idle_s": 0.0,
                    "step_s": step,
                },
            }
            for r in range(2)
        ],
        "loss": {"values": [5.5, 5.4], "reference": [5.5, 5.4]},
    }
    if branch is not None:
        doc["source"] = {"repository": "lab/model", "branch": branch, "commit": commit, **source}
    return doc


def slowed(doc: dict[str, Any], factor: float) -> dict[str, Any]:
    """`doc` with every step time × `factor` (and throughput and bandwidths ÷ `factor`)."""
    out = copy.deepcopy(doc)
    s = out["summary"]
    for key in ("tokens_per_s", "samples_per_s", "tflops_per_s"):
        if s.get(key) is not None:
            s[key] = s[key] / factor
    s["step_time_s"] = {k: v * factor for k, v in s["step_time_s"].items()}
    for rank in out["ranks"]:
        rank["step_times_s"] = [t * factor for t in rank["step_times_s"]]
        if rank.get("step_time_breakdown"):
            rank["step_time_breakdown"] = {k: v * factor for k, v in rank["step_time_breakdown"].items()}
        for op in rank.get("comm") or []:
            op["time_s"] *= factor
            for bandwidth in ("algbw_gbps", "busbw_gbps"):  # bytes over a longer time: the server recomputes them
                if op.get(bandwidth) is not None:
                    op[bandwidth] /= factor
    return out
