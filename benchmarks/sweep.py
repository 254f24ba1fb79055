"""A sweep of `small` on this machine: calibrate, plan, run the top predicted and controls, rank.

    python benchmarks/sweep.py [--model small] [--world-size 4] [--top 8] [--controls 2] [--steps 10] [--repeats 1] [--write]

The same path as `parallab up` + `parallab sweep --wait`, without the Celery hop: a temporary
SQLite deployment, a `calibrate` run on the pool, then the sweep service plans the workload on
that profile and each queued run goes through `workers.execute.execute_run` (the Celery task's
body: the launcher, torchrun ranks, ingest). Prints and (with --write) puts in BENCHMARKS.md the
predicted and measured tokens/s of every configuration (with --repeats, the median of its runs and
its 95 % interval; the runs interleaved A1 B1 … A2 B2 …, as the sweep queues them), Spearman's ρ
with its interval, and the best configuration found.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--controls", type=int, default=2)
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
                workload={"model": args.model}, world_size=args.world_size, top=args.top, controls=args.controls, repeats=args.repeats
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


def report(view: dict, *, planned: int, args: argparse.Namespace, minutes: float, load_before: str) -> str:
    rho = view["spearman"]
    lines = [
        f"Measured by `python benchmarks/sweep.py --write` on {os.cpu_count()} CPU cores ({platform.machine()}), gloo, torch's CPU build: "
        f"a `calibrate` run on {args.world_size} ranks, then the sweep service planned `{args.model}` on {args.world_size} ranks "
        f"({planned} configurations: every strategy and option × fp32/bf16 × none/selective/full × accumulation 1/2) on that profile, "
        f"queued the top {args.top} by predicted tokens/s and {args.controls} controls (the lowest predicted that fit), "
        f"{args.repeats} run(s) each, interleaved, each for {args.steps} measured steps through the worker's own path. "
        f"Took {minutes:.1f} min; load average {load_before} before, {load_after()} after.",
        "",
        f"**Spearman rank correlation, predicted vs measured tokens/s: {rho:.2f}** ({view['trust']})"
        if rho is not None
        else "**Spearman: not enough finished runs**",
        "",
        "| pred. rank | role | configuration | precision | recompute | accum | status | runs "
        "| predicted tokens/s | measured tokens/s (median) | interval of the median (under 6 runs: their range) | measured / predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in view["points"]:
        predicted, m = p["predicted"]["tokens_per_s"], p["measured"]
        measured = m["tokens_per_s"]
        ratio = f"{measured / predicted:.2f}" if measured and predicted else "—"
        shown = "—" if measured is None else f"{measured:,.0f}"
        interval = f"{m['tokens_per_s_low']:,.0f}–{m['tokens_per_s_high']:,.0f}" if m.get("tokens_per_s_low") is not None else "—"
        lines.append(
            f"| {p['predicted_rank']} | {p['role']} | {p['label']} | {p['precision']} | {p['activation_checkpointing']} | "
            f"{p['grad_accumulation_steps']} | {p['status']} | {m['runs']} | {predicted:,.0f} | {shown} | {interval} | {ratio} |"
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
