"""Time and memory of matching collectives across ranks and naming stragglers (the merge's step).

Synthetic input: `--ranks` ranks on a dp_shard × tp mesh (tp = 8, or the world when smaller),
each issuing `--collectives` collectives per step for `--steps` steps, 60 % on its tp group and
40 % on its dp_shard group; one rank enters each collective 2 ms late. Or `--from-driver DIR`: the
arrivals a real gloo job wrote (tests/workers/straggler_driver.py, phase `late`).

    python -m benchmarks.stragglers --ranks 64 --collectives 1000 --steps 3
    python -m benchmarks.stragglers --from-driver /tmp/strag_run

Prints the input's size (and the memory its parsed arrivals hold), the analysis' wall time (best of `--repeat`) and the peak memory the
analysis itself allocates (tracemalloc, the input excluded), and the stragglers it named.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from parallab.core.stragglers import CollectiveArrival, GroupTimes, columns, match, name_stragglers, rows


def synthetic(ranks: int, collectives: int, steps: int, seed: int = 0) -> tuple[dict[int, list[GroupTimes]], list[tuple[str, int]]]:
    tp = min(8, ranks)
    mesh = [("dp_shard", ranks // tp), ("tp", tp)]
    rng = random.Random(seed)
    late = ranks // 2
    out: dict[int, list[GroupTimes]] = {}
    n_tp = collectives * 6 // 10
    for rank in range(ranks):
        tp_group = ",".join(str(rank - rank % tp + i) for i in range(tp))
        dp_group = ",".join(str(rank % tp + i * tp) for i in range(ranks // tp))
        seq = {tp_group: 0, dp_group: 0}
        arrivals = []
        for i in range(collectives * steps):
            group = tp_group if i % collectives < n_tp else dp_group
            t = i * 1000.0 + rng.uniform(0, 100) + (2000.0 if rank == late else 0.0)
            arrivals.append(CollectiveArrival(group, seq[group], "all_reduce", t, i * 1000.0 + 2500.0))
            seq[group] += 1
        out[rank] = columns(arrivals)  # the record's form, as the worker holds it
    return out, mesh


def from_driver(path: Path) -> tuple[dict[int, list[GroupTimes] | None], list[tuple[str, int]]]:
    out: dict[int, list[GroupTimes] | None] = {}
    for file in sorted(path.glob("arrivals_late_rank*.json")):
        doc = json.loads(file.read_text())
        rank = int(file.stem.rsplit("rank", 1)[1])
        out[rank] = None if doc["arrivals"] is None else [GroupTimes(**g) for g in doc["arrivals"]]
    return out, [("dp_shard", 2), ("tp", 2)]


def _rows(per_rank: dict[int, list[GroupTimes] | None]) -> dict[int, Iterator[CollectiveArrival] | None]:
    return {r: None if groups is None else rows(groups) for r, groups in per_rank.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--collectives", type=int, default=1000, help="Per rank per step.")
    parser.add_argument("--steps", type=int, default=3, help="Profiled steps (the harness' window is 3).")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--from-driver", type=Path, default=None)
    args = parser.parse_args(argv)
    tracemalloc.start()
    if args.from_driver is not None:
        per_rank, mesh = from_driver(args.from_driver)
        steps = 3
    else:
        per_rank, mesh = synthetic(args.ranks, args.collectives, args.steps)
        steps = args.steps
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    events = sum(len(g.seq) for groups in per_rank.values() for g in groups or [])
    best = float("inf")
    for _ in range(args.repeat):
        began = time.perf_counter()
        named = name_stragglers(match(_rows(per_rank), world_size=len(per_rank), mesh=mesh, steps=steps))
        best = min(best, time.perf_counter() - began)
    tracemalloc.start()
    matched = match(_rows(per_rank), world_size=len(per_rank), mesh=mesh, steps=steps)
    name_stragglers(matched)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    size = len(matched.model_dump_json())
    print(f"ranks={len(per_rank)} rank-collective events={events} steps={steps}; the records' arrivals hold {held / 2**20:.1f} MiB")
    print(
        f"analysis: {best * 1e3:.1f} ms (best of {args.repeat}), peak {peak / 2**20:.1f} MiB allocated, stored block {size / 1024:.1f} KiB"
    )
    print("stragglers:", [(s.rank, round(s.last_fraction, 3), round(s.wait_caused_s_per_step, 4)) for s in named])


if __name__ == "__main__":
    main()
