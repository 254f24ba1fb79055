"""BENCHMARKS.md is shared by every benchmark: each owns one section, found by its heading."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
TITLE = "# Benchmarks\n\nEvery figure here is measured by the script named in its section, on the machine it names.\n"


def write_section(heading: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the section under `## heading` (or append it), leaving the other sections alone."""
    text = path.read_text() if path.exists() else TITLE
    section = f"## {heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")
