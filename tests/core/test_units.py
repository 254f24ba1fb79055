"""Byte counts are shown in binary units, labelled as such: 1 KiB is 1024 bytes, never 1000."""

from __future__ import annotations

import pytest

from parallab.core.units import format_bytes, mib


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "—"),
        (0, "0 B"),
        (1000, "1,000 B"),  # below 1 KiB: a decimal kilobyte is not a KiB
        (1023, "1,023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (1024**2, "1.00 MiB"),
        (25 * 1024**2, "25.00 MiB"),  # DDP's default bucket (bucket_cap_mb=25 is MiB in PyTorch)
        (10**9, "953.67 MiB"),  # a decimal GB is short of a GiB
        (1024**3, "1.00 GiB"),
        (60_560_000_000, "56.40 GiB"),  # the "60.56 GB" of the same memory, in the one unit shown
        (1024**4, "1.00 TiB"),
        (-2048, "-2.00 KiB"),
    ],
)
def test_format_bytes_uses_binary_units(value: float | None, shown: str) -> None:
    assert format_bytes(value) == shown


def test_digits_and_mib() -> None:
    assert format_bytes(3 * 1024**3 + 512 * 1024**2, digits=1) == "3.5 GiB"
    assert mib(1024**2 * 3) == 3.0 and mib(None) is None
