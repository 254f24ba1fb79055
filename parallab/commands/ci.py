"""`parallab ci report SERIES` and `parallab series accept SERIES METRIC`: what a CI step reads and what
a series' owner does about an intended change, both through the server's API.

`ci report` prints the series' report as Markdown (`parallab.core.ci_markdown`) or, with
`--json`, as the server answers it; with `--if-changed` it prints nothing when nothing changed,
so a CI step posts a comment only when there is something to say. `--basis` chooses what its
timing verdict reads: the raw metric, the metric normalised by the host-speed probe, or (`auto`,
the default) normalised where every job compared carries the probe.

Exit status: 0 done; 2 bad input (the server refused the request as invalid, or no such series);
3 the server could not be reached or refused the token.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from parallab.core.ci_markdown import render

ci_app = typer.Typer(help="What CI reads: a series' report for a pull request.", no_args_is_help=True)
series_app = typer.Typer(help="CI series: accept an intended exact change.", no_args_is_help=True)
err = Console(stderr=True)
EXIT_INPUT = 2
EXIT_SERVER = 3

Server = Annotated[str, typer.Option(envvar="PARALLAB_SERVER", help="parallab's URL, e.g. http://lab:8000")]


def _call(method: str, url: str, *, token: str | None = None, body: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
    """The JSON answer, or exit 2 (refused as invalid, not found) or 3 (unreachable, not allowed)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, url, json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        err.print(f"[red]could not reach {url}: {exc}[/red]")
        raise typer.Exit(EXIT_SERVER) from None
    if response.status_code in (404, 422):
        detail = response.json().get("detail") if response.headers.get("content-type", "").startswith("application/json") else None
        message = detail[0]["msg"] if isinstance(detail, list) and detail else detail or response.text
        err.print(f"[red]refused ({response.status_code}): {message}[/red]")
        raise typer.Exit(EXIT_INPUT)
    if response.status_code != 200:
        err.print(f"[red]refused ({response.status_code}): {response.text}[/red]")
        raise typer.Exit(EXIT_SERVER)
    return response.json()


BASES = ("auto", "raw", "normalised")
BASIS_HELP = (
    "What the timing verdict reads: raw, normalised (by the host-speed probe), or auto — normalised where every job "
    "compared carries the probe, raw otherwise."
)


def series_report(server: str, series: str, *, token: str | None, basis: str) -> Any:
    """The server's report of a series, its timing verdict read on `basis` (exit 2 naming --basis when it is not one of BASES)."""
    if basis not in BASES:
        err.print(f"[red]--basis: {basis!r} is not one of {', '.join(BASES)}[/red]")
        raise typer.Exit(EXIT_INPUT)
    return _call("GET", f"{server.rstrip('/')}/api/v1/series/{series}/report?basis={basis}", token=token)


@ci_app.command("report")
def report(
    series: Annotated[str, typer.Argument(help="The series id (`parallab upload` prints it).")],
    server: Server,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON, as the server answers it.")] = False,
    if_changed: Annotated[
        bool, typer.Option("--if-changed", help="Print nothing when nothing changed (post a comment only then).")
    ] = False,
    token: Annotated[
        str | None, typer.Option(envvar="PARALLAB_TOKEN", help="A token (any scope); a shared server answers no one without one.")
    ] = None,
    basis: Annotated[str, typer.Option(help=BASIS_HELP)] = "auto",
) -> None:
    """A series' CI report: exact changes first, then timing change points with intervals, bisect ranges and what the noise lets it see."""
    answer = series_report(server, series, token=token, basis=basis)
    if if_changed and not answer["changed"]:
        err.print("nothing changed: no report")
        return
    typer.echo(json.dumps(answer, indent=2, sort_keys=True) if as_json else render(answer), nl=as_json)


@series_app.command("accept")
def accept(
    series: Annotated[str, typer.Argument(help="The series id.")],
    metric: Annotated[
        str, typer.Argument(help="A counter (e.g. comm.all_reduce.g2.bytes) or a category: bytes, calls, memory, params, pipeline.")
    ],
    server: Server,
    token: Annotated[str, typer.Option(envvar="PARALLAB_TOKEN", help="A token of the series' owner or an admin.")],
) -> None:
    """Accept the change the series' latest result reports for METRIC as intended: it is no longer reported (for the series' family)."""
    answer = _call("POST", f"{server.rstrip('/')}/api/v1/series/{series}/accept", token=token, body={"metric": metric})
    for change in answer["accepted"]:
        typer.echo(f"accepted {change['counter']}: {change['old']:g} → {change['new']:g}")
