"""`parallab plan --dry-run`: the real rank code of a layout at its full world size, in this
process, under torch's fake process group and fake tensors (`workers.dryrun`), held against the
prediction. Prints each rank's model state and each dimension's collectives beside the formulas,
or `--json`; exits 1 when a figure misses its formula by more than 1%, 2 when the job cannot be
dry-run (the reason names the field).
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.jobspec import fail
from parallab.core.jobs import ResolvedJob
from parallab.core.units import format_bytes


def dry_run_command(job: ResolvedJob, *, json_out: bool) -> None:
    """Run the dry run of `job` and report it (torch is imported only here)."""
    from workers.dryrun import DryRunFailed, DryRunRefused, dry_run

    try:
        result = dry_run(job)
    except DryRunRefused as exc:
        fail(str(exc))
    except DryRunFailed as exc:
        typer.echo(f"the rank code failed under the dry run:\n{exc}", err=True)
        raise typer.Exit(1) from None
    doc = result.as_dict()
    if json_out:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print(doc)
    if not result.passed:
        raise typer.Exit(1)


def _print(doc: dict[str, object]) -> None:
    mesh = doc["mesh"]
    assert isinstance(mesh, dict)
    dims = " × ".join(f"{k}={v}" for k, v in mesh.items()) or "no mesh"
    verdict = "checked by a dry run" if doc["passed"] else "the dry run disagrees with the formulas"
    table = Table(title=f"dry run of {doc['layout']} on {doc['world_size']} ranks (mesh {dims}): {verdict}, {doc['seconds']} s")
    for column in ("what", "dry run", "predicted", "gap"):
        table.add_column(column, justify="left" if column == "what" else "right")
    checks = doc["checks"]
    assert isinstance(checks, list)
    for c in checks:
        gap = f"{c['relative']:.2%}" + ("" if c["ok"] else " ✗")
        table.add_row(c["what"], format_bytes(c["measured"]), format_bytes(c["predicted"]), gap)
    note = doc.get("note")
    if note:
        table.caption = str(note)
    Console().print(table)
