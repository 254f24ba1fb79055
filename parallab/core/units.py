"""How a byte count is shown to people, everywhere: binary units (KiB, MiB, GiB, TiB), labelled.

One helper for the CLI, the pages, the figures and the CSV exports, so the same memory is never
"60.56 GB" in one place and "56.40 GiB" in another. Rates keep their own conventions (bus
bandwidth is GB/s of 1e9 bytes, as nccl-tests and the vendors state it); byte counts do not.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
_STEPS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def format_bytes(value: float | None, *, digits: int = 2) -> str:
    """'56.40 GiB', '512.00 KiB', '12 B'; '—' for None."""
    if value is None:
        return "—"
    value = float(value)
    for unit, size in _STEPS:
        if abs(value) >= size:
            return f"{value / size:,.{digits}f} {unit}"
    return f"{value:,.0f} B"


def mib(value: float | None) -> float | None:
    """Bytes as MiB (the unit of the figures' memory axes and of the CSV exports' `_mib` columns)."""
    return None if value is None else value / MIB
