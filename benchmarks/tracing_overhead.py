"""Tracing overhead: the same DDP training job with the profiler off, on (`trace: false`) and
tracing (`trace: true`), step times compared.

    python benchmarks/tracing_overhead.py [--model tiny [small ...]] [--world-size 2] [--steps 20] [--reps 3] [--write]

Launches one torchrun job per model; inside it each rank runs the three modes back to back, `reps` times
interleaved (so drift of a shared machine hits all three alike), each a fresh optimizer run of
`steps` measured steps with a StepProfiler (window 3 after 1 skipped step) wrapped exactly like
the harness's loop does (time the step, then `prof.step()`). Reported, per mode against "off":
- window ratio: median step time of the profiled steps (2..4) / the same steps unprofiled;
- run ratio: median over all measured steps (what a run's summary sees) / unprofiled;
- results time: `prof.results()` after the loop (trace export, gzip, attribution) — outside
  the step times.
`--write` puts the table under "Tracing overhead" in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("off", "on", "trace")
WINDOW, SKIP = 3, 1


def rank_main(args: argparse.Namespace) -> None:
    """Inside torchrun: every mode, `reps` times; rank 0 writes the step times as JSON."""
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from parallab.core.model import PRESETS
    from workers.harness.data import global_batch, micro_batch
    from workers.harness.measure import StepProfiler
    from workers.harness.model import build_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model].config
    gbs = PRESETS[args.model].global_batch_size
    times: dict[str, list[list[float]]] = {m: [] for m in MODES}
    results_s: dict[str, list[float]] = {m: [] for m in MODES}
    out_dir = Path(args.out)

    def step(model: DistributedDataParallel, opt: torch.optim.Optimizer, i: int) -> None:
        inputs, labels = global_batch(cfg, global_batch_size=gbs, seed=0, step=i)
        take = lambda t: micro_batch(t, accum_steps=1, micro_step=0, dp_degree=world, dp_rank=rank)  # noqa: E731
        opt.zero_grad(set_to_none=True)
        model(take(inputs), labels=take(labels)).backward()
        opt.step()

    for _ in range(args.reps):
        for mode in MODES:
            model = DistributedDataParallel(build_model(cfg, seed=0))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for i in range(2):
                step(model, opt, i)
            prof = StepProfiler(
                enabled=mode != "off",
                trace=mode == "trace",
                rank=rank,
                world_size=world,
                out_dir=out_dir,
                device=torch.device("cpu"),
                window=WINDOW,
                skip=SKIP,
            )
            steps: list[float] = []
            with prof:
                for i in range(args.steps):
                    start = time.perf_counter()
                    step(model, opt, 2 + i)
                    steps.append(time.perf_counter() - start)
                    prof.step()
            start = time.perf_counter()
            prof.results()
            results_s[mode].append(time.perf_counter() - start)
            times[mode].append(steps)
    if rank == 0:
        (out_dir / "times.json").write_text(json.dumps({"times": times, "results_s": results_s}))
    dist.destroy_process_group()


def report(data: dict, model: str, world: int, steps: int) -> str:
    times, results_s = data["times"], data["results_s"]
    window = slice(SKIP, SKIP + WINDOW)
    med = lambda runs, sl=slice(None): statistics.median(t for run in runs for t in run[sl])  # noqa: E731
    base_w, base_r = med(times["off"], window), med(times["off"])
    lines = [
        f"DDP, `{model}` preset, {world} CPU ranks on gloo, {steps} measured steps, profiler window {WINDOW} "
        f"after {SKIP} skipped step, medians over {len(times['off'])} interleaved repetitions.",
        "",
        "| mode | median step, profiled steps (ms) | window ratio | median step, whole run (ms) | run ratio | results() (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        w, r = med(times[mode], window), med(times[mode])
        lines.append(
            f"| {mode} | {w * 1e3:.1f} | {w / base_w:.2f} | {r * 1e3:.1f} | {r / base_r:.2f} | "
            f"{statistics.median(results_s[mode]) * 1e3:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["tiny"], help="one or more presets, each its own job")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        args.model = args.model[0]
        rank_main(args)
        return
    texts = []
    for model in args.model:
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(args.world_size),
                __file__,
                "--rank-worker",
                "--out",
                out,
                "--model",
                model,
                "--steps",
                str(args.steps),
                "--reps",
                str(args.reps),
            ]
            subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
            data = json.loads(Path(out, "times.json").read_text())
        texts.append(report(data, model, args.world_size, args.steps))
        print(texts[-1])
    load = os.getloadavg()[0]
    texts.append(
        f"Load average at the end: {load:.1f} on {os.cpu_count()} cores — on a shared machine, "
        "differences of a few tens of percent between runs are noise; the window ratio of `tiny` "
        "(microsecond ops, where the profiler's and the dispatch mode's per-op cost dominates) is the "
        "upper bound, and the run median (what a summary reports) is within noise of 1."
    )
    text = "\n\n".join(texts)
    if args.write:
        sys.path.insert(0, str(REPO))
        from benchmarks.report import write_section

        write_section("Tracing overhead", f"Measured by `python benchmarks/tracing_overhead.py --write`.\n\n{text}")


if __name__ == "__main__":
    main()
