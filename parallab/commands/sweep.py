"""`parallab sweep`: plan every configuration of a workload, run the best predicted and a few
controls, and report how well the prediction ranked them.

    parallab sweep --model small --world-size 4 --top 8 --wait

The sweep is stored in this deployment's database and its runs queued for its workers (start
them with `parallab up`), or sent to a server with `--server URL --token T`. `--wait` follows it
to the end and prints predicted against measured tokens/s, Spearman's ρ and the best found;
its page is `/sweeps/{id}`.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from parallab.commands.jobspec import fail

console = Console(stderr=True)
FINISHED = ("finished", "cancelled")


def sweep(
    model: Annotated[str, typer.Option("--model", help="Model preset.")] = "small",
    world_size: Annotated[int, typer.Option("--world-size", "-n", help="Ranks of every run.", min=1)] = 4,
    top: Annotated[int, typer.Option("--top", help="Queue the K best predicted.", min=1)] = 8,
    controls: Annotated[int, typer.Option("--controls", help="Also queue this many below the top, spread down to the lowest.", min=0)] = 2,
    steps: Annotated[int | None, typer.Option("--steps", help="Measured steps of each run (default: the server's).", min=1)] = None,
    precision: Annotated[list[str] | None, typer.Option("--precision", help="Precisions to plan; repeat (default fp32, bf16).")] = None,
    checkpointing: Annotated[
        list[str] | None,
        typer.Option("--activation-checkpointing", help="Recomputation modes to plan; repeat (default none, selective, full)."),
    ] = None,
    accumulation: Annotated[
        list[int] | None, typer.Option("--grad-accumulation-steps", help="Accumulation to plan; repeat (default 1, 2).")
    ] = None,
    global_batch_size: Annotated[
        int | None, typer.Option("--global-batch-size", help="Sequences per step (default: the preset's).")
    ] = None,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Runs of each configuration, interleaved (each figure is then a median with its interval).")
    ] = 1,
    name: Annotated[str | None, typer.Option("--name", help="A name for the sweep.")] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Pool to run on (default: the deployment's queue).")] = None,
    server: Annotated[str | None, typer.Option("--server", help="Submit to this parallab server instead of the local database.")] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="PARALLAB_TOKEN", help="With --server: a token with scope 'submit'.")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow the sweep to the end and print the comparison.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the sweep as JSON.")] = False,
) -> None:
    """Plan a workload's configurations, run the top K predicted plus controls, compare predicted with measured."""
    request: dict[str, Any] = {
        "name": name,
        "workload": {"model": model, **({"global_batch_size": global_batch_size} if global_batch_size else {})},
        "world_size": world_size,
        "top": top,
        "controls": controls,
        "steps": steps,
        "pool": pool,
        "repeats": repeats,
    }
    for key, value in (("precisions", precision), ("checkpointing", checkpointing), ("accumulation", accumulation)):
        if value:
            request[key] = value
    client = _Remote(server, token) if server else _Local()
    view = client.create(request)
    console.print(
        f"sweep [bold]{view['id']}[/bold]: {len(view['points'])} runs queued of {view['planned']} planned on {view['hardware']['label']}"
    )
    while wait and view["status"] not in FINISHED:
        time.sleep(5)
        view = client.read(view["id"])
        done = sum(p["status"] in ("succeeded", "failed", "cancelled") for p in view["points"])
        console.print(f"  {done}/{len(view['points'])} runs finished", end="\r")
    if json_out:
        typer.echo(json.dumps(view, indent=2, default=str))
    else:
        print_sweep(view)


def print_sweep(view: dict[str, Any]) -> None:
    out = Console(width=max(Console().width, 150))
    table = Table(title=f"sweep {view['id']} ({view['status']}) — {view['model']} × {view['world_size']} on {view['hardware']['label']}")
    for column in ("pred. rank", "role", "configuration", "recipe", "status", "predicted tokens/s", "measured tokens/s"):
        table.add_column(column)
    for p in view["points"]:
        recipe = f"{p['precision']} · {p['activation_checkpointing']} · accum {p['grad_accumulation_steps']}"
        measured = p["measured"]["tokens_per_s"]
        low, high = p["measured"].get("tokens_per_s_low"), p["measured"].get("tokens_per_s_high")
        spread = f" ({low:,.0f}–{high:,.0f}, n = {p['measured']['runs']})" if low is not None and p["measured"].get("runs", 0) > 1 else ""
        status = p["status"] + (" (out of memory: the prediction let it through)" if p["out_of_memory"] else "")
        table.add_row(
            str(p["predicted_rank"]),
            p["role"],
            escape(p["label"]),
            recipe,
            status,
            f"{p['predicted']['tokens_per_s']:,.0f}",
            f"{measured:,.0f}{spread}" if measured is not None else "—",
        )
    out.print(table)
    rho = view.get("spearman")
    out.print(
        f"Spearman rank correlation, predicted vs measured tokens/s: {rho:.2f}" if rho is not None else "Spearman: needs 3 finished runs"
    )
    if view.get("trust"):
        out.print(escape(view["trust"]))
    if view.get("best"):
        best = view["best"]
        out.print(
            f"best found: {escape(best['label'])} ({best['precision']}, {best['activation_checkpointing']}) — "
            f"{best['measured']['tokens_per_s']:,.0f} tokens/s"
        )


class _Local:
    """The sweep service on this deployment's database (its workers run the runs)."""

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        from pydantic import ValidationError

        from backend.config import get_settings
        from backend.db import session_scope
        from backend.services import sweeps
        from parallab.core.problems import SpecError

        settings = get_settings()
        try:
            body = sweeps.SweepRequest.model_validate({k: v for k, v in request.items() if v is not None})
            with session_scope(settings.sqlalchemy_url) as session:
                sweep = sweeps.create_sweep(session=session, settings=settings, request=body, source="cli")
                return sweeps.sweep_view(session=session, sweep_id=sweep.id).as_dict()
        except SpecError as exc:
            fail(*(str(p) for p in exc.problems))
        except ValidationError as exc:
            fail(*(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))

    def read(self, sweep_id: str) -> dict[str, Any]:
        from backend.config import get_settings
        from backend.db import session_scope
        from backend.services import sweeps

        with session_scope(get_settings().sqlalchemy_url) as session:
            return sweeps.sweep_view(session=session, sweep_id=sweep_id).as_dict()


class _Remote:
    """The sweeps API of a parallab server."""

    def __init__(self, server: str, token: str | None):
        self.base = server.rstrip("/") + "/api/v1/sweeps"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _ok(self, response: Any) -> dict[str, Any]:
        if response.status_code >= 400:
            fail(f"the server refused ({response.status_code}): {response.text}")
        body: dict[str, Any] = response.json()
        return body

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        import httpx

        return self._ok(httpx.post(self.base, json={k: v for k, v in request.items() if v is not None}, headers=self.headers, timeout=120))

    def read(self, sweep_id: str) -> dict[str, Any]:
        import httpx

        return self._ok(httpx.get(f"{self.base}/{sweep_id}", headers=self.headers, timeout=60))
