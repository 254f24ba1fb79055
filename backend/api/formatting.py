"""Jinja filters that put numbers in front of people: bytes in MiB/GiB, fractions in %, rates."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from parallab.core.critpath import sentence as critical_path_sentence
from parallab.core.stragglers import sentence as stragglers_sentence
from parallab.core.units import format_bytes


def fmt_bytes(value: Any) -> str:
    """Bytes in binary units: the one helper the CLI uses too (parallab.core.units)."""
    return format_bytes(None if value is None else float(value))


def fmt_num(value: Any, digits: int = 3) -> str:
    """A number with `digits` significant figures and thousands separators."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1:
        return f"{value:,.0f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fmt_pct(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def fmt_seconds(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value * 1e3:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def fmt_value(value: Any, unit: str) -> str:
    """A compare-table value in its unit."""
    if value is None:
        return "—"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "fraction":
        return fmt_pct(value, 2 if abs(value) < 0.01 else 1)
    if unit == "s":
        return fmt_seconds(value)
    if unit in ("text", "ranks", "count", "tokens", "sequences"):
        return str(value)
    return f"{fmt_num(value)} {unit}" if unit not in ("loss",) else fmt_num(value, 4)


def fmt_rel(value: float | None, better: str | None) -> dict[str, str]:
    """A relative difference as text and a CSS class (better / worse / same)."""
    if value is None:
        return {"text": "", "cls": ""}
    if abs(value) < 0.005:
        return {"text": "±0%", "cls": "same"}
    good = (value > 0) == (better == "higher") if better else None
    return {"text": f"{value * 100:+.1f}%", "cls": "" if good is None else ("better" if good else "worse")}


def fmt_when(value: datetime | None) -> str:
    if value is None:
        return "—"
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def fmt_duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "—"
    return fmt_seconds((end - start).total_seconds())


def pretty_json(value: Any) -> str:
    """Indented JSON for a <pre> (plain text: the template escapes it)."""
    import json

    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


FILTERS = {
    "pretty_json": pretty_json,
    "bytes": fmt_bytes,
    "num": fmt_num,
    "pct": fmt_pct,
    "seconds": fmt_seconds,
    "value": fmt_value,
    "rel": fmt_rel,
    "when": fmt_when,
    "duration": fmt_duration,
    "stragglers": stragglers_sentence,
    "critical_path": critical_path_sentence,
}
