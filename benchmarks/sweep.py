"""A sweep of `small` on this machine: calibrate, plan, run the top predicted and controls, rank.

    python benchmarks/sweep.py [--model small] [--world-size 4] [--top 8] [--controls 2] [--precisions fp32,bf16]
                               [--steps 10] [--repeats 1] [--write]

The accuracy check on this machine (predicted vs measured step time of 8 configurations, 3 repeats
each; the goal: mean absolute step-time error ≤ 15 %, Spearman ρ ≥ 0.9), on a quiet machine: the
top 4 and 4 controls spread down the ranking (a ρ over eight predictions within a few per cent of
each other would measure the host's noise), fp32 only (a CPU without bf16 instructions runs bf16
GEMMs tens of times slower: the calibration sees it, and such runs would take the hour):

    flock /tmp/emulate-helpers.lock python benchmarks/sweep.py --top 4 --controls 4 --precisions fp32 --repeats 3 --steps 10 --write

The same path as `parallab up` + `parallab sweep --wait`, without the Celery hop: a temporary
SQLite deployment, a `calibrate` run on the pool, then the sweep service plans the workload on
that profile and each queued run goes through `workers.execute.execute_run` (the Celery task's
body: the launcher, torchrun ranks, ingest). Prints and (with --write) puts in BENCHMARKS.md the
predicted and measured tokens/s of every configuration (with --repeats, the median of its runs and
its 95 % interval; the runs interleaved A1 B1 … A2 B2 …, as the sweep queues them), Spearman's ρ
with its interval, each configuration's step-time error and their mean absolute (`step_errors`),
and the best configuration found.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Settings  # noqa: E402
from backend.db import session_scope  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.services import runs, sweeps  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from workers.execute import execute_run  # noqa: E402

HEADING = "Planner: a sweep of small on this machine"
STEP_ERROR_GOAL = 0.15
"""The mean absolute step-time error a calibrated sweep must stay within."""
RHO_GOAL = 0.9
"""The Spearman ρ between predicted and measured step times a calibrated sweep must reach."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--controls", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated precisions to plan")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration, interleaved")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load_after()
    with tempfile.TemporaryDirectory(prefix="parallab-sweep-") as tmp:
        home = Path(tmp)
        settings = Settings(
            home=home, database_url=f"sqlite:///{home / 'parallab.db'}", max_world_size=args.world_size, sweep_steps=args.steps
        )
        settings.ensure_home()
        upgrade(settings.sqlalchemy_url)
        calibrate = {"workload": {"model": args.model}, "strategy": {"name": "calibrate", "world_size": args.world_size}}
        with session_scope(settings.sqlalchemy_url) as session:
            run_id = runs.submit_run(session=session, spec=JobSpec.model_validate(calibrate), settings=settings, source="cli").id
        print(f"calibrating {args.world_size} ranks on {args.model}'s shapes …", flush=True)
        assert execute_run(run_id, settings) == "succeeded", "the calibration failed"
        with session_scope(settings.sqlalchemy_url) as session:
            request = sweeps.SweepRequest(
                workload={"model": args.model},
                world_size=args.world_size,
                top=args.top,
                controls=args.controls,
                repeats=args.repeats,
                precisions=args.precisions.split(","),
            )
            sweep = sweeps.create_sweep(session=session, settings=settings, request=request, source="cli")
            candidates = list(sweep.candidates)
            planned, sweep_id = sweep.planned, sweep.id
        queue = [
            (candidate, run_ids[index])
            for index in range(args.repeats)
            for candidate in candidates
            if len(run_ids := [r for r in candidate.get("run_ids") or [candidate.get("run_id")] if r]) > index
        ]
        for i, (candidate, run_id) in enumerate(queue, 1):
            print(
                f"[{i}/{len(queue)}] {candidate['label']} {candidate['precision']} {candidate['activation_checkpointing']} …",
                flush=True,
            )
            status = execute_run(run_id, settings)
            print(f"    {status}", flush=True)
        with session_scope(settings.sqlalchemy_url) as session:
            view = sweeps.sweep_view(session=session, sweep_id=sweep_id).as_dict()
    minutes = (time.perf_counter() - started) / 60
    text = report(view, planned=planned, args=args, minutes=minutes, load_before=load_before)
    print(text)
    if args.write:
        write_section(HEADING, text)


def load_after() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def step_errors(points: list[dict]) -> list[float]:
    """Predicted over measured step time, less one, of each configuration with a measured median.
    A configuration's runs share its tokens per step, so the step-time ratio is the inverse of the
    tokens/s ratio (and the step times rank as the tokens/s do, reversed: the same ρ)."""
    out = []
    for p in points:
        predicted, measured = p["predicted"]["tokens_per_s"], p["measured"]["tokens_per_s"]
        if predicted and measured:
            out.append(measured / predicted - 1)
    return out


def accuracy_line(errors: list[float], rho: float | None) -> str:
    """The mean absolute step-time error and ρ against their goals."""
    if not errors or rho is None:
        return "**Step-time accuracy: not enough finished runs**"
    mae = sum(abs(e) for e in errors) / len(errors)
    met = mae <= STEP_ERROR_GOAL and rho >= RHO_GOAL
    return (
        f"**Mean absolute step-time error over {len(errors)} configurations: {mae:.1%}** (goal ≤ {STEP_ERROR_GOAL:.0%}); "
        f"ρ {rho:.2f} (goal ≥ {RHO_GOAL}): {'met' if met else 'not met'}"
    )


def report(view: dict, *, planned: int, args: argparse.Namespace, minutes: float, load_before: str) -> str:
    rho = view["spearman"]
    lines = [
        f"Measured by `python benchmarks/sweep.py --write` on {os.cpu_count()} CPU cores ({platform.machine()}), gloo, torch's CPU build: "
        f"a `calibrate` run on {args.world_size} ranks, then the sweep service planned `{args.model}` on {args.world_size} ranks "
        f"({planned} configurations: every strategy and option × {'/'.join(args.precisions.split(','))} × none/selective/full "
        f"× accumulation 1/2) on that profile, queued the top {args.top} by predicted tokens/s and {args.controls} controls "
        "(spread evenly down the rest of the ranking, the last the lowest predicted that fits), "
        f"{args.repeats} run(s) each, interleaved, each for {args.steps} measured steps through the worker's own path. "
        f"Took {minutes:.1f} min; load average {load_before} before, {load_after()} after.",
        "",
        f"**Spearman rank correlation, predicted vs measured tokens/s: {rho:.2f}** ({view['trust']})"
        if rho is not None
        else "**Spearman: not enough finished runs**",
        "",
        accuracy_line(step_errors(view["points"]), rho),
        "",
        "| pred. rank | role | configuration | precision | recompute | accum | status | runs "
        "| predicted tokens/s | measured tokens/s (median) | interval of the median (under 6 runs: their range) | measured / predicted "
        "| step-time error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in view["points"]:
        predicted, m = p["predicted"]["tokens_per_s"], p["measured"]
        measured = m["tokens_per_s"]
        ratio = f"{measured / predicted:.2f}" if measured and predicted else "—"
        error = f"{measured / predicted - 1:+.1%}" if measured and predicted else "—"
        shown = "—" if measured is None else f"{measured:,.0f}"
        interval = f"{m['tokens_per_s_low']:,.0f}–{m['tokens_per_s_high']:,.0f}" if m.get("tokens_per_s_low") is not None else "—"
        lines.append(
            f"| {p['predicted_rank']} | {p['role']} | {p['label']} | {p['precision']} | {p['activation_checkpointing']} | "
            f"{p['grad_accumulation_steps']} | {p['status']} | {m['runs']} | {predicted:,.0f} | {shown} | {interval} | {ratio} | {error} |"
        )
    best = view.get("best")
    if best:
        lines += [
            "",
            f"Best found: {best['label']} ({best['precision']}, recompute {best['activation_checkpointing']}, "
            f"accumulation {best['grad_accumulation_steps']}) at {best['measured']['tokens_per_s']:,.0f} tokens/s.",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
