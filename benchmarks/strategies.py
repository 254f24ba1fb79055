"""Tokens/s of every strategy on this machine, as a ratio to `single` run in the same script.

    python benchmarks/strategies.py [--models tiny small] [--steps 10] [--write]

Each job goes through the same torchrun path as `parallab bench`; the table says tokens/s,
median step time, the ratio to `single` on the same workload, peak memory per rank, the
fraction of the step in communication and the loss's agreement with the reference.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Settings  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from parallab.core.jobs import Limits, resolve_job  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from workers.execute import run_and_collect  # noqa: E402

JOBS = [
    ("single", 1, {}),
    ("ddp", 2, {}),
    ("fsdp", 2, {}),
    ("fsdp", 2, {"reshard_after_forward": False}),
    ("tp", 2, {}),
    ("tp", 2, {"sequence_parallel": True}),
    ("pp", 2, {"schedule": "gpipe"}),
    ("pp", 2, {"schedule": "1f1b"}),
    ("ring", 2, {}),
    ("ring", 2, {"zigzag": True}),
    ("moe", 2, {}),
    ("hybrid", 4, {"tp": 2}),
]


def mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f}"


def run(model: str, name: str, world: int, options: dict, steps: int, home: Path) -> dict:
    spec = JobSpec.model_validate(
        {
            "workload": {"model": model, "steps": steps, "warmup_steps": 2},
            "strategy": {"name": name, "world_size": world, "options": options},
        }
    )
    job = resolve_job(spec, Limits(max_world_size=8))
    settings = Settings(home=home, max_world_size=8)
    collected = run_and_collect(job, home / f"{model}-{name}-{world}-{len(os.listdir(home))}", settings=settings)
    if collected.document is None:
        raise RuntimeError(collected.error)
    return collected.document.summary.model_dump()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = parser.parse_args()
    lines = [
        f"Measured by `python benchmarks/strategies.py --write` on {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), gloo, fp32, {args.steps} measured steps after 2 warm-up steps. "
        "Ratio = tokens/s ÷ `single`'s on the same workload, same script. "
        "On 2 cores every extra rank competes for the same cores, so CPU ratios below 1 are expected: "
        "they rank the strategies' overheads, not GPU speed-ups. "
        "`moe` trains the preset with 4 experts (top-2), so its ratio is against the dense `single` and only indicative; "
        "`hybrid` puts 4 ranks on the 2 cores. "
        "Peak alloc is the profiler's peak over the profiled steps (what was allocated while profiling: activations, grads, temporaries); "
        "comm fraction includes time waiting in receives, so for `pp` it holds the bubble.",
        "",
        "| model | strategy | options | ranks | tokens/s | ratio vs single | step median (ms) | peak alloc / rank (MiB) "
        "| comm fraction | loss rel. diff vs single |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="parallab-bench-") as tmp:
        for model in args.models:
            baseline = None
            for name, world, options in JOBS:
                s = run(model, name, world, options, args.steps, Path(tmp))
                baseline = baseline or s["tokens_per_s"]
                opts = ", ".join(f"{k}={v}" for k, v in options.items()) or "—"
                diff = s["loss_max_rel_diff_vs_reference"]
                frac = s["comm_time_fraction"]
                row = (
                    f"| {model} | {name} | {opts} | {world} | {s['tokens_per_s']:,.0f} | {s['tokens_per_s'] / baseline:.2f} | "
                    f"{s['step_time_s']['median'] * 1e3:.1f} | {mib(s['peak_allocated_bytes_max'])} | "
                    f"{'—' if frac is None else f'{frac:.2f}'} | {'—' if diff is None else f'{diff:.1e}'} |"
                )
                print(row, flush=True)
                lines.append(row)
    text = "\n".join(lines)
    if args.write:
        write_section("Strategies: tokens/s on this machine", text)


if __name__ == "__main__":
    main()
