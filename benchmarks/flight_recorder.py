"""The flight recorder's cost: every run keeps it on (`workers.launcher.FLIGHT_RECORDER_ENTRIES`).

    python benchmarks/flight_recorder.py [--models tiny small] [--rounds 5] [--steps 20] [--calls 3000] [--json] [--write]

Three figures, each from launches that take turns (on, off / off, on, round after round) so the
drift of a shared machine hits both alike:

1. step time, untraced: the harness as a worker runs it (`workers.execute.run_and_collect`: the
   launcher, torchrun, `workers.harness.main`), DDP on 2 gloo ranks, with the recorder on (the
   default) and off (`TORCH_FR_BUFFER_SIZE=0`, which the launcher leaves as it finds it). A
   round's ratio is its on job's median step over its off job's; the figure is the median of the
   rounds' ratios (target ≤ 1.02), with their range;
2. what one collective costs to record: `--calls` all_reduces of 8 floats on 2 gloo ranks (the
   cheapest collective, so the recording's share is largest), per call, on against off;
3. collectives per step of each model's DDP step, counted in the recorder itself (its entries
   over one step). (2) × (3) / the step time is the recorder's share of a step, a bound that the
   noise of (1) cannot blur.

`--probe-only` runs a plain DDP loop of each model instead, on and off, and prints per step the
process CPU time (every thread), the wall time and the voluntary context switches: where a
difference in (1) comes from. `--json` prints one line; `--write` puts the section "Flight
recorder" in BENCHMARKS.md.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WORLD = 2
OFF = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}


def micro_rank(calls: int, out: Path) -> None:
    """Inside torchrun: `calls` all_reduces of 8 floats after 200 warm-up ones; rank 0 writes µs per call."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    t = torch.ones(8)
    for _ in range(200):
        dist.all_reduce(t)
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        dist.all_reduce(t)
    took, cpu_took = time.perf_counter() - start, time.thread_time() - cpu
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"us_per_call": took / calls * 1e6, "cpu_us_per_call": cpu_took / calls * 1e6}))
    dist.barrier()
    dist.destroy_process_group()


def ddp_stepper(model_name: str) -> tuple[int, Callable[[int], None]]:
    """Inside torchrun (gloo up): this rank and one DDP training step of `model_name` as the harness's
    DDP takes it (the step's global batch, this rank's share), for `count_rank` and `probe_rank`."""
    import torch.distributed as dist

    from benchmarks.plain_ddp import plain_ddp_step

    return dist.get_rank(), plain_ddp_step(model_name)


def count_rank(model_name: str, out: Path) -> None:
    """Inside torchrun, recorder on: one DDP step of `model_name` (as the harness's DDP), its collectives counted by the recorder."""
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    dist.init_process_group("gloo")
    rank, step = ddp_stepper(model_name)

    def recorded() -> int:
        return len(json.loads(getattr(c10d, "_dump_fr_trace_json")(True, False))["entries"])  # noqa: B009

    counts = []
    for i in range(3):
        before = recorded()
        step(i)
        counts.append(recorded() - before)
    if rank == 0:
        out.write_text(json.dumps({"per_step": counts[-1]}))
    dist.barrier()
    dist.destroy_process_group()


def probe_rank(model_name: str, steps: int, out: Path) -> None:
    """Inside torchrun: the DDP step of `count_rank`, `steps` times after 3 warm-up steps; each rank
    writes its process CPU time (every thread), its wall time and its voluntary context switches per step."""
    import resource

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, step = ddp_stepper(model_name)

    for s in range(3):
        step(s)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for s in range(steps):
        step(s)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    doc = {"cpu_ms": cpu / steps * 1e3, "wall_ms": wall / steps * 1e3, "switches": (after.ru_nvcsw - before.ru_nvcsw) / steps}
    Path(f"{out}.{rank}").write_text(json.dumps(doc))
    dist.barrier()
    dist.destroy_process_group()


def probe(model: str, steps: int, on: bool) -> dict[str, float]:
    """Per step, the mean over ranks: process CPU ms, wall ms, voluntary context switches."""
    with tempfile.TemporaryDirectory(prefix="parallab-fr-") as tmp:
        out = Path(tmp, "probe")
        torchrun(["--probe-rank", model, str(steps), str(out)], {} if on else OFF)
        docs = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(WORLD)]
    return {k: statistics.mean(d[k] for d in docs) for k in ("cpu_ms", "wall_ms", "switches")}


def probes(models: list[str], steps: int, rounds: int) -> dict[str, Any]:
    """`probe` on and off, alternating, `rounds` times per model: medians and the on/off ratios."""
    out: dict[str, Any] = {}
    for model in models:
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for r in range(rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                runs[on].append(probe(model, steps, on))
                print(f"  probe {model} round {r + 1} {'on ' if on else 'off'} {runs[on][-1]}", file=sys.stderr)
        med = {on: {k: statistics.median(x[k] for x in runs[on]) for k in ("cpu_ms", "wall_ms", "switches")} for on in runs}
        out[model] = {"on": med[True], "off": med[False], "cpu_ratio": med[True]["cpu_ms"] / med[False]["cpu_ms"]}
    return out


def torchrun(args: list[str], env_extra: dict[str, str]) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    env.update(env_extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD), __file__, *args]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def micro(calls: int, on: bool) -> tuple[float, float]:
    """(wall µs, the calling thread's CPU µs) per collective."""
    with tempfile.TemporaryDirectory(prefix="parallab-fr-") as tmp:
        out = Path(tmp, "micro.json")
        torchrun(["--micro-rank", str(calls), str(out)], {} if on else OFF)
        doc = json.loads(out.read_text())
        return float(doc["us_per_call"]), float(doc["cpu_us_per_call"])


def count(model: str) -> int:
    with tempfile.TemporaryDirectory(prefix="parallab-fr-") as tmp:
        out = Path(tmp, "count.json")
        torchrun(["--count-rank", model, str(out)], {})
        return int(json.loads(out.read_text())["per_step"])


def harness_step(model: str, steps: int, on: bool, home: Path) -> float:
    """One harness job's median step (per step the slowest rank), the recorder on or off."""
    from benchmarks.harness_overhead import run_harness

    saved = {k: os.environ.get(k) for k in OFF}
    if not on:
        os.environ.update(OFF)
    try:
        per_step, _, _ = run_harness(model, steps, False, home)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return statistics.median(per_step)


def measure(models: list[str], steps: int, rounds: int, calls: int) -> dict[str, Any]:
    results: dict[str, Any] = {"micro": {"on": [], "off": []}, "micro_cpu": {"on": [], "off": []}, "models": {}}
    for r in range(rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            wall, cpu = micro(calls, on)
            results["micro"]["on" if on else "off"].append(wall)
            results["micro_cpu"]["on" if on else "off"].append(cpu)
    with tempfile.TemporaryDirectory(prefix="parallab-fr-home-") as home:
        for model in models:
            steps_on: list[float] = []
            steps_off: list[float] = []
            for r in range(rounds):
                for on in (True, False) if r % 2 == 0 else (False, True):
                    (steps_on if on else steps_off).append(harness_step(model, steps, on, Path(home)))
                    print(
                        f"  {model} round {r + 1} {'on ' if on else 'off'} {(steps_on if on else steps_off)[-1] * 1e3:8.2f} ms",
                        file=sys.stderr,
                    )
            ratios = [a / b for a, b in zip(steps_on, steps_off, strict=True)]
            results["models"][model] = {
                "on_ms": statistics.median(steps_on) * 1e3,
                "off_ms": statistics.median(steps_off) * 1e3,
                "ratio": statistics.median(ratios),
                "round_ratios": ratios,
                "collectives_per_step": count(model),
            }
    on_us, off_us = (statistics.median(results["micro"][k]) for k in ("on", "off"))
    on_cpu, off_cpu = (statistics.median(results["micro_cpu"][k]) for k in ("on", "off"))
    results["micro_us"] = {
        "on": on_us,
        "off": off_us,
        "delta": on_us - off_us,
        "cpu_on": on_cpu,
        "cpu_off": off_cpu,
        "cpu_delta": on_cpu - off_cpu,
    }
    for r in results["models"].values():
        # The recording runs on the calling thread: its CPU time per call is the cost that load cannot inflate much.
        # None when the measured cost is not above zero: below what this machine resolves, not a zero.
        r["bound"] = (on_cpu - off_cpu) * r["collectives_per_step"] / (r["off_ms"] * 1e3) if on_cpu > off_cpu else None
    return results


def report(results: dict[str, Any], steps: int, rounds: int, calls: int) -> str:
    m = results["micro_us"]
    lines = [
        f"Measured by `python benchmarks/flight_recorder.py --rounds {rounds} --steps {steps} --calls {calls} --write` on "
        f"{os.cpu_count()} CPU cores ({platform.machine()}, shared with other sessions; load average at the end "
        f"{os.getloadavg()[0]:.1f}), torch's recorder at {2000} entries against `TORCH_FR_BUFFER_SIZE=0`, jobs alternating on/off "
        "round after round. Step time: an untraced harness job's median step (per step the slowest rank), DDP on 2 gloo ranks, "
        f"fp32, {steps} timed steps.",
        "",
        "| model | step on (ms) | step off (ms) | ratio on/off, median (each round) | collectives per step "
        "| recording's share of a step (bound) |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for model, r in results["models"].items():
        each = ", ".join(f"{x:.3f}" for x in r["round_ratios"])
        lines.append(
            f"| {model} | {r['on_ms']:.1f} | {r['off_ms']:.1f} | {r['ratio']:.3f} ({each}) | {r['collectives_per_step']} "
            f"| {'not resolved' if r['bound'] is None else format(r['bound'] * 100, '.3f') + ' %'} |"
        )
    lines += [
        "",
        f"One all_reduce of 8 floats on 2 gloo ranks (median of {rounds} launches each, {calls} calls per launch): "
        f"the calling thread's CPU time {m['cpu_on']:.1f} µs recorded, {m['cpu_off']:.1f} µs not ({m['cpu_delta']:+.1f} µs); "
        f"wall time {m['on']:.1f} µs against {m['off']:.1f} µs ({m['delta']:+.1f} µs). torch records an entry on the thread "
        "that issues the collective, so its CPU time is the recording's cost, which a loaded machine inflates far less than "
        "the wall time. The bound is that CPU cost × the collectives of one step (counted by the recorder) / the step time "
        "(off): the share of a step the recorder can take, whatever the noise in the ratio. Target ≤ 2 %.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--micro-rank", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--count-rank", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--probe-rank", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--probe-only", action="store_true", help="only the CPU and context-switch probe (JSON)")
    args = parser.parse_args()
    if args.probe_rank:
        probe_rank(args.probe_rank[0], int(args.probe_rank[1]), Path(args.probe_rank[2]))
        return
    if args.probe_only:
        print(json.dumps(probes(args.models, args.steps, args.rounds)))
        return
    if args.micro_rank:
        micro_rank(int(args.micro_rank[0]), Path(args.micro_rank[1]))
        return
    if args.count_rank:
        count_rank(args.count_rank[0], Path(args.count_rank[1]))
        return
    results = measure(args.models, args.steps, args.rounds, args.calls)
    text = report(results, args.steps, args.rounds, args.calls)
    print(json.dumps(results) if args.json else text)
    if args.write:
        from benchmarks.report import write_section

        write_section("Flight recorder", text)


if __name__ == "__main__":
    main()
