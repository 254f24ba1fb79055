"""Example sweeps the new-sweep form offers, each with the lesson it teaches and what it measured.

An example is a filled-in sweep form (model, world size, strategies, pool, recipe) and the
measured rows that show its point, from `benchmarks/emulated_layouts.py --json` on an emulated
cluster (`parallab lab emulate`): each layout's measured step beside the planner's prediction,
the band it stated, and the communication per mesh dimension — so the page shows the answer the
sweep will reproduce, and the reader can run it on their own pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

LESSONS = Path(__file__).resolve().parents[2] / "frontend" / "lessons"


@dataclass(frozen=True)
class SweepExample:
    key: str
    title: str
    lesson: str
    """What the example shows, in a paragraph."""
    values: dict[str, Any]
    """The sweep form's fields, as the form would post them."""
    measured: str | None = None
    """The file under frontend/lessons holding the measured rows (benchmark's `--json`)."""
    docs: str = ""
    notes: list[str] = field(default_factory=list)


EXAMPLES: dict[str, SweepExample] = {
    e.key: e
    for e in [
        SweepExample(
            key="tp-across-nodes",
            title="Tensor parallelism inside a node against across nodes (2 emulated nodes × 2 ranks)",
            lesson=(
                "Tensor parallelism all-reduces activations in every layer, forward and backward, so its "
                "traffic is on the critical path; data parallelism moves gradients once a step. Put tp's group "
                "inside a node and only the data-parallel dimension crosses the slow link. The sweep below plans "
                "and runs, on 2 nodes × 2 ranks, fsdp 2 × tp 2 with tp inside a node (FSDP across: placement "
                "inner-first) and the same with tp across nodes (FSDP inside: placement across), beside ddp and "
                "fsdp over all four; each run records which dimensions crossed the link, and the planner times "
                "each dimension on the path its groups take."
            ),
            values={
                "name": "tp inside a node vs across",
                "model": "tiny",
                "world_size": "4",
                "nodes": "2",
                "top": "8",
                "controls": "0",
                "steps": "6",
                "pool": "emulated",
                "strategies": ["ddp", "fsdp", "hybrid"],
                "placements": ["inner-first", "across"],
                "precisions": ["fp32"],
                "checkpointing": ["none"],
                "accumulation": ["1"],
            },
            measured="tp_across_nodes.json",
            docs="docs/emulate.md",
            notes=["Start the pool first: sudo parallab lab emulate --nodes 2 --ranks-per-node 2 --inter-node 1gbit"],
        )
    ]
}


def example(key: str | None) -> SweepExample | None:
    """The example named `key` (None: no such example, or none asked for)."""
    return EXAMPLES.get(key or "")


@lru_cache(maxsize=8)
def measured_rows(name: str, root: Path = LESSONS) -> list[dict[str, Any]]:
    """The example's measured rows, each with its error against the prediction and whether the
    measured step lies in the band the prediction stated; empty when the file is absent."""
    path = root / name
    if not path.is_file():
        return []
    rows = []
    for r in json.loads(path.read_text()):
        error = r["predicted_ms"] / r["measured_ms"] - 1 if r.get("measured_ms") else None
        band = r.get("band") or None
        inside = None if band is None or error is None else abs(error) <= band["step_time_share"]
        dims = sorted(set(r.get("measured_dims") or {}) | set(r.get("predicted_dims") or {}))
        rows.append({**r, "error": error, "inside": inside, "dims": dims})
    return rows
