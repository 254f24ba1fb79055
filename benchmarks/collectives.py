"""The `collectives` job against an independent gloo timing loop, 1 to 64 MiB.

    flock /tmp/parallab-heavy.lock python benchmarks/collectives.py [--json] [--op all_reduce] [--world-size 2] [--rounds 3]

Each round runs, in turn: the collectives job as a user runs it (`parallab bench` with a
`collectives` spec: torchrun, the harness, the result document's `collectives` points), then
benchmarks/gloo_loop.py (plain torch.distributed under torchrun, nothing of the harness) over the
same sizes, with the same warm-up and timed calls (`--warmup`, `--iters`). The figure per size is each side's
median over rounds, and the ratio job / loop: 1.00 means the job reports what the interconnect
does. Writes BENCHMARKS.md's section "Collectives: the job against a plain gloo loop" unless
`--no-write`; `--json` prints one line: {"op": ..., "world_size": N, "rounds": R,
"sizes": {"<bytes>": {"job_s": ..., "loop_s": ..., "ratio": ...}}, "max_abs_deviation": ...}.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.report import write_section  # noqa: E402

HEADING = "Collectives: the job against a plain gloo loop"
MIB = 1024 * 1024
LOOP = REPO / "benchmarks" / "gloo_loop.py"


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return out


def run_job(tmp: Path, *, op: str, world_size: int, min_bytes: int, max_bytes: int, warmup: int, iters: int) -> dict[int, float]:
    """The collectives job through `parallab bench`: its document's time per size."""
    spec = {
        "workload": {"model": "tiny"},
        "strategy": {
            "name": "collectives",
            "world_size": world_size,
            "options": {"ops": [op], "min_bytes": min_bytes, "max_bytes": max_bytes, "iters": iters, "warmup_iters": warmup},
        },
        "trace": False,
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    out = tmp / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "parallab", "bench", "--spec", str(tmp / "spec.json"), "--out", str(out)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode:
        raise SystemExit(f"the collectives job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    points = json.loads(out.read_text())["collectives"]
    return {p["size_bytes"]: p["time_s"] for p in points if p["op"] == op}


def run_loop(tmp: Path, *, op: str, world_size: int, sizes: list[int], warmup: int, iters: int) -> dict[int, float]:
    """The plain gloo loop under torchrun: its time per size."""
    out = tmp / "loop.json"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size), str(LOOP), str(out), op]
    args += [str(warmup), str(iters)]
    proc = subprocess.run([*args, *map(str, sizes)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"the gloo loop failed:\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(out.read_text()).items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    jobs: list[dict[int, float]] = []
    loops: list[dict[int, float]] = []
    with tempfile.TemporaryDirectory(prefix="parallab-collectives-") as tmp:
        for r in range(args.rounds):
            calls = {"warmup": args.warmup, "iters": args.iters}
            sweep = {"min_bytes": args.min_mib * MIB, "max_bytes": args.max_mib * MIB}
            job = run_job(Path(tmp), op=args.op, world_size=args.world_size, **sweep, **calls)
            loop = run_loop(Path(tmp), op=args.op, world_size=args.world_size, sizes=sorted(job), **calls)
            jobs.append(job)
            loops.append(loop)
            print(f"round {r + 1}: job {job}\n         loop {loop}", file=sys.stderr)
    sizes = {}
    for size in sorted(jobs[0]):
        job_s = statistics.median(j[size] for j in jobs)
        loop_s = statistics.median(lp[size] for lp in loops)
        sizes[str(size)] = {"job_s": job_s, "loop_s": loop_s, "ratio": job_s / loop_s}
    deviation = max(abs(s["ratio"] - 1) for s in sizes.values())
    return {
        "op": args.op,
        "world_size": args.world_size,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "iters": args.iters,
        "sizes": sizes,
        "max_abs_deviation": deviation,
    }


def report(result: dict[str, Any], command: str) -> str:
    rows = "\n".join(
        f"| {int(size) / MIB:g} MiB | {s['job_s'] * 1000:.2f} ms | {s['loop_s'] * 1000:.2f} ms | {s['ratio']:.3f} |"
        for size, s in result["sizes"].items()
    )
    cpu = platform.processor() or platform.machine()
    return f"""
Measured by `{command}` on this machine ({os.cpu_count()} CPU cores, {cpu}, Python {platform.python_version()}, gloo):
`{result["op"]}` on {result["world_size"]} ranks, the `collectives` job (`parallab bench`, its result document's
points) and benchmarks/gloo_loop.py (plain torch.distributed; both {result["warmup"]} warm-up and {result["iters"]} timed calls per size,
the slowest rank's mean) taking turns, median of {result["rounds"]} rounds each.

| size | job | plain loop | job / loop |
|---|---|---|---|
{rows}

Largest deviation from 1: **{result["max_abs_deviation"] * 100:.1f}%**. Both sides time the same calls the same way,
so a systematic gap would show at every size; what differs from size to size is the machine (2 cores shared with
other work): at 1–8 MiB a call takes a few milliseconds and one descheduled rank moves a 20-call mean by tens of per cent.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--min-mib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5, help="Untimed calls per size, both sides.")
    parser.add_argument("--iters", type=int, default=20, help="Timed calls per size, both sides.")
    parser.add_argument("--json", action="store_true", help="Print one JSON line.")
    parser.add_argument("--no-write", action="store_true", help="Leave BENCHMARKS.md alone.")
    args = parser.parse_args()
    result = measure(args)
    command = (
        f"python benchmarks/collectives.py --op {args.op} --world-size {args.world_size} --rounds {args.rounds}"
        f" --warmup {args.warmup} --iters {args.iters}"
    )
    print(json.dumps(result) if args.json else report(result, command))
    if not args.no_write:
        write_section(HEADING, report(result, command))


if __name__ == "__main__":
    main()
