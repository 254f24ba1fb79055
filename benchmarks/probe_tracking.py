"""Does a host-speed probe follow the training step when the host's load changes?

    python benchmarks/probe_tracking.py [--model small] [--rounds 27] [--write]

One torchrun job of 4 gloo ranks (the plain DDP step of `benchmarks.plain_ddp`: the preset's
global batch split over the ranks, AdamW, one intra-op thread a rank) goes round by round; before
each round rank 0 starts 0, 1 or 2 busy-loop processes beside the ranks (three rounds each, in
turn) and every round times, every rank at once after a barrier: the host-speed probe of
`parallab.core.hostspeed` (pure Python, `workers.hostspeed.rates`), a short torch probe (20 ×
a 256×1024×256 GEMM and a 16 MiB copy), then 5 training steps (their median). Processor sharing
says what the steps should do: with k busy loops beside 4 ranks the ranks' share of the cores is
4/(4+k), so the step grows (4+k)/4. A probe that carries a calibration to a later run's moment
must grow with it. Prints, per number of busy loops, the medians and ranges of the three, and the
correlation of the step with each probe over the rounds; `--write` puts it under "Host-speed
probes against a loaded host" in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import write_section  # noqa: E402

HEADING = "Host-speed probes against a loaded host"
WORLD = 4
STEPS_A_ROUND = 5
BUSY_LOOPS = (0, 1, 2)


def ranks(model_name: str, rounds: int, out: Path) -> None:
    """Inside torchrun: the rounds; rank 0 writes one JSON line a round to `out`."""
    import torch
    import torch.distributed as dist

    from benchmarks.plain_ddp import plain_ddp_step
    from workers import hostspeed

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step = plain_ddp_step(model_name)
    a, b = torch.randn(256, 1024), torch.randn(1024, 256)
    src = torch.empty(4 << 20)
    dst = torch.empty_like(src)

    def torch_probe() -> float:
        start = time.perf_counter()
        for _ in range(20):
            torch.matmul(a, b)
            dst.copy_(src)
        return time.perf_counter() - start

    busy: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(rounds):
            loops = BUSY_LOOPS[(r // 3) % len(BUSY_LOOPS)]
            if rank == 0:
                for p in busy:
                    p.kill()
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
            dist.barrier()
            py = statistics.mean(hostspeed.rates(3))
            tp = torch_probe()
            times = []
            for i in range(STEPS_A_ROUND):
                dist.barrier()
                start = time.perf_counter()
                step(i)
                times.append(time.perf_counter() - start)
            mean = torch.tensor([py, tp, statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(mean)
            mean /= world
            if rank == 0:
                said = {"loops": loops, "py_ops_per_s": mean[0].item(), "torch_probe_s": mean[1].item(), "step_s": mean[2].item()}
                with out.open("a") as fh:
                    fh.write(json.dumps(said) + "\n")
    finally:
        for p in busy:
            p.kill()
        dist.destroy_process_group()


def report(rounds: list[dict[str, float]], *, model: str) -> str:
    def spread(values: list[float], scale: float, fmt: str) -> str:
        return f"{statistics.median(values) * scale:{fmt}} ({min(values) * scale:{fmt}}–{max(values) * scale:{fmt}})"

    base = statistics.median(r["step_s"] for r in rounds if r["loops"] == 0)
    lines = [
        f"Measured by `python benchmarks/probe_tracking.py --rounds {len(rounds)}` on {os.cpu_count()} CPU cores "
        f"({platform.machine()}): DDP of `{model}` on {WORLD} gloo ranks; each round 0, 1 or 2 busy-loop processes beside "
        f"them, the host-speed probe, a torch probe (20 × a 256×1024×256 GEMM and a 16 MiB copy) and {STEPS_A_ROUND} steps, "
        "every rank at once (rank means).",
        "",
        "| busy loops beside | rounds | step (ms, median and range) | step ÷ without | processor sharing says "
        "| host-speed probe (Mops/s a lane) | torch probe (ms) |",
        "|---:|---:|---|---:|---:|---|---|",
    ]
    for loops in BUSY_LOOPS:
        own = [r for r in rounds if r["loops"] == loops]
        if not own:
            continue
        steps = [r["step_s"] for r in own]
        lines.append(
            f"| {loops} | {len(own)} | {spread(steps, 1e3, '.0f')} | {statistics.median(steps) / base:.2f} | "
            f"{(WORLD + loops) / WORLD:.2f} | {spread([r['py_ops_per_s'] for r in own], 1e-6, '.1f')} | "
            f"{spread([r['torch_probe_s'] for r in own], 1e3, '.0f')} |"
        )
    steps = [r["step_s"] for r in rounds]
    py = statistics.correlation(steps, [1 / r["py_ops_per_s"] for r in rounds])
    tp = statistics.correlation(steps, [r["torch_probe_s"] for r in rounds])
    lines += ["", f"Correlation over the rounds of the step with the host-speed probe's time: {py:.2f}; with the torch probe's: {tp:.2f}."]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--ranks":
        ranks(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--rounds", type=int, default=27)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="parallab-probes-") as tmp:
        out = Path(tmp) / "rounds.jsonl"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD), __file__]
        subprocess.run([*cmd, "--ranks", args.model, str(args.rounds), str(out)], cwd=REPO, env=env, check=True)
        rounds = [json.loads(line) for line in out.read_text().splitlines()]
    text = report(rounds, model=args.model)
    print(text)
    if args.write:
        write_section(HEADING, text)


if __name__ == "__main__":
    main()
