"""torchrun script (not a test module): several whole training jobs of one world size in ONE launch.

Launched by `harness_jobs` (tests/workers/conftest.py). Each `--runs` directory holds a job file
written as the launcher writes it; for each, in order, every rank runs the harness's own
`main.run_training` (model, strategy, gradient check, training under the profiler, the
end-of-run checks, rank 0's reference) on a fresh mesh over the one process group, or for a job
that trains nothing (the collectives sweep) `main.run_sweep` as `main()` dispatches it, and writes
its rank record into that run directory, which the fixture merges with `build_result` exactly as
the worker does. What this skips is what a launch costs and no job needs: torchrun's agent and
every rank importing the harness once per job (about 4 s a rank).

Lifetime figures of the process (peak RSS) carry over from one job to the next; no test reads
them from a folded job.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch
import torch.distributed as dist

from parallab.core.rundir import RunDir
from tests.workers.driver_context import gloo_context
from workers.harness.main import load_job, run_sweep, run_training


def main_() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True, nargs="+", type=Path)
    parser.add_argument("--cache-dir", required=True, type=Path)
    parser.add_argument("--trace-cap-bytes", required=True, type=int)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # the ranks share the host's cores, as the harness's runtime sets it
    for path in args.runs:
        run_dir = RunDir(path)
        job = load_job(run_dir.job)
        if job.trains:
            run_training(job, gloo_context(job), run_dir, args.cache_dir, args.trace_cap_bytes)
        else:
            run_sweep(job, gloo_context(job), run_dir)
        gc.collect()  # the job's wrapped model and its groups go before the next job builds its own
        dist.barrier()  # rank 0's reference run ends before the next job's first collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main_()
