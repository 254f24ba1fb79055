"""`parallab upload FILE...`: what CI runs — upload result documents, print the verdicts and exact changes, fail on either.

Several files go as one batch (stored all or nothing). CI metadata comes from the flags, else
from the CI's environment (GitHub Actions' GITHUB_*, GitLab's CI_*), else from the document.
Unless given one, the Idempotency-Key is a hash of what is sent, so a retried job never stores
a result twice (and gets back the verdicts of the first upload). A busy server (503 with
Retry-After, 502, 504, 429) and a lost connection are retried with backoff under that same key
(`--retries`, default 6), with a status line saying what is awaited: a result the server stored
before its answer was lost comes back as "already uploaded", not as a failure.

Exit status: 0 uploaded (no regression or change, or not asked to fail on one); 1 a regression,
with --fail-on-regression; 2 bad input (a file, a flag, or a document the server refused as
invalid); 3 the server could not be reached, stayed busy through every retry, or refused the
token; 4 an exact counter changed in a category named by --fail-on-change (and nobody accepted
the change: `parallab series accept`), or, with `timing` among them, the series' report finds a
change point for the worse among its latest jobs — on the raw timing or the timing normalised by
the host-speed probe, as `--timing-basis` says (`auto`: normalised where every job compared
carries the probe). A regression and a change together exit 1.

`timing` is named on its own (`all` means every exact category): a change point is a statistical
verdict over the series, not an exact one, and asks the server for the series' report.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.ci import BASES, series_report
from parallab.commands.ci_env import ci_metadata
from parallab.commands.jobspec import fail
from parallab.commands.retry import RETRY_STATUSES, Attempt, post_with_retries
from parallab.core.counters import parse_categories

console = Console()
err = Console(stderr=True)
EXIT_REGRESSION = 1
EXIT_SERVER = 3
EXIT_CHANGE = 4
TIMING = "timing"
STYLE = {"regressed": "bold red", "improved": "green", "unchanged": "", "no_baseline": "dim"}


def read_document(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"{path}: {exc}")
    if not isinstance(doc, dict):
        fail(f"{path}: expected a result document (a JSON object), got {type(doc).__name__}")
    return doc


def with_source(document: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """The document with `metadata` (the fields that are set) laid over its `source`."""
    given = {k: v for k, v in metadata.items() if v not in (None, "")}
    if not given:
        return document
    return {**document, "source": {**(document.get("source") or {}), **given}}


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def verdict_table(items: list[dict[str, Any]], files: list[Path]) -> Table:
    table = Table(
        "file", "run", "metric", "baseline", "value", "change", "band", "test", "verdict", title="Verdicts against each series' baseline"
    )
    for path, item in zip(files, items, strict=True):
        verdicts = item.get("verdicts") or []
        if not verdicts:
            table.add_row(path.name, item["id"][:8], "—", "—", "—", "—", "—", "—", "no series (no branch)")
        for v in verdicts:
            change = "—" if v["change_pct"] is None else f"{v['change_pct']:+.1f}%"
            band = "—" if v["lower"] is None else f"{_fmt(v['lower'])} … {_fmt(v['upper'])}"
            test = (
                f"{v['test']} ({'α' if v['test'] == 't_test' else 'k'}={v['threshold']:g}, n={v['baseline_n']} on {v['baseline_branch']})"
            )
            label = v["verdict"].replace("_", " ") + (" (dismissed)" if v.get("dismissed") else "")
            table.add_row(
                path.name,
                item["id"][:8],
                v["metric"],
                _fmt(v["baseline"]),
                _fmt(v["value"]),
                change,
                band,
                test,
                f"[{STYLE[v['verdict']]}]{label}[/]" if STYLE[v["verdict"]] else label,
            )
    return table


def change_table(items: list[dict[str, Any]], files: list[Path]) -> Table | None:
    """Every exact counter that changed against its series' baseline result (None when none did)."""
    rows = [(path, item, c) for path, item in zip(files, items, strict=True) for c in item.get("changes") or []]
    if not rows:
        return None
    table = Table("file", "run", "counter", "category", "before", "after", "change", "", title="Exact counters that changed")
    for path, item, c in rows:
        change = "—" if c["change_pct"] is None else f"{c['change_pct']:+.1f}%"
        state = "accepted" if c["accepted"] else "[bold red]changed[/]"
        table.add_row(path.name, item["id"][:8], c["counter"], c["category"], _fmt(c["old"]), _fmt(c["new"]), change, state)
    return table


def failing_changes(items: list[dict[str, Any]], categories: tuple[str, ...]) -> list[str]:
    """`run: counter` of every change nobody accepted in one of `categories`."""
    return [
        f"{i['id'][:8]}: {c['counter']}" for i in items for c in i.get("changes") or [] if not c["accepted"] and c["category"] in categories
    ]


def parse_fail_on_change(text: str) -> tuple[tuple[str, ...], bool]:
    """`bytes,memory,timing` → (the exact categories, whether timing change points fail the job too)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    rest = [n for n in names if n != TIMING]
    if not rest and TIMING in names:
        return (), True
    return parse_categories(",".join(rest) or text), TIMING in names


def failing_timing(report: dict[str, Any]) -> list[str]:
    """`metric (basis): size first at commit` of every recent change point for the worse, on the basis its verdict read."""
    out = []
    for t in report.get("timing") or []:
        basis = t.get("judged_on", "raw")
        judged = t["normalised"] if basis == "normalised" else t
        for p in judged["change_points"]:
            if p["recent"] and p["worse"]:
                out.append(f"{t['metric']} ({basis}): {p['size_pct']:+.1f}% first at {(p['commit'] or '?')[:10]}")
    return out


def upload(
    files: Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, help="Result documents (JSON); several go as one batch.")],
    server: Annotated[str, typer.Option(envvar="PARALLAB_SERVER", help="parallab's URL, e.g. http://lab:8000")],
    token: Annotated[str, typer.Option(envvar="PARALLAB_TOKEN", help="A token with scope 'upload'.")],
    fail_on_regression: Annotated[bool, typer.Option("--fail-on-regression", help="Exit 1 when any metric regressed.")] = False,
    fail_on_change: Annotated[
        str | None,
        typer.Option(
            "--fail-on-change",
            help="Exit 4 when an exact counter changed in one of these categories (comma-separated: bytes, calls, memory, params, "
            "pipeline, or all), unless accepted; with timing, also when the series' report finds a recent change point for the worse.",
        ),
    ] = None,
    timing_basis: Annotated[
        str,
        typer.Option(
            help="What `--fail-on-change timing` reads: raw, normalised (by the host-speed probe), or auto — normalised where "
            "every job compared carries the probe."
        ),
    ] = "auto",
    series_file: Annotated[
        Path | None, typer.Option(help="Write the series id(s) the results joined here, one a line (for `parallab ci report`).")
    ] = None,
    branch: Annotated[str | None, typer.Option(help="Git branch (default: the CI's).")] = None,
    commit: Annotated[str | None, typer.Option(help="Git commit (default: the CI's).")] = None,
    repository: Annotated[str | None, typer.Option(help="owner/name (default: the CI's).")] = None,
    pr: Annotated[int | None, typer.Option(help="Pull/merge request number (default: the CI's).", min=1)] = None,
    ci_url: Annotated[str | None, typer.Option(help="URL of the CI job (default: the CI's).")] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Retries with the same key never store twice (default: a hash of the upload).")
    ] = None,
    retries: Annotated[
        int,
        typer.Option(min=0, max=20, help="Retries of a busy (503, 502, 504, 429) or unreachable server, with backoff, under the same key."),
    ] = 6,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds one try may take before it counts as unanswered.")] = 120.0,
) -> None:
    """Upload result documents (what CI runs), print each metric's verdict, and with --fail-on-regression exit 1 on a regression."""
    import httpx

    try:
        categories, fail_on_timing = parse_fail_on_change(fail_on_change) if fail_on_change is not None else ((), False)
    except ValueError as exc:
        fail(f"--fail-on-change: {exc}")
    if timing_basis not in BASES:
        fail(f"--timing-basis: {timing_basis!r} is not one of {', '.join(BASES)}")
    flags = {"branch": branch, "commit": commit, "repository": repository, "pr": pr, "ci_url": ci_url}
    from_ci = ci_metadata(os.environ)
    metadata = {k: flags[k] if flags[k] not in (None, "") else from_ci.get(k) for k in flags}
    documents = [with_source(read_document(f), metadata) for f in files]
    body: Any = documents if len(documents) > 1 else documents[0]
    payload = json.dumps(body, sort_keys=True).encode()
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Idempotency-Key": idempotency_key or "sha256:" + hashlib.sha256(payload).hexdigest(),
    }
    url = f"{server.rstrip('/')}/api/v1/results"
    key = headers["Idempotency-Key"]

    def waiting(attempt: Attempt) -> None:
        status.update(
            f"[yellow]{attempt.reason}[/yellow]: retry {attempt.number}/{attempt.retries} in {attempt.delay_s:.1f} s "
            f"(same Idempotency-Key {key[:20]}…)"
        )
        err.print(f"upload try {attempt.number}: {attempt.reason}; retrying in {attempt.delay_s:.1f} s under the same Idempotency-Key")

    try:
        with err.status(f"uploading {len(documents)} result document(s) to {server}") as status, httpx.Client(timeout=timeout) as client:
            response = post_with_retries(client, url, content=payload, headers=headers, retries=retries, on_retry=waiting)
    except httpx.HTTPError as exc:
        err.print(f"[red]could not reach {server} after {retries + 1} tries: {exc}[/red]")
        raise typer.Exit(EXIT_SERVER) from None
    if response.status_code in (400, 413, 422):
        err.print(f"[red]the server refused the upload as invalid ({response.status_code}): {response.text}[/red]")
        raise typer.Exit(2)
    if response.status_code not in (200, 201):
        gave_up = f" after {retries + 1} tries" if response.status_code in RETRY_STATUSES else ""
        err.print(f"[red]upload refused ({response.status_code}){gave_up}: {response.text}[/red]")
        raise typer.Exit(EXIT_SERVER)
    answer = response.json()
    items = answer["items"] if len(documents) > 1 else [answer]
    console.print(verdict_table(items, files))
    if (changes := change_table(items, files)) is not None:
        console.print(changes)
    if series_file is not None:
        series_file.write_text("".join(f"{sid}\n" for sid in dict.fromkeys(i["series_id"] for i in items if i.get("series_id"))))
    for item in items:
        state = "new" if response.status_code == 201 else "already uploaded"
        where = f", series {server.rstrip('/')}/series/{item['series_id']}" if item.get("series_id") else ""
        err.print(f"stored as run {item['id']} ({state}{where})")
    regressed = [item["id"] for item in items if item.get("regressed")]
    if regressed:
        err.print(f"[bold red]regression in {len(regressed)} result(s): {', '.join(regressed)}[/bold red]")
        if fail_on_regression:
            raise typer.Exit(EXIT_REGRESSION)
    changed = failing_changes(items, categories)
    if fail_on_timing:
        for sid in dict.fromkeys(i["series_id"] for i in items if i.get("series_id")):
            timing = failing_timing(series_report(server, sid, token=token, basis=timing_basis))
            changed += [f"series {sid[:8]}: {t}" for t in timing]
    if changed:
        err.print(f"[bold red]changed ({', '.join(categories + ((TIMING,) if fail_on_timing else ()))}): {'; '.join(changed)}[/bold red]")
        raise typer.Exit(EXIT_CHANGE)
