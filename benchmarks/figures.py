"""Building a page's Plotly figures: the compare page for 2 and 10 runs, the run page for one traced run.

    python benchmarks/figures.py [--repeat 30] [--json]

In one process, no database and no HTTP: the figure builders get factory documents
(`tests.ui.factories.make_document`, strategies ddp/fsdp/tp/pp/hybrid on 2 ranks) and each figure
is serialised as the page embeds it (`figure_json`), so a page's time here is what its figures cost
the server, build and JSON together. Prints the median and the range over `--repeat` builds (after
one warm-up) per page, and the host's load average before the first build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STRATEGIES = ("ddp", "fsdp", "tp", "pp", "hybrid")


def compare_runs(n: int) -> list[tuple[str, dict[str, Any]]]:
    """`n` labelled documents, the strategies in turn (a different seed per repeat of one)."""
    from tests.ui.factories import make_document

    runs = []
    for i in range(n):
        strategy = STRATEGIES[i % len(STRATEGIES)]
        doc = make_document(strategy=strategy, world_size=2, seed=i).model_dump(mode="json")
        runs.append((f"{strategy} ×2 #{i}", doc))
    return runs


def traced_document(events_per_rank: int = 250) -> dict[str, Any]:
    """fsdp × 2 with a profiled step's timeline: collectives back to back on both ranks."""
    from tests.ui.factories import make_document

    doc = make_document(strategy="fsdp", world_size=2, steps=50).model_dump(mode="json")
    ops = ["all_gather", "reduce_scatter", "all_reduce"]
    timeline = []
    for r in range(2):
        t = 0.0
        for i in range(events_per_rank):
            dur = 5.0 + (i * 37 % 50)
            timeline.append({"rank": r, "op": ops[i % 3], "start_us": t, "dur_us": dur, "bytes": 65_536})
            t += dur * 1.5
    return {**doc, "timeline": timeline}


def page_builders() -> dict[str, Callable[[], list[str]]]:
    """Each page: build its figures and serialise every one as the page embeds it."""
    from backend.api.pages.rendering import figure_json
    from backend.figures.compare import compare_figures
    from backend.figures.run import run_figures

    two, ten, traced = compare_runs(2), compare_runs(10), traced_document()

    def page(build: Callable[[], dict[str, Any]]) -> Callable[[], list[str]]:
        return lambda: [str(figure_json(fig)) for fig in build().values() if fig is not None]

    return {
        "compare, 2 runs": page(lambda: compare_figures(two)),
        "compare, 10 runs": page(lambda: compare_figures(ten)),
        "run page, 1 traced run": page(lambda: run_figures(traced)),
    }


def measure(repeat: int) -> dict[str, Any]:
    load = os.getloadavg()
    rows = {}
    for name, build in page_builders().items():
        build()  # warm-up: imports, plotly's validators
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = build()
            times.append((time.perf_counter() - t0) * 1e3)
        rows[name] = {
            "figures": len(out),
            "json_bytes": sum(len(s) for s in out),
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "max_ms": max(times),
        }
    return {"load_average": load, "cpus": os.cpu_count(), "repeat": repeat, "pages": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=30, help="builds per page after one warm-up")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = measure(args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    load = ", ".join(f"{v:.2f}" for v in result["load_average"])
    print(f"load average before: {load} on {result['cpus']} CPUs; median of {result['repeat']} builds")
    print(f"{'page':<24} {'figures':>7} {'JSON bytes':>10} {'median ms':>10} {'range ms':>16}")
    for name, row in result["pages"].items():
        span = f"{row['min_ms']:.1f}–{row['max_ms']:.1f}"
        print(f"{name:<24} {row['figures']:>7} {row['json_bytes']:>10,} {row['median_ms']:>10.1f} {span:>16}")


if __name__ == "__main__":
    main()
