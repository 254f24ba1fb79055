"""Repeats and the verdict on this machine: fsdp × 2 and ddp × 2 on `tiny`, interleaved, N runs each.

    python benchmarks/decide.py [--runs 10] [--steps 20] [--write]

Each run goes through `parallab bench`'s path (`workers.execute.run_and_collect`: torchrun on gloo,
the profiled window after the timed steps, the host sampled around the launch). Per configuration:
the median of the runs' timed median step times with its 95 % interval (order statistics,
`parallab.core.stats`), the spread, the interval's width over the median, and how many runs were
on a noisy host (`parallab.core.noise`); then compare's verdict of ddp × 2 against fsdp × 2
(`parallab.core.verdict`), its parts scaled from the profiled split to the timed medians, and the
same verdict from each configuration's first run alone (what one run each would have said).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Settings  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from parallab.core.jobs import Limits, resolve_job  # noqa: E402
from parallab.core.noise import noisy_reasons  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from parallab.core.stats import median_interval  # noqa: E402
from parallab.core.verdict import run_shares, verdict  # noqa: E402
from workers.execute import run_and_collect  # noqa: E402

CONFIGS = ("fsdp", "ddp")


def one_run(strategy: str, steps: int, home: Path, index: int) -> dict[str, Any]:
    spec = JobSpec.model_validate(
        {"workload": {"model": "tiny", "steps": steps, "warmup_steps": 2}, "strategy": {"name": strategy, "world_size": 2}}
    )
    job = resolve_job(spec, Limits(max_world_size=2, max_steps=10_000))
    collected = run_and_collect(job, home / f"{strategy}-{index}", settings=Settings(home=home, max_world_size=2))
    if collected.document is None:
        raise RuntimeError(collected.error)
    doc = collected.document.model_dump(mode="json")
    splits = [r["step_time_breakdown"] for r in doc["ranks"] if r.get("step_time_breakdown")]
    return {
        "step_s": doc["summary"]["step_time_s"]["median"],
        "tokens_per_s": doc["summary"]["tokens_per_s"],
        "profiled_step_s": statistics.fmean(b["step_s"] for b in splits) if splits else None,
        "shares": run_shares(splits),
        "noisy": noisy_reasons(doc.get("noise")),
        "load": (doc.get("noise") or {}).get("load_avg_1m_start"),
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    rows = [
        "| configuration | runs | median step (ms) | 95% interval (ms) | coverage | width / median | spread (ms) "
        "| median tokens/s | profiled step (ms, median) | runs on a noisy host |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for strategy, done in runs.items():
        steps = [r["step_s"] for r in done]
        m = median_interval(steps)
        profiled = [r["profiled_step_s"] for r in done if r["profiled_step_s"]]
        rows.append(
            f"| {strategy} × 2 | {len(done)} | {ms(m.estimate)} | {ms(m.low)}–{ms(m.high)} | {m.coverage:.1%} | "
            f"{(m.high - m.low) / m.estimate:.0%} | {ms(min(steps))}–{ms(max(steps))} | "
            f"{statistics.median(r['tokens_per_s'] for r in done):,.0f} | {ms(statistics.median(profiled)) if profiled else '—'} | "
            f"{sum(1 for r in done if r['noisy'])} of {len(done)} |"
        )
    fsdp, ddp = runs["fsdp"], runs["ddp"]
    full = verdict(
        baseline="fsdp ×2",
        other="ddp ×2",
        baseline_steps=[r["step_s"] for r in fsdp],
        other_steps=[r["step_s"] for r in ddp],
        baseline_shares=[r["shares"] for r in fsdp if r["shares"]],
        other_shares=[r["shares"] for r in ddp if r["shares"]],
    )
    first = verdict(baseline="fsdp ×2", other="ddp ×2", baseline_steps=[fsdp[0]["step_s"]], other_steps=[ddp[0]["step_s"]])
    kinds = Counter(re.sub(r"\d+(\.\d+)?", "N", why) for done in runs.values() for r in done for why in r["noisy"])
    reasons = [f"“{kind}” in {count} runs" for kind, count in kinds.most_common()]
    loads = [r["load"] for done in runs.values() for r in done if r["load"] is not None]
    return "\n".join(
        [
            f"Measured by `python benchmarks/decide.py --runs {args.runs} --steps {args.steps} --write` on {os.cpu_count()} CPU cores "
            f"({platform.processor() or platform.machine()}), shared with other work (load average before each launch "
            f"{min(loads):.1f}–{max(loads):.1f}): `tiny`, fsdp × 2 and ddp × 2 on gloo, {args.steps} timed steps after 2 warm-up "
            "steps, the two configurations interleaved (fsdp₁ ddp₁ fsdp₂ …) so that a slow spell of the host falls on both. "
            "A run's figure is its timed median step time; a configuration's is the median over its runs, with the order-statistic "
            "95% interval (`parallab.core.stats`).",
            "",
            *rows,
            "",
            f"Compare's verdict over all runs: **{full.line}**.",
            "",
            f"From each configuration's first run alone: {first.line}.",
            "",
            "The parts are each configuration's profiled split (compute with the overlapped communication, exposed communication, "
            "idle), its shares averaged over the runs and scaled to the configuration's timed median, so they add up to the "
            "difference of the medians (`parallab.core.verdict.check_adds_up`; the profiled steps themselves are slower than the "
            "timed ones, column *profiled step*). "
            + (f"Noisy-host reasons (N: the run's own figures): {'; '.join(reasons)}." if reasons else "No run was on a noisy host."),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="parallab-decide-") as tmp:
        for i in range(args.runs):
            for strategy in CONFIGS:  # interleaved
                run = one_run(strategy, args.steps, Path(tmp), i)
                runs[strategy].append(run)
                print(f"{strategy} × 2, run {i + 1}/{args.runs}: {ms(run['step_s'])} ms, load {run['load']}, {run['noisy']}", flush=True)
    text = report(runs, args)
    print(text)
    if args.write:
        write_section("Repeats and the verdict: ddp × 2 against fsdp × 2", text)


if __name__ == "__main__":
    main()
