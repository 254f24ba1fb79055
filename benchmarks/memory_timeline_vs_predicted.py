"""The planner's memory curve against the measured memory timeline, phase by phase.

    python benchmarks/memory_timeline_vs_predicted.py [--models tiny small] [--strategies ddp fsdp tp pp]
        [--steps 3] [--json OUT] [--markdown]
    python benchmarks/memory_timeline_vs_predicted.py --table OUT [OUT ...]   # the table of saved runs

Runs each model × strategy × 2 ranks traced on gloo as a worker runs it (launcher, torchrun, the
harness), then per rank compares each phase's highest measured point with the planner's
predicted one (`parallab.core.memory_curve`, from the run's own prediction block: the textbook,
not fitted) and reports the peaks, the largest gap of each kind of phase (forward, backward,
optimizer, outside the passes) and the largest overall, with its phase. `--json` keeps every
phase's row; `--markdown` prints the table BENCHMARKS.md carries.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
KINDS = ("forward", "backward", "optimizer", "outside")


def _kind(phase: str) -> str:
    first = phase.split(" ", 1)[0]
    return first if first in ("forward", "backward", "optimizer") else "backward" if first == "recompute" else "outside"


def run(model: str, strategy: str, steps: int) -> dict[str, Any]:
    """Launch `strategy` × 2 traced on `model`; compare every rank's timeline with the model's curve."""
    from backend.figures import memory as figures
    from parallab.core import memory_curve
    from parallab.core.jobs import Limits, resolve_job
    from parallab.core.rundir import RunDir
    from parallab.core.spec import JobSpec
    from workers.aggregate import build_result, read_rank_records
    from workers.launcher import launch

    spec = JobSpec.model_validate(
        {
            "workload": {"model": model, "steps": steps, "warmup_steps": 1, "seed": 0},
            "strategy": {"name": strategy, "world_size": 2},
            "trace": True,
        }
    )
    job = resolve_job(spec, Limits(max_world_size=8))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        files = RunDir(Path(tmp))
        outcome = launch(job, files, timeout_s=1200, trace_cap_bytes=1 << 30, cache_dir=Path(tmp) / "cache")
        assert outcome.ok, outcome.log_tail
        doc = build_result(job, read_rank_records(files, 2)).model_dump(mode="json")
    wall = time.perf_counter() - t0
    ranks = []
    for rank in doc["ranks"]:
        chosen = figures.chosen_rank(doc, rank["rank"])
        curve = figures.predicted(doc, chosen) if chosen else None
        if chosen is None or curve is None:
            continue
        rows = memory_curve.gaps(chosen["memory_timeline"], curve)
        worst = {k: memory_curve.largest_gap([r for r in rows if _kind(r["phase"]) == k]) for k in KINDS}
        overall = memory_curve.largest_gap(rows)
        ranks.append(
            {
                "rank": rank["rank"],
                "peak_measured": max(p["allocated"] for p in chosen["memory_timeline"]),
                "peak_predicted": max(p.allocated for p in curve),
                "largest": overall,
                "sentence": memory_curve.gap_sentence(overall),
                "by_kind": worst,
                "phases": rows,
                "peak_table_rows": len((rank.get("memory_peak") or {}).get("top") or []),
                "peak_table_json_bytes": len(json.dumps(rank.get("memory_peak"))),
                "peak_unaccounted_bytes": (rank.get("memory_peak") or {}).get("unaccounted_bytes"),
                "rss_json_bytes": sum(len(f', "rss": {p["rss"]}') for p in chosen["memory_timeline"] if p.get("rss") is not None),
            }
        )
    return {"model": model, "strategy": strategy, "steps": steps, "wall_s": round(wall, 1), "ranks": ranks}


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    share = f" ({row['share'] * 100:+.0f} %)" if row["share"] is not None else ""
    return f"{row['gap'] / MIB:+.2f}{share}"


def markdown(results: list[dict[str, Any]]) -> str:
    head = (
        "| model | strategy | rank | peak measured (MiB) | peak predicted (MiB) | largest gap: forward | backward | optimizer "
        "| outside the passes | largest gap overall (MiB, phase) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for res in results:
        for r in res["ranks"]:
            k = r["by_kind"]
            lines.append(
                f"| {res['model']} | {res['strategy']} | {r['rank']} | {r['peak_measured'] / MIB:.2f} | {r['peak_predicted'] / MIB:.2f} "
                f"| {_cell(k['forward'])} | {_cell(k['backward'])} | {_cell(k['optimizer'])} | {_cell(k['outside'])} "
                f"| {_cell(r['largest'])} in {r['largest']['phase'] if r['largest'] else '—'} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp", "tp", "pp"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every phase's row here")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--table", nargs="+", type=Path, help="print the table of these --json files (no runs)")
    args = parser.parse_args()
    if args.table:
        print(markdown([res for path in args.table for res in json.loads(path.read_text())]))
        return
    results = []
    for model in args.models:
        for strategy in args.strategies:
            results.append(run(model, strategy, args.steps))
            print(
                json.dumps(
                    {k: v for k, v in results[-1].items() if k != "ranks"} | {"sentences": [r["sentence"] for r in results[-1]["ranks"]]}
                ),
                flush=True,
            )
            if args.json:  # after each job, so a later job's failure keeps the earlier ones
                args.json.write_text(json.dumps(results, indent=1))
    if args.markdown:
        print(markdown(results))


if __name__ == "__main__":
    main()
