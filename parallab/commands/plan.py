"""`parallab plan`: the prediction for a job — memory per rank, communication per step, bubble.

Pure arithmetic over the config (backend.services.prediction); nothing runs, no torch. Planning
is for any cluster, so the world size has no limit here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from backend.schemas.spec import JobSpec
from backend.services.prediction import predict
from backend.services.validation import SpecError, resolve_job

PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "mixed")


def _value(text: str) -> Any:
    """An option value from the command line: JSON when it parses (true, 4, 1.5), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {item!r}: expected key=value")
        options[key.strip()] = _value(value.strip())
    return options


def human_bytes(n: float | int | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return str(n)


def _fail(message: str) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(2)


def plan(
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="single, ddp, fsdp, tp, pp, ring, moe, hybrid.")],
    world_size: Annotated[int, typer.Option("--world-size", "-n", help="Ranks.")] = 1,
    model: Annotated[str, typer.Option(help="Model preset the shape starts from.")] = "tiny",
    layers: Annotated[Optional[int], typer.Option("--layers", help="Transformer blocks (L).")] = None,
    hidden: Annotated[Optional[int], typer.Option("--hidden", help="Hidden size (h).")] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="Attention heads.")] = None,
    vocab: Annotated[Optional[int], typer.Option("--vocab", help="Vocabulary size.")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length (T).")] = None,
    ffn_hidden: Annotated[Optional[int], typer.Option("--ffn-hidden", help="MLP inner width.")] = None,
    experts: Annotated[Optional[int], typer.Option("--experts", help="Experts per MoE layer.")] = None,
    global_batch_size: Annotated[Optional[int], typer.Option("--global-batch-size", help="Sequences per step.")] = None,
    precision: Annotated[str, typer.Option(help="fp32, bf16, fp16, fp8 or mixed (= bf16).")] = "fp32",
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="Strategy option key=value; repeat.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Predict model state per rank, communication per step and the pipeline bubble."""
    if precision not in PRECISIONS:
        _fail(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    try:
        options = parse_options(option or [])
    except ValueError as exc:
        _fail(str(exc))
    fields = {"model": model, "num_layers": layers, "hidden_size": hidden, "num_heads": heads, "vocab_size": vocab,
              "seq_len": seq_len, "ffn_hidden_size": ffn_hidden, "num_experts": experts,
              "global_batch_size": global_batch_size, "precision": "bf16" if precision == "mixed" else precision}
    workload = {k: v for k, v in fields.items() if v is not None}
    try:
        spec = JobSpec.model_validate({"workload": workload, "strategy": {"name": strategy, "world_size": world_size, "options": options}})
        job = resolve_job(spec, max_world_size=1 << 30)
    except SpecError as exc:
        _fail(str(exc))
    except ValidationError as exc:
        _fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    prediction = predict(job)
    if json_out:
        typer.echo(json.dumps({"workload": job.workload_document(), "strategy": job.strategy_document(), **prediction}, indent=2))
        return
    _print_table(job.workload_document(), job.strategy_document(), prediction)


def _print_table(workload: dict[str, Any], strategy: dict[str, Any], prediction: dict[str, Any]) -> None:
    console = Console()
    title = (f"{strategy['name']} × {strategy['world_size']} — {workload['model']} "
             f"(L={workload['num_layers']} h={workload['hidden_size']} V={workload['vocab_size']} T={workload['seq_len']}, "
             f"{workload['precision']}, Ψ={prediction['params_total']:,})")
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
    console.print(table)
