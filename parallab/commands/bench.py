"""`parallab bench`: run one job through torchrun on this machine, no server, and write its result.

The job comes from `--spec FILE` (the API's JSON), the flags laid over it; it is resolved once,
under this host's limits (`Settings.limits`, every ceiling), exactly as a submission is.
The result is written whatever its checks say; a failed check is printed and sets the exit status
(`bench_checks`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from parallab.commands.bench_checks import EXIT_FAILED_CHECK, report
from parallab.commands.jobspec import (
    HF_CONFIG_HELP,
    fail,
    layout_flags,
    parse_options,
    read_hf_config_file,
    resolve,
    spec_document,
    with_workload_flags,
)
from parallab.core.jobs import ResolvedJob
from parallab.core.result import ResultDocument
from parallab.core.spec import JobSpec, workload_fields
from parallab.core.stats import median_interval
from parallab.core.strategies import STRATEGY_NAMES

console = Console(stderr=True)


def read_spec(path: Path) -> dict[str, Any]:
    """A job spec file's JSON object; exits 2 when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"--spec {path}: {exc}")
    if not isinstance(doc, dict):
        fail(f"--spec {path}: expected a JSON object (a job spec), got {type(doc).__name__}")
    return doc


@with_workload_flags(workload_fields())
def bench(
    strategy: Annotated[str | None, typer.Option("--strategy", "-s", help=f"{', '.join(STRATEGY_NAMES)}. Default: single.")] = None,
    world_size: Annotated[int | None, typer.Option("--world-size", "-n", help="Ranks. Default: 1.")] = None,
    spec: Annotated[
        Path | None, typer.Option(help="A whole job spec (the API's JSON); the flags override it.", exists=True, dir_okay=False)
    ] = None,
    hf_config: Annotated[Path | None, typer.Option("--hf-config", help=HF_CONFIG_HELP, dir_okay=False)] = None,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help="Strategy option key=value (JSON value); repeat.")] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            help="A layout of degrees, e.g. pp=2,dp_shard=2,tp=2 (the `layout` strategy); the world size defaults to their product."
        ),
    ] = None,
    trace: Annotated[bool | None, typer.Option("--trace/--no-trace", help=JobSpec.model_fields["trace"].description)] = None,
    repeats: Annotated[
        int | None, typer.Option("--repeats", help="Run the job this many times, one after the other (OUT-1.json, OUT-2.json, …).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where to write the result document.")] = Path("result.json"),
    run_dir: Annotated[Path | None, typer.Option(help="Keep the ranks' records and logs here (default: a temp dir).")] = None,
    allow_failed_checks: Annotated[
        bool,
        typer.Option(
            "--allow-failed-checks",
            help=f"Exit 0 even when a correctness check failed (it is still printed; without this flag: exit {EXIT_FAILED_CHECK}).",
        ),
    ] = False,
    *,
    workload: dict[str, Any],
) -> None:
    """Run one job through torchrun on this machine, no server, and write its result document."""
    from backend.config import get_settings
    from workers.execute import run_and_collect

    settings = get_settings()
    try:
        options = parse_options(option or [])
    except ValueError as exc:
        fail(str(exc))
    if layout is not None:
        strategy, world_size, options = layout_flags(layout, strategy=strategy, world_size=world_size, options=options)
    if hf_config is not None:
        workload = {**workload, "hf_config": read_hf_config_file(hf_config)[0]}
    base = read_spec(spec) if spec else {"strategy": {"name": "single"}}
    doc = spec_document(base, strategy=strategy, world_size=world_size, options=options, workload=workload, trace=trace)
    if repeats is not None:
        doc["repeats"] = repeats
    # The deployment's limits, every ceiling, as a submission has them; only the refusal's wording differs.
    job = resolve(doc, settings.limits.model_copy(update={"whose": "parallab bench's (the PARALLAB_MAX_* settings raise it)"}))

    directory = run_dir or Path(tempfile.mkdtemp(prefix="parallab-bench-"))
    repeats = job.spec.repeats
    medians: list[float] = []
    failed = False
    for index in range(1, repeats + 1):  # one after the other: the host's noise falls on each alike
        where = directory / f"repeat-{index}" if repeats > 1 else directory
        with _progress(job) as on_progress:
            collected = run_and_collect(job, where, settings=settings, on_progress=on_progress)
        if collected.document is None:
            console.print(f"[red]{collected.error}[/red]")
            raise typer.Exit(1)
        path = out if repeats == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")
        path.write_text(collected.document.model_dump_json(indent=2))
        medians.append(collected.document.summary.step_time_s.median)
        failed |= _print_result(job, collected.document)
        console.print(f"result written to {path}")
    if repeats > 1:
        m = median_interval(medians)
        console.print(
            f"{repeats} runs: median step {m.estimate * 1e3:.1f} ms, {m.coverage:.0%} interval "
            f"{m.low * 1e3:.1f}–{m.high * 1e3:.1f} ms, spread {min(medians) * 1e3:.1f}–{max(medians) * 1e3:.1f} ms"
        )
    if failed and not allow_failed_checks:
        console.print(f"exit {EXIT_FAILED_CHECK}: a correctness check failed (--allow-failed-checks exits 0)", style="bold red")
        raise typer.Exit(EXIT_FAILED_CHECK)


def _print_result(job: ResolvedJob, document: ResultDocument) -> bool:
    """The run's line, then its failed checks and flags (`bench_checks.report`); whether a check failed."""
    s = document.summary
    lines, checks_failed = report(document, str(job.workload.precision))
    colour = "red" if checks_failed else "green"
    head = f"[{colour}]{job.strategy} × {job.world_size}[/{colour}]: {s.tokens_per_s:,.0f} tokens/s"
    diff = s.loss_max_rel_diff_vs_reference
    if diff is not None:
        head += f", step {s.step_time_s.median * 1e3:.1f} ms (median), loss diff vs single {diff:.2e}"
    console.print(head)
    flags = False
    for line in lines:
        flags = flags or line.startswith("Flagged")
        console.print(line, style="yellow" if flags else "bold red", markup=False, soft_wrap=True)
    return checks_failed


@contextmanager
def _progress(job: ResolvedJob) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A rich progress bar over the warm-up and measured steps; yields the ranks' progress callback."""
    warmup = int(job.workload.warmup_steps)
    total = warmup + int(job.workload.steps)
    name = f"{job.strategy} × {job.world_size}"
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(f"{name} on {job.workload.model}: starting ranks", total=total)

        def on_progress(p: dict[str, Any]) -> None:
            phase = p.get("phase", "train")
            done = p.get("step", 0) + 1 + (warmup if phase == "train" else 0)
            loss = p.get("loss")
            label = f"{name}: {phase}" + (f" loss {loss:.4f}" if isinstance(loss, (int, float)) else "")
            bar.update(task, completed=min(done, total) if phase != "reference" else total, description=label)

        yield on_progress
