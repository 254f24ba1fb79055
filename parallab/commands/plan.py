"""`parallab plan`: the prediction for a job — memory per rank, communication per step, bubble —
or, without `--strategy`, the ranking of every configuration of the workload on a cluster:

    parallab plan --model llama-8b --device h100 --nodes 2 --gpus-per-node 8

lists every strategy and degree (dp × tp × pp × cp × ep), micro-batching, recomputation and
precision that fits, fastest predicted first, with its memory per rank, step time and tokens/s,
and says why each of the others does not fit (`parallab.core.planner`; docs/planner.md).

Pure arithmetic over the config; nothing runs, no torch — except `--dry-run`, which runs the
real rank code of the job's layout at its world size under a fake process group
(`parallab.commands.dryrun`). Planning is for any cluster, so neither
the world size nor the steps have a limit here. `--pool` plans on a pool's calibrated hardware
(read from this deployment's database).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

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
from parallab.core.activations import SELECTIVE_POLICIES
from parallab.core.costs import precision_recipe
from parallab.core.jobs import Limits, ResolvedJob
from parallab.core.model import FFN_MULTIPLE, PRESETS, SCALED_FFN_MULTIPLE
from parallab.core.prediction import predict
from parallab.core.problems import RecipeError
from parallab.core.run_recipe import PARALLAB, RunRecipe
from parallab.core.spec import workload_fields
from parallab.core.strategies import TRAINING_STRATEGIES
from parallab.core.units import format_bytes

if TYPE_CHECKING:
    from parallab.core.plan_hardware import Hardware
    from parallab.core.ranking import Ranking

PLAN_FIELDS = tuple(f for f in workload_fields() if f.workload_key or f.name == "model")
"""The preset and the fields of the workload key: all the prediction reads. Steps, seed, learning
rate (and the numerics-only norm_eps, rope_theta) change nothing it computes, so plan has no flag for them."""


@with_workload_flags(PLAN_FIELDS)
def plan(
    strategy: Annotated[
        str | None, typer.Option("--strategy", "-s", help=f"{', '.join(TRAINING_STRATEGIES)}. Without it: rank every configuration.")
    ] = None,
    world_size: Annotated[int | None, typer.Option("--world-size", "-n", help="Ranks (default 1; ranking: every device).")] = None,
    hf_config: Annotated[Path | None, typer.Option("--hf-config", help=HF_CONFIG_HELP, dir_okay=False)] = None,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help="Strategy option key=value (JSON value); repeat.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    device: Annotated[
        str | None, typer.Option("--device", help="Ranking: a catalogue device (h100, a100, h200, b200, mi300x, cpu, ...).")
    ] = None,
    nodes: Annotated[int, typer.Option("--nodes", help="Ranking: nodes of --device.", min=1)] = 1,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="Ranking: devices per node (default: the catalogue's).", min=1)
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Ranking: plan on this pool's calibrated hardware (this deployment's database).")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Ranking: list this many of the configurations that fit.", min=1)] = 20,
    show_all: Annotated[bool, typer.Option("--all", help="Ranking: list every rejected configuration, not a summary.")] = False,
    layout: Annotated[
        str | None,
        typer.Option("--layout", help="A layout of degrees, e.g. pp=2,dp_shard=2,tp=2; world size: their product."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Run the real rank code at the world size under a fake process group and check the prediction."),
    ] = False,
    explain: Annotated[
        bool,
        typer.Option("--explain", help="With --strategy and --device: the step and the memory decomposed, each term with its formula."),
    ] = False,
    loss_parallel: Annotated[
        bool,
        typer.Option(
            "--loss-parallel", help="Predict with the head's output sharded over the vocabulary under TP (torchtitan's loss parallel)."
        ),
    ] = False,
    compiled_loss: Annotated[
        bool,
        typer.Option(
            "--compiled-loss",
            help="Predict with the cross-entropy compiled (torchtitan with compile since April 2025): the 16-bit logits kept, "
            "their gradient in their dtype. --compile alone compiles the blocks, as parallab's ranks do.",
        ),
    ] = False,
    selective_policy: Annotated[
        str,
        typer.Option(
            "--selective-policy",
            help=f"What selective recomputation keeps: {'; '.join(f'{k}: {v}' for k, v in SELECTIVE_POLICIES.items())}.",
        ),
    ] = "every_matmul",
    *,
    workload: dict[str, Any],
) -> None:
    """Predict one job (--strategy), or rank every configuration of the workload on a cluster (--device / --pool)."""
    given = dict(workload)  # what the flags set, and (below) what the config file does
    recipe = run_recipe(loss_parallel=loss_parallel, compiled_loss=compiled_loss, selective_policy=selective_policy)
    if hf_config is not None:
        doc, shape = read_hf_config_file(hf_config)
        given = {**shape.fields, **workload, "hf_config": f"{hf_config} (model_type {shape.model_type})"}
        workload = {**workload, "hf_config": doc}
    if layout is not None:
        try:
            options = parse_options(option or [])
        except ValueError as exc:
            fail(str(exc))
        strategy, world_size, layout_options = layout_flags(layout, strategy=strategy, world_size=world_size, options=options)
        option = [f"{k}={json.dumps(v)}" for k, v in layout_options.items()]
    if strategy is None:
        if dry_run:
            fail("--dry-run: give the job to run, with --strategy or --layout")
        if explain:
            fail("--explain: give the one configuration to decompose, with --strategy or --layout, and --device")
        _rank(workload, device=device, nodes=nodes, gpus_per_node=gpus_per_node, pool=pool, world_size=world_size, recipe=recipe)(
            top=top, json_out=json_out, show_all=show_all
        )
        return
    world_size = world_size or 1
    try:
        options = parse_options(option or [])
    except ValueError as exc:
        fail(str(exc))
    doc = spec_document({}, strategy=strategy, world_size=world_size, options=options, workload=workload)
    job = resolve(doc, _limits(), predict_only=not dry_run)
    if not job.trains:
        fail(f"strategy.name: {strategy} trains nothing, so there is nothing to predict; plan one of {', '.join(TRAINING_STRATEGIES)}")
    if dry_run:
        from parallab.commands.dryrun import dry_run_command

        dry_run_command(job, json_out=json_out)
        return
    hw = _hardware(device, nodes, gpus_per_node, pool) if (device or pool) else None
    _predict_one(job, hw, given, recipe, explain=explain, json_out=json_out)


def run_recipe(*, loss_parallel: bool, compiled_loss: bool, selective_policy: str) -> RunRecipe:
    """The flags' recipe, or the CLI's message naming the flag it cannot take."""
    try:
        return RunRecipe(loss_parallel=loss_parallel, compiled_loss=compiled_loss, selective_policy=selective_policy)
    except RecipeError as exc:
        flag_error(exc)


def flag_error(exc: RecipeError) -> NoReturn:
    """A recipe the planner does not count, as the CLI says it: the flag that set the field, and why."""
    fail(f"--{exc.field.replace('_', '-')}: {exc.problem}")


def _predict_one(job: ResolvedJob, hw: Hardware | None, given: dict[str, Any], recipe: RunRecipe, *, explain: bool, json_out: bool) -> None:
    """One job's prediction (on `hw` when given: its step time, band and what it does not model), or its explanation."""
    if explain:
        if hw is None:
            fail("--explain: give the hardware to time the step on, with --device (or --pool)")
        _print_explain(job, hw, recipe, json_out=json_out)
        return
    try:
        prediction = predict(job, hw, recipe)
    except RecipeError as exc:  # a recipe the planner does not count for this model
        flag_error(exc)
    if json_out:
        doc = {"workload": job.workload_document(), "strategy": job.strategy_document(), **prediction}
        typer.echo(json.dumps({**doc, "run_recipe": dataclasses.asdict(recipe)}, indent=2))
        return
    _print_table(job, given, prediction, recipe)


def _notes(job: ResolvedJob, given: dict[str, Any]) -> list[str]:
    """What the reader of a custom plan must know: what was derived, and what the preset still set."""
    wl = job.workload_document()
    notes = []
    if "ffn_hidden_size" not in given and "ffn_hidden_size" in job.custom_fields:
        preset = PRESETS.get(str(wl["model"]))
        rule = (
            f"the {wl['model']} architecture's own f/h ratio, rounded up to a multiple of {SCALED_FFN_MULTIPLE}"
            if preset is not None and preset.source
            else f"SwiGLU: 8/3·h rounded up to a multiple of {FFN_MULTIPLE}"
        )
        notes.append(f"ffn_hidden_size {wl['ffn_hidden_size']:,} derived from hidden_size ({rule}); set it with --ffn-hidden")
    if "hf_config" in given:
        notes.append(f"shape from --hf-config {given['hf_config']}")
    if job.custom_fields:
        kept = [f"{name} {wl[name]:,}" for name in ("seq_len", "global_batch_size", "num_experts") if name not in given]
        if kept:
            notes.append(f"from the preset {wl['model']}: {', '.join(kept)}")
    notes.append(f"model state: {precision_recipe(job.workload.precision)}")
    return notes


def _print_table(job: ResolvedJob, given: dict[str, Any], prediction: dict[str, Any], recipe: RunRecipe) -> None:
    workload, strategy = job.workload_document(), job.strategy_document()
    title = (
        f"{strategy['name']} × {strategy['world_size']} — {job.model_label}: L={workload['num_layers']} "
        f"h={workload['hidden_size']} A={workload['num_heads']} KV={workload['num_kv_heads']} "
        f"ffn={workload['ffn_hidden_size']} "
        f"V={workload['vocab_size']} T={workload['seq_len']}, {workload['precision']} — Ψ={prediction['params_total']:,} parameters"
    )
    table = Table(title=title, caption="\n".join(_notes(job, given)), show_header=True)
    table.add_column("what")
    table.add_column("per rank / per step", justify="right")
    state = prediction["model_state_bytes_per_rank"]
    for part in ("params", "grads", "optimizer"):
        table.add_row(f"model state: {part} ({prediction['bytes_per_param'][part]} B/param)", format_bytes(state[part]))
    table.add_row("model state: total", format_bytes(sum(state.values())))
    activations = prediction.get("activations") or {}
    in_flight = activations.get("microbatches_in_flight", 1)
    batches = f"{in_flight} micro-batch{'es' if in_flight != 1 else ''}"
    table.add_row(
        f"activations (recompute {activations.get('recompute', 'none')}, {batches} in flight)",
        format_bytes(prediction.get("activation_bytes_per_rank")),
    )
    if activations.get("weight_copies"):
        table.add_row("  of which autocast's 16-bit weight copies", format_bytes(activations["weight_copies"]))
    if prediction.get("backward_temporary_bytes_per_rank"):
        table.add_row(
            "the logits' gradient (backward, beside the activations)", format_bytes(prediction["backward_temporary_bytes_per_rank"])
        )
    if activations:
        table.add_row("  one layer, one micro-batch, kept: this model", format_bytes(activations.get("per_layer_bytes")))
        table.add_row("  one layer, one micro-batch: Korthikanti's GPT", format_bytes(activations.get("paper_per_layer_bytes")))
    wire = prediction.get("wire_bytes_per_step") or {}
    for op, nbytes in (prediction.get("comm_bytes_per_step") or {}).items():
        table.add_row(f"comm: {op} (buffer)", format_bytes(nbytes))
        if op in wire:
            table.add_row(f"comm: {op} (on the wire)", format_bytes(wire[op]))
    if prediction.get("bubble_fraction") is not None:
        formula = (prediction.get("pipeline") or {}).get("bubble_formula")
        table.add_row("pipeline bubble", f"{prediction['bubble_fraction']:.1%}" + (f"  {formula}" if formula else ""))
    table.add_row("model FLOPs per token", f"{prediction['flops_per_token']:,}")
    if recipe != PARALLAB:
        said = [f"{k.replace('_', ' ')}: {v}" for k, v in dataclasses.asdict(recipe).items() if v != getattr(PARALLAB, k)]
        table.add_row("recipe beyond the spec", ", ".join(said))
    if prediction.get("step_time_s") is not None:
        table.add_row("step time (estimate)", f"{prediction['step_time_s'] * 1e3:,.1f} ms {band_label(prediction)}")
        table.add_row("not modelled", escape(", ".join(prediction.get("not_modelled") or []) or "—"))
    else:  # the counts above are exact formulas; a time, and its band, need hardware
        table.add_row("step time (estimate)", escape(NO_HARDWARE))
    from parallab.core.recipes import not_runnable_here

    for line in not_runnable_here(job):  # a predicted-only recipe: the plan stands, a run of it is refused
        table.add_row("not runnable here", escape(line))
    zero = "2+2+12" if job.workload.precision != "fp32" else "4+4+8"
    for stage, value in (prediction.get("zero_stages_bytes_per_rank") or {}).items():
        table.add_row(f"ZeRO {stage} (paper, {zero})", format_bytes(value))
    Console().print(table)


NO_HARDWARE = (
    "not estimated: no hardware, so no time and no error band — give --device (or --pool) for a step time "
    "with its band; the memory above is allocated bytes by formula (the reserved peak needs a device profile)"
)
"""What a plan without hardware prints where the step time and its band would be."""


def band_label(accuracy: dict[str, Any] | None) -> str:
    """ "±X % (n held-out runs)", or the regime's label where no published run of the kind validates it."""
    accuracy = accuracy or {}
    band = accuracy.get("band")
    if band:
        return f"±{band['step_time_share']:.0%} (n={band['n']})"
    return str(accuracy.get("regime") or "")


def _print_explain(job: ResolvedJob, hw: Hardware, recipe: RunRecipe, *, json_out: bool) -> None:
    from parallab.core.accuracy import accuracy_of
    from parallab.core.explain import explain

    try:
        out = {**explain(job, hw, recipe), **accuracy_of(job, hw, recipe)}
    except RecipeError as exc:  # a recipe the planner does not count for this model
        flag_error(exc)
    if json_out:
        typer.echo(json.dumps(out, indent=2))
        return
    console = Console(width=max(Console().width, 160))
    step = Table(title=f"step {out['step_s']:.3f} s {band_label(out)} on {hw.label}", show_header=True)
    for column in ("term", "seconds", "share", "formula", "profile entry"):
        step.add_column(column)
    for line in out["step"]:
        share = line["seconds"] / out["step_s"] if out["step_s"] else 0.0
        step.add_row(escape(line["name"]), f"{line['seconds']:.4f}", f"{share:.1%}", escape(line["formula"]), escape(line["entry"]))
    console.print(step)
    memory = Table(title="memory per rank", show_header=True)
    for column in ("category", "bytes", "formula", "profile entry"):
        memory.add_column(column)
    for line in out["memory"]:
        memory.add_row(escape(line["name"]), format_bytes(line["bytes"]), escape(line["formula"]), escape(line["entry"]))
    console.print(memory)
    console.print("not modelled: " + escape(", ".join(out["not_modelled"]) or "—"))


def _limits() -> Limits:
    """This deployment's limits without their ceilings (`Limits.without_ceilings`): a plan is for any
    cluster, but a plan of a lab module this deployment will not run is refused too."""
    from backend.config import get_settings

    return get_settings().limits.without_ceilings()


# ---- ranking ----


def _hardware(device: str | None, nodes: int, gpus_per_node: int | None, pool: str | None) -> Hardware:
    from backend.config import get_settings
    from backend.services import hardware

    settings = get_settings()
    if device:
        try:
            return hardware.device_hardware(settings=settings, device=device, nodes=nodes, gpus_per_node=gpus_per_node)
        except hardware.UnknownDevice as exc:
            fail(f"--device: {exc}")
    from backend.db import session_scope

    with session_scope(settings.sqlalchemy_url) as session:
        advice = hardware.calibration_advice(session=session, settings=settings, pool=pool)
        if advice is not None:
            typer.echo(f"note: {advice}", err=True)
        return hardware.pool_hardware(session=session, settings=settings, pool=pool)


def _rank(
    workload: dict[str, Any],
    *,
    device: str | None,
    nodes: int,
    gpus_per_node: int | None,
    pool: str | None,
    world_size: int | None,
    recipe: RunRecipe,
) -> Any:
    from parallab.core.model import PRESETS
    from parallab.core.ranking import DEFAULT_ACCUMULATION, DEFAULT_CHECKPOINTING, DEFAULT_PRECISIONS, plan_cluster

    if "model" not in workload:
        workload = {**workload, "model": "tiny"}
    if workload["model"] not in PRESETS:
        fail(f"--model: unknown model preset {workload['model']!r}; known: {', '.join(PRESETS)}")
    hw = _hardware(device, nodes, gpus_per_node, pool)
    fixed = {k: workload.pop(k) for k in ("precision", "activation_checkpointing", "grad_accumulation_steps") if k in workload}
    ranking = plan_cluster(
        workload,
        hw,
        world_size=world_size,
        recipe=recipe,
        precisions=[fixed["precision"]] if "precision" in fixed else DEFAULT_PRECISIONS,
        checkpointing=[fixed["activation_checkpointing"]] if "activation_checkpointing" in fixed else DEFAULT_CHECKPOINTING,
        accumulation=[fixed["grad_accumulation_steps"]] if "grad_accumulation_steps" in fixed else DEFAULT_ACCUMULATION,
    )

    def show(*, top: int, json_out: bool, show_all: bool) -> None:
        if json_out:
            typer.echo(json.dumps(ranking.as_dict(top=top), indent=2, default=str))
        else:
            print_ranking(ranking, top=top, show_all=show_all)
        if not ranking.fits:  # an empty plan is a failure, not an empty table
            typer.echo(f"nothing fits on {ranking.hardware}; the closest: {ranking.closest()}", err=True)
            raise typer.Exit(1)

    return show


def print_ranking(ranking: Ranking, *, top: int, show_all: bool) -> None:
    """The configurations that fit, fastest predicted first, then why the others don't."""
    from parallab.core.ranking import MESH_DIMS, rejected_by_reason

    console = Console(width=max(Console().width, 150))
    wl = ranking.workload
    config = wl.get("hf_config")
    model = f"{config.get('model_type')} (config.json, from {wl.get('model')})" if isinstance(config, dict) else wl.get("model")
    title = (
        f"{model} on {ranking.hardware}: {len(ranking.fits)} of {len(ranking.fits) + len(ranking.rejected)} "
        f"configurations fit (global batch {wl.get('global_batch_size')}, {ranking.world_size} ranks)"
    )
    table = Table(title=title, show_header=True)
    for column, justify in (
        ("#", "right"),
        ("strategy", "left"),
        ("dp×tp×pp×cp×ep", "left"),
        ("precision", "left"),
        ("recompute", "left"),
        ("accum", "right"),
        ("micro-batches", "right"),
        ("micro-batch", "right"),
        ("memory/rank", "right"),
        ("step", "right"),
        ("tokens/s", "right"),
        ("band", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for i, row in enumerate(ranking.fits[:top], 1):
        opts = ", ".join(f"{k}={v}" for k, v in row.options.items() if k != "microbatches")
        table.add_row(
            str(i),
            escape(row.strategy + (f" [{opts}]" if opts else "")),
            "×".join(str(row.mesh[d]) for d in MESH_DIMS),
            row.precision,
            row.activation_checkpointing,
            str(row.grad_accumulation_steps),
            str(row.microbatches or "—"),
            str(row.micro_batch_size or "—"),
            format_bytes(row.memory_per_rank_bytes),
            f"{(row.step_time_s or 0) * 1e3:,.1f} ms",
            f"{row.tokens_per_s or 0:,.0f}",
            escape(band_label(row.accuracy)),
        )
    console.print(table)
    if ranking.fits and (ranking.fits[0].accuracy or {}).get("not_modelled"):
        console.print("not modelled (the fastest): " + escape(", ".join((ranking.fits[0].accuracy or {})["not_modelled"])))
    if len(ranking.fits) > top:
        console.print(f"… and {len(ranking.fits) - top} more that fit (--top N to list them)")
    if ranking.invalid:
        groups = ", ".join(f"{g['count']} × {g['reason']}" for g in rejected_by_reason(ranking.invalid)[:2])
        console.print(escape(f"not counted: {len(ranking.invalid)} combinations this workload cannot be ({groups})"))
    if not ranking.rejected:
        return
    console.print(f"\n[bold]{len(ranking.rejected)} do not fit[/bold]:")
    if show_all:
        for row in ranking.rejected:
            console.print(escape(f"  {row.label} {row.precision} {row.activation_checkpointing} accum {row.grad_accumulation_steps}:"))
            for reason in row.reasons:
                console.print(escape(f"    - {reason}"))
        return
    for group in rejected_by_reason(ranking.rejected):
        console.print(f"  {group['count']:>5} × {escape(group['reason'])}  [dim](e.g. {escape(group['example'])})[/dim]")
    console.print("  (--all lists every one with all its reasons)")
