"""The run-to-run spread of this machine: the same tiny DDP job, repeated, through `parallab bench`'s path.

    python benchmarks/run_to_run.py [--runs 12] [--steps 10 100] [--condition shared] [--nice N] [--write]

What regression detection must not flag is the spread between runs of unchanged code. This
repeats one job (`tiny`, ddp × 2 on gloo) at each number of measured steps, interleaved so that
every length sees the same load, and reports per metric that detection covers the coefficient of
variation over runs (sample standard deviation / mean), beside the spread of step times within
one run. Each run's summary values and rank 0's step times are saved to
`benchmarks/run_to_run_spread.json`, under a named condition (`--condition`: how busy the
machine was; `--nice -15` gives the job the cores before the other work on a shared machine,
as a dedicated CI runner would): the synthetic series of `benchmarks/regression_fpr.py` and the
detection tests are drawn from them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Settings  # noqa: E402
from backend.services.regression import metric_values  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from parallab.core.jobs import Limits, resolve_job  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from workers.execute import run_and_collect  # noqa: E402

SPREAD_JSON = Path(__file__).resolve().parent / "run_to_run_spread.json"
METRICS = ("tokens_per_s", "step_time_p50", "peak_memory_per_rank", "exposed_comm_fraction")


def cv(values: list[float]) -> float | None:
    """Sample standard deviation over mean (None with fewer than two values or a zero mean)."""
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def one_run(steps: int, home: Path, index: int) -> dict[str, Any]:
    spec = JobSpec.model_validate(
        {"workload": {"model": "tiny", "steps": steps, "warmup_steps": 2}, "strategy": {"name": "ddp", "world_size": 2}}
    )
    job = resolve_job(spec, Limits(max_world_size=2, max_steps=10_000))
    collected = run_and_collect(job, home / f"run-{index}", settings=Settings(home=home, max_world_size=2))
    if collected.document is None:
        raise RuntimeError(collected.error)
    doc = collected.document.model_dump(mode="json")
    return {"values": metric_values(doc["summary"]), "step_times_s": doc["ranks"][0]["step_times_s"], "load": round(os.getloadavg()[0], 2)}


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--condition", default="shared", help="name of the conditions measured (kept apart in the JSON)")
    parser.add_argument("--nice", type=int, default=0, help="run at this niceness (negative: before the machine's other work; needs root)")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md and the spread JSON")
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)
    runs: dict[int, list[dict[str, Any]]] = {steps: [] for steps in args.steps}
    with tempfile.TemporaryDirectory(prefix="parallab-spread-") as tmp:
        for i in range(args.runs):
            for steps in args.steps:  # interleaved: each length sees the same load
                run = one_run(steps, Path(tmp), len(runs[steps]) + 1000 * steps)
                runs[steps].append(run)
                print(
                    f"{steps} steps, run {i + 1}/{args.runs}: {run['values']['tokens_per_s']:,.0f} tokens/s, load {run['load']}", flush=True
                )
    measured: dict[str, Any] = {"runs": args.runs, "nice": args.nice, "by_steps": {}}
    for steps, done in runs.items():
        entry: dict[str, Any] = {"runs": done, "cv": {m: cv([r["values"][m] for r in done if m in r["values"]]) for m in METRICS}}
        entry["within_run_step_time_cv"] = statistics.median(c for r in done if (c := cv(r["step_times_s"])) is not None)
        measured["by_steps"][str(steps)] = entry
    spread = json.loads(SPREAD_JSON.read_text()) if SPREAD_JSON.exists() else {"job": "tiny ddp x2 gloo", "conditions": {}}
    spread["conditions"][args.condition] = measured
    text = report(spread)
    print(text)
    if args.write:
        SPREAD_JSON.write_text(json.dumps(spread, indent=1) + "\n")
        write_section("Run-to-run spread of this machine", text)


def report(spread: dict[str, Any]) -> str:
    """The BENCHMARKS.md section: one row per condition and number of measured steps."""
    header = (
        "| condition | measured steps | "
        + " | ".join(f"{m} CV" for m in METRICS)
        + " | step-time CV within a run (median) | load average (min–max) |"
    )
    rows = [header, "|---|" + "---:|" * (len(METRICS) + 3)]
    commands = []
    for name, measured in spread["conditions"].items():
        steps_list = list(measured["by_steps"])
        nice = f" --nice {measured['nice']}" if measured["nice"] else ""
        commands.append(
            f"`python benchmarks/run_to_run.py --runs {measured['runs']} --steps {' '.join(steps_list)} --condition {name}{nice} --write`"
        )
        for steps, entry in measured["by_steps"].items():
            loads = [r["load"] for r in entry["runs"]]
            rows.append(
                f"| {name} | {steps} | "
                + " | ".join(pct(entry["cv"][m]) for m in METRICS)
                + f" | {pct(entry['within_run_step_time_cv'])} | {min(loads):.1f}–{max(loads):.1f} |"
            )
    return "\n".join(
        [
            f"Measured by {' and '.join(commands)} on {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}): "
            "one job (`tiny`, ddp × 2 on gloo, 2 warm-up steps) run again and again at each number of measured steps, the lengths "
            "interleaved so that each sees the same load. CV = sample standard deviation / mean over the runs (— where a run does not "
            "report the metric). The machine is shared with other work (load average on its 2 cores in the last column): *shared* "
            "runs at normal priority, as a job on a busy runner; *priority* runs at niceness −15, so that the other work yields the "
            "cores, as on a dedicated runner.",
            "",
            *rows,
            "",
            "Throughput CV by condition: "
            + "; ".join(
                f"{name} {min(cvs):.0%}–{max(cvs):.0%}"
                for name, measured in spread["conditions"].items()
                if (cvs := [e["cv"]["tokens_per_s"] for e in measured["by_steps"].values() if e["cv"]["tokens_per_s"] is not None])
            )
            + ". Each run's values and rank 0's step times are kept in `benchmarks/run_to_run_spread.json`; the synthetic series "
            "of the next section are drawn from them.",
        ]
    )


if __name__ == "__main__":
    main()
