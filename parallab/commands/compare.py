"""`parallab compare A B --why`: why B's step time differs from A's, split into parts.

A and B are each one run or a repeat group's runs, comma-separated: result-document files (what
`parallab bench` or the worker writes) or run ids read from the server (`--server`, a token with
`--token` where the server asks for one). The split (`parallab.core.whydiff`) is the compare
page's: compute by op class, each collective by dimension and op, wait, bubble, idle, each with
its interval over the repeats, and the residual the parts leave of the measured change.

Exit codes: 0 explained, the parts adding up within 5 % (or the residual's interval straddling
5 %: the text says "cannot tell", more repeats decide); 1 explained, but the parts do not add up;
2 bad input (a file that is no result document, a run without its analysis); 3 the server could
not be reached or refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from parallab.commands.jobspec import fail
from parallab.core.whydiff import NotExplained, explain, lines


def _documents(side: str, server: str | None, token: str | None) -> list[dict[str, Any]]:
    out = []
    for item in (x.strip() for x in side.split(",")):
        if not item:
            continue
        path = Path(item)
        if path.exists():
            try:
                doc = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                fail(f"{item}: not JSON ({exc})")
            if not isinstance(doc, dict):
                fail(f"{item}: not a result document (a JSON object)")
            out.append(doc)
            continue
        if server is None:
            fail(f"{item}: no such file; to read a run id give --server (or PARALLAB_SERVER)")
        out.append(_fetch(item, server, token))
    if not out:
        fail(f"{side!r}: no run named")
    return out


def _fetch(run_id: str, server: str, token: str | None) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        answer = httpx.get(f"{server.rstrip('/')}/api/v1/runs/{run_id}", headers=headers, timeout=60)
    except httpx.HTTPError as exc:
        typer.echo(f"{server}: not reached ({exc})", err=True)
        raise typer.Exit(3) from exc
    if answer.status_code == 404:
        fail(f"{run_id}: no such run on {server}")
    if answer.status_code != 200:
        typer.echo(f"{server}: answered {answer.status_code} for run {run_id}: {answer.text[:300]}", err=True)
        raise typer.Exit(3)
    doc = answer.json().get("result")
    if not isinstance(doc, dict):
        fail(f"{run_id}: no result yet (status {answer.json().get('status')})")
    return doc


def compare(
    a: Annotated[str, typer.Argument(help="The baseline: a result document or run id, or several (repeats), comma-separated.")],
    b: Annotated[str, typer.Argument(help="The other side, as A.")],
    why: Annotated[bool, typer.Option("--why", help="Split the step-time change into its parts.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The diff as JSON.")] = False,
    server: Annotated[str | None, typer.Option(envvar="PARALLAB_SERVER", help="parallab's URL, for run ids.")] = None,
    token: Annotated[str | None, typer.Option(envvar="PARALLAB_TOKEN", help="A token, where the server asks for one.")] = None,
) -> None:
    """Compare two runs (or repeat groups); with --why, say which parts moved the step time."""
    docs_a, docs_b = _documents(a, server, token), _documents(b, server, token)
    try:
        result = explain(docs_a, docs_b)
    except NotExplained as exc:
        fail(str(exc))
    if not why:
        typer.echo(lines(result)[0])
        return
    typer.echo(result.model_dump_json(indent=2) if as_json else "\n".join(lines(result, top=20)))
    if result.verdict == "do not add up":
        raise typer.Exit(1)
