"""The CI report as Markdown (golden files) for a no-change, an exact-change, a timing-change and a
host-slowdown series, and a series too short to judge; jobs are formed from repeats of one commit;
the timing verdict reads the raw or the host-normalised metric as its basis says.

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


def hosted(n: int, *, host_at: int | None = None, code_at: int | None = None, seed: int = 3) -> tuple[list[Any], list[float | None]]:
    """`n` jobs of tokens/s with the host-speed probe: from `host_at` on the host runs everything
    (the job and the probe alike) at 0.6 of its speed; from `code_at` on the code is 20 % slower."""
    rng = random.Random(seed)
    points, speeds = [], []
    for i in range(n):
        host = 0.6 if host_at is not None and i >= host_at else 1.0
        code = 0.8 if code_at is not None and i >= code_at else 1.0
        value = 1000.0 * host * code * (1 + rng.gauss(0, 0.03))
        points.append((f"{i:04x}beef", {"tokens_per_s": value, "step_time_p50": 512 / value}))
        speeds.append(2e7 * host * (1 + rng.gauss(0, 0.01)))
    return points, speeds


BUCKET = {"counter": "comm.all_reduce.g2.bytes", "category": "bytes", "old": 2000.0, "new": 3000.0, "delta": 1000.0, "change_pct": 50.0}
CASES = {
    "no_change": dict(jobs=points(20), latest=exact([])),
    "exact_change": dict(jobs=points(20), latest=exact([{**BUCKET, "accepted": False}])),
    "timing_change": dict(jobs=points(20, drop_at=15), latest=exact([])),  # among the latest jobs: "changed"
    "too_few": dict(jobs=points(5), latest={**exact([]), "baseline_run_id": None}),
    # the host slows from job 15: a change point raw, none normalised; every job probed, so the verdict reads normalised
    "host_change": dict(jobs=hosted(20, host_at=15)[0], speeds=hosted(20, host_at=15)[1], latest=exact([])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_markdown_report_matches_its_golden_file(case: str) -> None:
    given = CASES[case]
    report = assemble(series=SERIES, jobs=jobs_of(given["jobs"], given.get("speeds")), latest=given["latest"], window=10, alpha=0.01)
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


def report_of(points: list[Any], speeds: list[float | None]) -> dict[str, Any]:
    return assemble(series=SERIES, jobs=jobs_of(points, speeds), latest=None, window=10, alpha=0.01)


def by_metric(report: dict[str, Any], metric: str) -> dict[str, Any]:
    return next(t for t in report["timing"] if t["metric"] == metric)


def test_a_host_slowdown_is_a_change_point_raw_and_none_normalised() -> None:
    report = report_of(*hosted(16, host_at=8))
    for metric in ("tokens_per_s", "step_time_p50"):
        raw = by_metric(report, metric)
        assert [p["job"] for p in raw["change_points"]] == [8], "raw, the host's slowdown reads as a change"
        normalised = raw["normalised"]
        assert normalised["metric"] == f"{metric}/host" and normalised["jobs"] == 16 and normalised["status"] == "judged"
        assert normalised["change_points"] == [], "the probe slowed alike: nothing changed in the code"
        assert normalised["cv"] is not None and normalised["cv"] < 0.06, "3 % job noise and 1 % probe noise, the host's step gone"
    assert by_metric(report, "tokens_per_s")["normalised"]["unit"] == "tokens per Mop"
    assert report["host_speed"]["jobs_with_probe"] == 16 and "every job" in report["host_speed"]["note"]
    text = render(report)
    assert "Throughput ÷ host speed" in text and "Host speed: every job carries" in text


def test_a_code_slowdown_stays_a_change_point_when_normalised() -> None:
    report = report_of(*hosted(16, host_at=4, code_at=10))
    normalised = by_metric(report, "tokens_per_s")["normalised"]
    [change] = normalised["change_points"]
    assert change["job"] == 10 and change["worse"] and change["lower_pct"] < -20 < change["upper_pct"] < -10


def test_the_check_fails_when_the_probe_is_not_taken_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from parallab.core import hostspeed

    monkeypatch.setattr(hostspeed, "normalise", lambda value, ops_per_s, *, higher_is_better: value)  # the probe ignored
    normalised = by_metric(report_of(*hosted(16, host_at=8)), "tokens_per_s")["normalised"]
    assert [p["job"] for p in normalised["change_points"]] == [8], "without the probe, the host's change is back"


def test_uploads_without_the_probe_are_judged_raw_with_a_note() -> None:
    points, speeds = hosted(16, host_at=8)
    none = report_of(points, [None] * 16)
    assert "normalised" not in by_metric(none, "tokens_per_s") and none["host_speed"]["jobs_with_probe"] == 0
    assert "Host speed: no job carries a host-speed probe: timings are judged raw only." in render(none)
    mixed = report_of(points, [None] * 4 + speeds[4:])  # the first four uploaded before the probe existed
    normalised = by_metric(mixed, "tokens_per_s")["normalised"]
    assert by_metric(mixed, "tokens_per_s")["jobs"] == 16 and normalised["jobs"] == 12
    assert "4 of 16 jobs carry no host-speed probe: they are judged raw only" in render(mixed)
    short = report_of(points, [None] * 10 + speeds[10:])
    assert by_metric(short, "tokens_per_s")["normalised"]["status"] == "too_few", "6 probed jobs: not judged normalised"
    with pytest.raises(ValueError, match="speeds: 3 values for 16 results"):
        jobs_of(points, speeds[:3])


def basis_report(points: list[Any], speeds: list[float | None], basis: str = "auto") -> dict[str, Any]:
    return assemble(series=SERIES, jobs=jobs_of(points, speeds), latest=None, window=10, alpha=0.01, basis=basis)  # type: ignore[arg-type]


def test_the_verdict_reads_the_normalised_metric_where_every_job_carries_the_probe() -> None:
    points, speeds = hosted(20, host_at=15)  # the host slows among the latest jobs; the code does not
    auto = basis_report(points, speeds)
    for metric in ("tokens_per_s", "step_time_p50"):
        t = by_metric(auto, metric)
        assert [p["job"] for p in t["change_points"]] == [15] and t["change_points"][0]["recent"], "raw sees the host"
        assert t["judged_on"] == "normalised" and "every one of the 20 jobs compared" in t["judged_because"]
    assert auto["basis"] == "auto" and auto["timing_changed"] is False and auto["changed"] is False
    assert "The verdict reads the **normalised** throughput" in render(auto)
    raw = basis_report(points, speeds, "raw")
    assert by_metric(raw, "tokens_per_s")["judged_on"] == "raw" and raw["timing_changed"] is True and raw["changed"] is True
    assert "The verdict reads the **raw** throughput: asked for raw." in render(raw)


def test_a_code_slowdown_changes_the_normalised_verdict() -> None:
    auto = basis_report(*hosted(20, host_at=5, code_at=15))
    tokens = by_metric(auto, "tokens_per_s")
    assert tokens["judged_on"] == "normalised" and [p["job"] for p in tokens["normalised"]["change_points"]] == [15]
    assert auto["timing_changed"] is True and auto["changed"] is True


def test_one_job_without_the_probe_makes_auto_judge_raw_and_say_why() -> None:
    points, speeds = hosted(20, host_at=15)
    mixed = [None, *speeds[1:]]  # the first job uploaded before the probe existed
    auto = basis_report(points, mixed)
    tokens = by_metric(auto, "tokens_per_s")
    assert tokens["judged_on"] == "raw" and tokens["judged_because"] == "1 of the 20 jobs compared carry no host-speed probe"
    assert auto["changed"] is True, "raw: the host's slowdown reads as a change"
    forced = basis_report(points, mixed, "normalised")
    tokens = by_metric(forced, "tokens_per_s")
    assert tokens["judged_on"] == "normalised" and "the 1 jobs without the probe are left out" in tokens["judged_because"]
    assert forced["changed"] is False
    none = basis_report(points, [None] * 20, "normalised")
    assert by_metric(none, "tokens_per_s")["judged_on"] == "raw", "nothing to normalise by: raw, and it says so"
    assert by_metric(none, "tokens_per_s")["judged_because"] == "no job compared carries the host-speed probe"


def test_a_job_with_one_unprobed_repeat_is_not_normalised() -> None:
    points, speeds = hosted(3)
    twice = [p for p in points for _ in range(2)]  # each commit uploaded twice: one job each
    jobs = jobs_of(twice, [speeds[0], None, speeds[1], speeds[1], speeds[2], speeds[2]])
    assert [j.ops_per_s is None for j in jobs] == [True, False, False]


def test_a_metric_without_a_normalised_form_is_judged_raw_and_a_bad_basis_is_refused() -> None:
    points, speeds = hosted(20)
    with_exposed = [(c, {**v, "exposed_comm_fraction": 0.3}) for c, v in points]
    exposed = by_metric(basis_report(with_exposed, speeds, "normalised"), "exposed_comm_fraction")
    assert exposed["judged_on"] == "raw" and "not normalised" in exposed["judged_because"]
    with pytest.raises(ValueError, match="basis: 'normal' is not one of auto, raw, normalised"):
        basis_report(points, speeds, "normal")
