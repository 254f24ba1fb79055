"""Time and memory of the critical path and the ranks' split steps (the merge's step).

Synthetic input: `--ranks` ranks on a dp_shard × tp mesh (tp = 8, or the world when smaller),
each step `--collectives` collectives (60 % on the rank's tp group, 40 % on its dp_shard group)
with `--compute` compute segments before each, for `--steps` steps; one rank computes 2 ms more
before each collective. The ranks' steps are generated one at a time as `analyse` asks for them
(what it iterates: one step of every rank held at once), or all up front with `--whole` (the
window held whole, to compare). Or `--from-run DIR`: a real job's rank records (rank*.json).

    python -m benchmarks.critpath --ranks 64 --collectives 1000 --steps 3
    python -m benchmarks.critpath --ranks 8 --collectives 100 --steps 20
    python -m benchmarks.critpath --from-run /tmp/run

Prints the input's size, the analysis' wall time (best of `--repeat`) and the peak memory it
allocates (tracemalloc; with the streamed input, the steps it generates included).
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from pathlib import Path

from parallab.core.critpath import COLL, COMPUTE, CriticalPath, StepSegments, analyse
from parallab.core.result import RankRecord

CLASSES = ("matmul", "norms and elementwise", "attention", "matmul", "norms and elementwise")


def rank_steps(rank: int, ranks: int, collectives: int, compute: int, steps: int, seed: int = 0) -> Iterator[StepSegments]:
    """One rank's steps, generated when asked for. Every rank's clock runs in lockstep: each
    collective ends at the same instant on all, the late rank enters it 2 ms after the others."""
    tp = min(8, ranks)
    tp_group = ",".join(str(rank - rank % tp + i) for i in range(tp))
    dp_group = ",".join(str(rank % tp + i * tp) for i in range(ranks // tp)) if ranks > tp else tp_group
    rng = random.Random(seed * 1_000_003 + rank)
    late = ranks // 2
    seq = {tp_group: 0, dp_group: 0}
    n_tp = collectives * 6 // 10
    slot = 3000.0  # µs per collective: compute, then the collective
    for step in range(steps):
        t0 = step * collectives * slot
        s = StepSegments(start_us=t0, end_us=t0 + collectives * slot)
        for i in range(collectives):
            base = t0 + i * slot
            arrive = base + 500.0 + rng.uniform(0, 50) + (2000.0 if rank == late else 0.0)
            width = (arrive - base) / compute
            for k in range(compute):
                s.add(COMPUTE, CLASSES[k % len(CLASSES)], "", -1, base + k * width, base + (k + 1) * width)
            group = tp_group if i < n_tp else dp_group
            s.add(COLL, "all_reduce", group, seq[group], arrive, base + slot)
            seq[group] += 1
        yield s


def from_run(path: Path) -> tuple[dict[int, Iterable[StepSegments] | None], list[tuple[str, int]]]:
    from parallab.core.jobs import ResolvedJob

    out: dict[int, Iterable[StepSegments] | None] = {}
    for file in sorted(path.glob("rank*.json")):
        record = RankRecord.model_validate_json(file.read_text())
        out[record.rank] = record.step_segments
    job = ResolvedJob.model_validate_json((path / "job.json").read_text())
    return out, [(d.name, d.size) for d in job.mesh]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--collectives", type=int, default=1000, help="Per rank per step.")
    parser.add_argument("--compute", type=int, default=5, help="Compute segments before each collective.")
    parser.add_argument("--steps", type=int, default=3, help="Profiled steps (the harness' window is 3).")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--whole", action="store_true", help="Generate every step up front (the window held whole).")
    parser.add_argument("--from-run", type=Path, default=None)
    args = parser.parse_args(argv)

    def inputs() -> tuple[dict[int, Iterable[StepSegments] | None], list[tuple[str, int]]]:
        if args.from_run is not None:
            return from_run(args.from_run)
        tp = min(8, args.ranks)
        mesh = [("dp_shard", args.ranks // tp), ("tp", tp)]
        gen = {r: rank_steps(r, args.ranks, args.collectives, args.compute, args.steps) for r in range(args.ranks)}
        return ({r: list(g) for r, g in gen.items()} if args.whole else dict(gen)), mesh

    best = float("inf")
    result: CriticalPath | None = None
    for _ in range(args.repeat):
        per_rank, mesh = inputs()
        began = time.perf_counter()
        result = analyse(per_rank, world_size=len(per_rank), mesh=mesh)
        best = min(best, time.perf_counter() - began)
    tracemalloc.start()
    per_rank, mesh = inputs()
    analyse(per_rank, world_size=len(per_rank), mesh=mesh)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result is not None
    segments = (args.collectives * (args.compute + 1) * args.steps * args.ranks) if args.from_run is None else None
    print(
        f"ranks={len(per_rank)} steps={result.steps} rank-segments={segments or 'from records'} "
        f"input={'whole' if args.whole else 'streamed'}"
    )
    print(
        f"analysis: {best * 1e3:.0f} ms (best of {args.repeat}), peak {peak / 2**20:.1f} MiB allocated (input generated inside included), "
        f"stored block {len(result.model_dump_json()) / 1024:.1f} KiB"
    )
    print(
        f"path {result.length_s * 1e3:.1f} ms/step through ranks {result.path_ranks_visited[:8]}; top parts:",
        {k: round(v * 1e3, 1) for k, v in list(result.parts_s.items())[:4]},
    )


if __name__ == "__main__":
    main()
