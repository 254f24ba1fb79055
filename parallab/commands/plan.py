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
from parallab.core.costs import precision_recipe
from parallab.core.jobs import Limits, ResolvedJob
from parallab.core.model import FFN_MULTIPLE
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
    _print_table(job, workload, prediction)


def _notes(job: ResolvedJob, given: dict[str, Any]) -> list[str]:
    """What the reader of a custom plan must know: what was derived, and what the preset still set."""
    wl = job.workload_document()
    notes = []
    if "ffn_hidden_size" not in given and "ffn_hidden_size" in job.custom_fields:
        notes.append(
            f"ffn_hidden_size {wl['ffn_hidden_size']:,} derived from hidden_size (SwiGLU: 8/3·h rounded up to a "
            f"multiple of {FFN_MULTIPLE}); set it with --ffn-hidden"
        )
    if job.custom_fields:
        kept = [f"{name} {wl[name]:,}" for name in ("seq_len", "global_batch_size", "num_experts") if name not in given]
        if kept:
            notes.append(f"from the preset {wl['model']}: {', '.join(kept)}")
    notes.append(f"model state: {precision_recipe(job.workload.precision)}")
    return notes


def _print_table(job: ResolvedJob, given: dict[str, Any], prediction: dict[str, Any]) -> None:
    workload, strategy = job.workload_document(), job.strategy_document()
    title = (
        f"{strategy['name']} × {strategy['world_size']} — {job.model_label}: L={workload['num_layers']} "
        f"h={workload['hidden_size']} A={workload['num_heads']} ffn={workload['ffn_hidden_size']} "
        f"V={workload['vocab_size']} T={workload['seq_len']}, {workload['precision']} — Ψ={prediction['params_total']:,} parameters"
    )
    table = Table(title=title, caption="\n".join(_notes(job, given)), show_header=True)
    table.add_column("what")
    table.add_column("per rank / per step", justify="right")
    state = prediction["model_state_bytes_per_rank"]
    for part in ("params", "grads", "optimizer"):
        table.add_row(f"model state: {part} ({prediction['bytes_per_param'][part]} B/param)", human_bytes(state[part]))
    table.add_row("model state: total", human_bytes(sum(state.values())))
    activations = prediction.get("activations") or {}
    in_flight = activations.get("microbatches_in_flight", 1)
    batches = f"{in_flight} micro-batch{'es' if in_flight != 1 else ''}"
    table.add_row(
        f"activations (recompute {activations.get('recompute', 'none')}, {batches} in flight)",
        human_bytes(prediction.get("activation_bytes_per_rank")),
    )
    if activations.get("weight_copies"):
        table.add_row("  of which autocast's 16-bit weight copies", human_bytes(activations["weight_copies"]))
    if activations:
        table.add_row("  one layer, one micro-batch: this model", human_bytes(activations.get("per_layer_bytes")))
        table.add_row("  one layer, one micro-batch: Korthikanti's GPT", human_bytes(activations.get("paper_per_layer_bytes")))
    wire = prediction.get("wire_bytes_per_step") or {}
    for op, nbytes in (prediction.get("comm_bytes_per_step") or {}).items():
        table.add_row(f"comm: {op} (buffer)", human_bytes(nbytes))
        if op in wire:
            table.add_row(f"comm: {op} (on the wire)", human_bytes(wire[op]))
    if prediction.get("bubble_fraction") is not None:
        table.add_row("pipeline bubble", f"{prediction['bubble_fraction']:.1%}")
    table.add_row("model FLOPs per token", f"{prediction['flops_per_token']:,}")
    zero = "2+2+12" if job.workload.precision != "fp32" else "4+4+8"
    for stage, value in (prediction.get("zero_stages_bytes_per_rank") or {}).items():
        table.add_row(f"ZeRO {stage} (paper, {zero})", human_bytes(value))
    Console().print(table)
