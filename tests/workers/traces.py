"""Synthetic Chrome traces shaped like torch.profiler's export, for tests that need no torch."""

from __future__ import annotations

from typing import Any


def chrome_trace(steps: int, events_per_step: int) -> dict[str, Any]:
    """`steps` ProfilerStep spans 1000 µs apart on the main thread (tid 1), each with
    `events_per_step` short cpu_ops of varied name length, plus one metadata event."""
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    for s in range(steps):
        t0 = s * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t0, "dur": 999.0})
        events += [
            {"ph": "X", "cat": "cpu_op", "name": f"aten::op{s}_{i}_{'x' * (i % 97)}", "pid": 1, "tid": 1, "ts": t0 + i * 0.1, "dur": 0.05}
            for i in range(events_per_step)
        ]
    return {"traceEvents": events}
