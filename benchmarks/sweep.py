"""A sweep of `small` on this machine: calibrate, plan, run the top predicted and controls, rank.

    python benchmarks/sweep.py [--model small] [--world-size 4] [--top 8] [--controls 2] [--precisions fp32,bf16]
                               [--steps 10] [--repeats 1] [--recalibrate] [--home DIR] [--write]

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

With `--recalibrate` the pool is calibrated again before each round of runs (a round: one run of
every configuration), and each run is read against the calibration just before it as well as the
sweep's first: on a shared host the speed drifts over the minutes a sweep takes by as much as the
goal, one calibration's point is one window that may catch the host busy, and the host-speed
probe follows neither (BENCHMARKS.md), so only a calibration next to the runs in time separates
the model's error from the host's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Settings  # noqa: E402
from backend.db import session_scope  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.models import Run  # noqa: E402
from backend.services import hardware, runs, sweeps  # noqa: E402
from backend.store import series  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from parallab.core.ranking import evaluate  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from parallab.core.stats import spearman_rho  # noqa: E402
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
    parser.add_argument("--home", type=Path, help="keep the deployment (its database and run folders) here, to read the runs after")
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="calibrate again before each round of runs and read each run against the calibration just before it, too",
    )
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load_after()
    with contextlib.nullcontext(str(args.home)) if args.home else tempfile.TemporaryDirectory(prefix="parallab-sweep-") as tmp:
        home = Path(tmp)
        settings = Settings(
            home=home, database_url=f"sqlite:///{home / 'parallab.db'}", max_world_size=args.world_size, sweep_steps=args.steps
        )
        settings.ensure_home()
        upgrade(settings.sqlalchemy_url)
        calibration_id = calibrate(settings, args)
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
        rounds = [
            [(candidate, run_ids[index]) for candidate in candidates if len(run_ids := sweeps.candidate_run_ids(candidate)) > index]
            for index in range(args.repeats)
        ]
        queue = [pair for entries in rounds for pair in entries]
        predicted_in_round: dict[str, float] = {}
        i = 0
        for index, entries in enumerate(rounds):
            if args.recalibrate:
                if index > 0:
                    calibrate(settings, args)
                predicted_in_round |= predictions_now(settings, [run_id for _, run_id in entries])
            for candidate, run_id in entries:
                i += 1
                print(
                    f"[{i}/{len(queue)}] {candidate['label']} {candidate['precision']} {candidate['activation_checkpointing']} …",
                    flush=True,
                )
                status = execute_run(run_id, settings)
                print(f"    {status}", flush=True)
        with session_scope(settings.sqlalchemy_url) as session:
            view = sweeps.sweep_view(session=session, sweep_id=sweep_id).as_dict()
            speeds = probe_rates(series.host_speeds(session, [calibration_id, *(r for _, r in queue)]))
            measured_runs = {run_id: run.tokens_per_s for _, run_id in queue if (run := session.get(Run, run_id)) is not None}
    minutes = (time.perf_counter() - started) / 60
    text = report(view, planned=planned, args=args, minutes=minutes, load_before=load_before)
    text += "\n\n" + host_speed_section(view, speeds, calibration_id)
    if args.recalibrate:
        text += "\n\n" + recalibrated_section(view, predicted_in_round, measured_runs)
    print(text)
    if args.write:
        write_section(HEADING, text)


def calibrate(settings: Settings, args: argparse.Namespace) -> str:
    """Run a `calibrate` job on the pool (it becomes the pool's latest profile); its run id."""
    spec = {"workload": {"model": args.model}, "strategy": {"name": "calibrate", "world_size": args.world_size}}
    with session_scope(settings.sqlalchemy_url) as session:
        calibration_id = runs.submit_run(session=session, spec=JobSpec.model_validate(spec), settings=settings, source="cli").id
    print(f"calibrating {args.world_size} ranks on {args.model}'s shapes …", flush=True)
    assert execute_run(calibration_id, settings) == "succeeded", "the calibration failed"
    return calibration_id


def predictions_now(settings: Settings, run_ids: list[str]) -> dict[str, float]:
    """Each queued run's predicted tokens/s on the pool's latest calibration, read as the planner
    reads it (`ranking.evaluate` on the run's spec)."""
    with session_scope(settings.sqlalchemy_url) as session:
        hw = hardware.pool_hardware(session=session, settings=settings)
        out = {}
        for run_id in run_ids:
            run = session.get(Run, run_id)
            if run is not None and (predicted := evaluate(run.spec, hw).tokens_per_s):
                out[run_id] = predicted
    return out


def recalibrated_section(view: dict, predicted: dict[str, float], measured: dict[str, float | None]) -> str:
    """Each run read against the calibration timed just before its round, not the sweep's first:
    a configuration's error is the median over its runs of measured ÷ predicted, less one; ρ ranks
    the configurations' median predictions against their measured medians. What it removes is the
    host's drift between one calibration and runs minutes later, not any term of the model."""
    lines = [
        "Each round's runs against the calibration timed just before that round (`--recalibrate`: one calibration a round; "
        "each run predicted on the profile of its own round):",
        "",
        "| configuration | precision | recompute | accum | predicted tokens/s, each round | measured tokens/s, each run "
        "| step-time error against its round's calibration (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    predictions, measurements, errors = [], [], []
    for p in view["points"]:
        pairs = [(predicted[r], got) for r in sweeps.candidate_run_ids(p) if r in predicted and (got := measured.get(r))]
        if not pairs:
            continue
        error = statistics.median(got / tps - 1 for tps, got in pairs)
        errors.append(error)
        predictions.append(statistics.median(tps for tps, _ in pairs))
        measurements.append(statistics.median(got for _, got in pairs))
        lines.append(
            f"| {p['label']} | {p['precision']} | {p['activation_checkpointing']} | {p['grad_accumulation_steps']} | "
            f"{', '.join(f'{tps:,.0f}' for tps, _ in pairs)} | {', '.join(f'{got:,.0f}' for _, got in pairs)} | {error:+.1%} |"
        )
    rho = spearman_rho(predictions, measurements)
    return "\n".join([*lines, "", "Against each round's own calibration: " + accuracy_line(errors, rho)])


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


def probe_rates(stored: dict[str, Any]) -> dict[str, float]:
    """Each run's host speed (the probe's mean ops/s, one lane per rank, timed in the ranks around
    their measurements), where it was timed there: a launch-side probe is another unit."""
    return {run_id: float(h["ops_per_s"]) for run_id, h in stored.items() if h.get("where") == "steps"}


def host_speed_section(view: dict, speeds: dict[str, float], calibration_id: str) -> str:
    """The host's speed at each configuration's runs against the calibration's, and each step-time
    error read at the host speed its runs had: the prediction's tokens/s times the ratio of the
    runs' probe (their median) to the calibration's. The ratio is measured by a fixed piece of
    work (`parallab.core.hostspeed`), not fitted to the runs' step times: what it moves is the
    host's load between the calibration and the run, not the model's terms."""
    base = speeds.get(calibration_id)
    if not base:
        return "Host speed: the calibration has no probe timed in its ranks; no reading at the runs' host speed."
    lines = [
        f"Host speed (the probe `parallab.core.hostspeed`, in the ranks around the measurements): the calibration's "
        f"{base / 1e6:.2f} Mops/s a lane. Each configuration's runs against it, and its step-time error with the prediction "
        "carried to its runs' host speed (predicted tokens/s × runs' speed ÷ calibration's):",
        "",
        "| configuration | precision | recompute | accum | runs' host speed ÷ calibration's | step-time error | at the runs' host speed |",
        "|---|---|---|---|---|---|---|",
    ]
    predicted_at, measured, errors = [], [], []
    for p in view["points"]:
        ratios = [speeds[r] / base for r in sweeps.candidate_run_ids(p) if r in speeds]
        tps, got = p["predicted"]["tokens_per_s"], p["measured"]["tokens_per_s"]
        if not ratios or not tps or not got:
            continue
        factor = statistics.median(ratios)
        carried = tps * factor
        predicted_at.append(carried)
        measured.append(got)
        errors.append(got / carried - 1)
        lines.append(
            f"| {p['label']} | {p['precision']} | {p['activation_checkpointing']} | {p['grad_accumulation_steps']} | "
            f"{factor:.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {got / tps - 1:+.1%} | {errors[-1]:+.1%} |"
        )
    rho = spearman_rho(predicted_at, measured)
    return "\n".join([*lines, "", "At the runs' host speed: " + accuracy_line(errors, rho)])


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
