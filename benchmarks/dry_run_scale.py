"""The dry run at full scale: Llama-3-8B's shape at world 64 in torchtitan's three reference layouts.

    python benchmarks/dry_run_scale.py [--model llama-3-8b] [--world 64] [--global-batch-size 64]

FSDP 64, TP 8 × FSDP 8 and PP 4 × TP 8 × FSDP 2, each run by `workers.dryrun.dry_run` (the real
rank code, one forked child per rank looked at, torch's fake process group, fake tensors) and
held against the planner's formulas. Prints a markdown table: per layout, the ranks run, the
largest gap of any figure (parameters, gradients, AdamW state, each dimension's bytes by op),
whether every figure is within the dry run's tolerance, and the wall time of the dry run and of
its slowest rank, with the load average before and after (the machine is shared: the times are
this machine's, at that load).
"""

from __future__ import annotations

import argparse
import os

from parallab.core.jobs import Limits, resolve_job
from parallab.core.spec import JobSpec
from workers.dryrun import TOLERANCE, dry_run

LAYOUTS = ({"dp_shard": 64}, {"tp": 8, "dp_shard": 8}, {"pp": 4, "tp": 8, "dp_shard": 2})
"""torchtitan's reference layouts for an 8B-class model at world 64 (its FSDP-only, 2-D and 3-D)."""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--global-batch-size", type=int, default=64)
    args = parser.parse_args()
    what = f"model {args.model}, world {args.world}, bf16, global batch {args.global_batch_size}"
    print(f"{what}; load before: {load()}, {os.cpu_count()} cores")
    print("| layout | ranks run | figures | largest gap | within tolerance | dry run (s) | slowest rank (s) |")
    print("|---|---|---|---|---|---|---|")
    for degrees in LAYOUTS:
        scaled = {k: v * args.world // 64 if k == "dp_shard" else v for k, v in degrees.items()}
        workload = {"model": args.model, "precision": "bf16", "global_batch_size": args.global_batch_size}
        spec = {"workload": workload, "strategy": {"name": "layout", "world_size": args.world, "options": scaled}}
        job = resolve_job(JobSpec.model_validate(spec), Limits(max_world_size=args.world))
        result = dry_run(job)
        worst = max(g.relative for g in result.gaps)
        ranks = ", ".join(str(r.rank) for r in result.ranks)
        slowest = max(r.seconds for r in result.ranks)
        ok = f"yes (≤ {TOLERANCE:.0%})" if result.passed else "NO"
        print(f"| {result.layout.label()} | {ranks} | {len(result.gaps)} | {worst:.4%} | {ok} | {result.seconds:.1f} | {slowest:.1f} |")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
