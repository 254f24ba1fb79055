"""`parallab plan`: the prediction for a job — memory per rank, communication per step, bubble.

Pure arithmetic over the config (`parallab.core.prediction`); nothing runs, no torch, no server.
Planning is for any cluster, so neither the world size nor the steps have a limit here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.jobspec import fail, parse_options, resolve, spec_document, with_workload_flags
from parallab.core.jobs import Limits
from parallab.core.prediction import predict
from parallab.core.spec import workload_fields
from parallab.core.strategies import TRAINING_STRATEGIES

PLAN_FIELDS = tuple(f for f in workload_fields() if f.workload_key or f.name == "model")
"""The preset and the fields of the workload key: all the prediction reads. Steps, seed, learning
rate (and the numerics-only norm_eps, rope_theta) change nothing it computes, so plan has no flag for them."""


def human_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return str(n)


@with_workload_flags(PLAN_FIELDS)
def plan(
    strategy: Annotated[str, typer.Option("--strategy", "-s", help=f"{', '.join(TRAINING_STRATEGIES)}.")],
    world_size: Annotated[int, typer.Option("--world-size", "-n", help="Ranks.")] = 1,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help="Strategy option key=value (JSON value); repeat.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    *,
    workload: dict[str, Any],
) -> None:
    """Predict model state per rank, communication per step and the pipeline bubble, before running."""
    try:
        options = parse_options(option or [])
    except ValueError as exc:
        fail(str(exc))
    doc = spec_document({}, strategy=strategy, world_size=world_size, options=options, workload=workload)
    job = resolve(doc, Limits())
    if not job.trains:
        fail(f"strategy.name: {strategy} trains nothing, so there is nothing to predict; plan one of {', '.join(TRAINING_STRATEGIES)}")
    prediction = predict(job)
    if json_out:
        typer.echo(json.dumps({"workload": job.workload_document(), "strategy": job.strategy_document(), **prediction}, indent=2))
        return
    _print_table(job.workload_document(), job.strategy_document(), prediction)


def _print_table(workload: dict[str, Any], strategy: dict[str, Any], prediction: dict[str, Any]) -> None:
    title = (
        f"{strategy['name']} × {strategy['world_size']} — {workload['model']} "
        f"(L={workload['num_layers']} h={workload['hidden_size']} V={workload['vocab_size']} T={workload['seq_len']}, "
        f"{workload['precision']}, Ψ={prediction['params_total']:,})"
    )
    table = Table(title=title, show_header=True)
    table.add_column("what")
    table.add_column("per rank / per step", justify="right")
    state = prediction["model_state_bytes_per_rank"]
    for part in ("params", "grads", "optimizer"):
        table.add_row(f"model state: {part}", human_bytes(state[part]))
    table.add_row("model state: total", human_bytes(sum(state.values())))
    table.add_row("activations (estimate)", human_bytes(prediction.get("activation_bytes_per_rank")))
    for op, nbytes in (prediction.get("comm_bytes_per_step") or {}).items():
        table.add_row(f"comm: {op}", human_bytes(nbytes))
    if prediction.get("bubble_fraction") is not None:
        table.add_row("pipeline bubble", f"{prediction['bubble_fraction']:.1%}")
    table.add_row("model FLOPs per token", f"{prediction['flops_per_token']:,}")
    for stage, value in (prediction.get("zero_stages_bytes_per_rank") or {}).items():
        table.add_row(f"ZeRO {stage} (paper)", human_bytes(value))
    Console().print(table)
