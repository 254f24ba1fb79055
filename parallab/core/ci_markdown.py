"""A series' CI report (the dict `GET /api/v1/series/{id}/report` answers) as Markdown for a pull request.

Exact changes come first (they carry no noise: any one is a change of code or config), then each
timing metric's change points with their intervals and bisect ranges, and what the metric's
noise lets it see at all; where jobs carry the host-speed probe, the metric normalised by it is
shown beneath the raw one with its own between-job CV, and which of the two the verdict read.
Pure: a dict in, text out, so a CI step can post it as a comment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _num(value: float) -> str:
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.4g}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}%"


def _exact(exact: Mapping[str, Any] | None) -> list[str]:
    lines = ["### Exact counters", ""]
    if exact is None:
        return [*lines, "No counters recorded on this series yet.", ""]
    if exact.get("baseline_run_id") is None:
        return [*lines, f"Result `{exact['run_id'][:8]}` has nothing of its config to compare with yet (first result).", ""]
    against = f"`{(exact.get('baseline_commit') or exact['baseline_run_id'])[:10]}`"
    changes = exact.get("changes") or []
    if not changes:
        what = "bytes and calls per collective, model state, parameters, activations, pipeline actions"
        return [*lines, f"No counter changed against {against} ({what}).", ""]
    lines += [f"Against {against}:", "", "| counter | category | before | after | change | |", "|---|---|---:|---:|---:|---|"]
    for c in changes:
        state = "accepted" if c["accepted"] else "**changed**"
        lines.append(f"| `{c['counter']}` | {c['category']} | {_num(c['old'])} | {_num(c['new'])} | {_pct(c['change_pct'])} | {state} |")
    return [*lines, ""]


def _timing(t: Mapping[str, Any]) -> list[str]:
    lines = _one_timing(t)
    if t.get("normalised"):
        lines += ["  " + line for line in _one_timing(t["normalised"])]
        basis = t.get("judged_on", "raw")
        lines.append(f"  - The verdict reads the **{basis}** {t['label'].lower()}: {t.get('judged_because', '')}.")
    return lines


def _one_timing(t: Mapping[str, Any]) -> list[str]:
    head = f"**{t['label']}** (`{t['metric']}`, {t['unit']})"
    if t["status"] == "too_few":
        return [f"- {head}: not judged — a change-point search needs at least {t['needed']} CI jobs; this series has {t['jobs']}."]
    floor = (
        f"between-job CV {t['cv'] * 100:.1f}%; smallest change detectable at 95% power: {t['mdc_pct']:.0f}% "
        f"with {t['mdc_per_side']} jobs either side, {t['mdc_single_pct']:.0f}% from a single result"
        if t["cv"] is not None
        else "between-job CV unknown"
    )
    if not t["change_points"]:
        return [f"- {head} over {t['jobs']} jobs: no change point ({floor}; a smaller change would not be seen)."]
    lines = [f"- {head} over {t['jobs']} jobs ({floor}):"]
    for p in t["change_points"]:
        where = f"first at `{(p['commit'] or '?')[:10]}`"
        bisect = f"; bisect `{p['bisect']}`" if p["bisect"] else ""
        tag = "worse" if p["worse"] else "better"
        lines.append(
            f"  - {_pct(p['size_pct'])} ({tag}; 95% interval {_pct(p['lower_pct'])} … {_pct(p['upper_pct'])}, "
            f"p = {p['p_value']:.3f}), {where}{bisect}"
        )
    return lines


def render(report: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    s = report["series"]
    verdict = "something changed" if report["changed"] else "no change"
    lines = [
        f"## parallab: {verdict} — {s['label']} · {s['strategy']} × {s['world_size']} on `{s['branch']}`",
        "",
        *_exact(report.get("exact")),
        "### Timings (change points over the series)",
        "",
    ]
    timings = report.get("timing") or []
    lines += [line for t in timings for line in _timing(t)] or ["No timing metric on this series."]
    if report.get("host_speed") and timings:
        lines += ["", f"Host speed: {report['host_speed']['note']}."]
    return "\n".join(lines) + "\n"
