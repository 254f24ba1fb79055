"""The CI report as Markdown (golden files) for a no-change, an exact-change and a timing-change series,
and a series too short to judge; jobs are formed from repeats of one commit.

Regenerate the golden files after an intended change of the report with
`PARALLAB_UPDATE_GOLDEN=1 pytest tests/backend/test_ci_report.py` and read the diff."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from backend.services.ci_report import assemble, jobs_of
from parallab.core.ci_markdown import render

GOLDEN = Path(__file__).parent / "golden"
SERIES = {"id": "5e41e5", "label": "tiny · seq 64 · batch 8 · fp32", "branch": "main", "repository": "lab/model"}
SERIES |= {"strategy": "ddp", "world_size": 2}


def points(n: int, *, drop_at: int | None = None, cv: float = 0.05, seed: int = 7) -> list[tuple[str | None, dict[str, float]]]:
    """`n` jobs of tokens/s around 1000 (a 20 % drop from `drop_at` on), each commit uploaded twice."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        level = 800.0 if drop_at is not None and i >= drop_at else 1000.0
        for _ in range(2):
            value = level * (1 + rng.gauss(0, cv))
            out.append((f"{i:04x}c0ffee", {"tokens_per_s": value, "step_time_p50": 512 / value}))
    return out


def exact(changes: list[dict[str, Any]]) -> dict[str, Any]:
    latest = {"run_id": "9a1b2c3d4e", "commit": "0013c0ffee", "baseline_run_id": "8f7e6d5c4b", "baseline_commit": "0012c0ffee"}
    return {**latest, "changes": changes}


BUCKET = {"counter": "comm.all_reduce.g2.bytes", "category": "bytes", "old": 2000.0, "new": 3000.0, "delta": 1000.0, "change_pct": 50.0}
CASES = {
    "no_change": dict(jobs=points(20), latest=exact([])),
    "exact_change": dict(jobs=points(20), latest=exact([{**BUCKET, "accepted": False}])),
    "timing_change": dict(jobs=points(20, drop_at=15), latest=exact([])),  # among the latest jobs: "changed"
    "too_few": dict(jobs=points(5), latest={**exact([]), "baseline_run_id": None}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_markdown_report_matches_its_golden_file(case: str) -> None:
    given = CASES[case]
    report = assemble(series=SERIES, jobs=jobs_of(given["jobs"]), latest=given["latest"], window=10, alpha=0.01)
    text = render(report)
    path = GOLDEN / f"ci_report_{case}.md"
    if os.environ.get("PARALLAB_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; regenerate with PARALLAB_UPDATE_GOLDEN=1 and read the diff"
    assert report["changed"] is (case in ("exact_change", "timing_change"))


def test_the_timing_change_is_placed_at_its_commit_with_an_interval_and_a_bisect_range() -> None:
    report = assemble(series=SERIES, jobs=jobs_of(points(20, drop_at=12)), latest=None, window=10, alpha=0.01)
    tokens = next(t for t in report["timing"] if t["metric"] == "tokens_per_s")
    assert tokens["jobs"] == 20, "two uploads of one commit are one job"
    [change] = tokens["change_points"]
    assert change["commit"] == "000cc0ffee" and change["bisect"] == "000bc0ffee..000cc0ffee"
    assert change["lower_pct"] < -20 < change["upper_pct"] < 0 and change["worse"]
    assert 0.02 < tokens["cv"] < 0.06, "the between-job CV about each segment's mean, the drop not counted as noise"


def test_a_series_with_too_few_jobs_says_so_rather_than_judging() -> None:
    report = assemble(series=SERIES, jobs=jobs_of(points(7, drop_at=4, cv=0.0)), latest=None, window=10, alpha=0.01)
    tokens = next(t for t in report["timing"] if t["metric"] == "tokens_per_s")
    assert tokens["status"] == "too_few" and tokens["change_points"] == [] and tokens["needed"] == 8
    assert "not judged" in render(report) and report["changed"] is False
