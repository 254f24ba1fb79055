"""The CI series' history figure (issue #11): pure, data in and a figure out."""

from __future__ import annotations

from backend.figures.series import history


def point(
    value: float, verdict: str, *, dismissed: bool = False, band: tuple[float, float] | None = (90.0, 110.0), commit: str = "abc1234"
) -> dict:
    lower, upper = band if band else (None, None)
    return {
        "label": commit[:8],
        "value": value,
        "lower": lower,
        "upper": upper,
        "verdict": verdict,
        "dismissed": dismissed,
        "commit": commit,
        "branch": "main",
    }


def test_the_band_the_line_and_the_alerts_are_drawn() -> None:
    points = [
        point(100, "no_baseline", band=None),
        point(101, "unchanged"),
        point(80, "regressed"),
        point(79, "regressed", dismissed=True),
        point(130, "improved"),
    ]
    fig = history(points, title="Throughput", unit="tokens/s", higher_is_better=True)
    traces = {t["name"]: t for t in fig.data}
    band = traces["threshold band"]
    assert band["fill"] == "toself" and list(band["x"]) == [2, 3, 4, 5, 5, 4, 3, 2], "only the results that had a baseline carry a band"
    assert list(traces["Throughput"]["y"]) == [100, 101, 80, 79, 130]
    alerts = traces["alert"]
    assert list(alerts["x"]) == [3, 4] and list(alerts["marker"]["symbol"]) == ["x", "x-open"], "a dismissed alert is drawn hollow"
    assert list(traces["improved"]["x"]) == [5]
    assert list(fig.layout["xaxis"]["ticktext"]) == ["abc1234"] * 5 and "higher is better" in fig.layout["title"]["text"]


def test_an_empty_series_says_so() -> None:
    fig = history([], title="Throughput", unit="tokens/s", higher_is_better=True)
    assert fig.layout["annotations"][0]["text"] == "no results on this series yet"


def test_normalised_change_points_are_drawn_dotted_beside_the_raw_ones_and_the_verdicts_is_labelled() -> None:
    from backend.figures import palette

    points = [{**point(100.0 if i < 3 else 80.0, "unchanged", commit=f"c{i}"), "run_id": f"r{i}"} for i in range(5)]
    raw = [{"run_id": "r3", "commit": "c3", "size_pct": -20.0}]
    normalised = [{"run_id": "r2", "commit": "c2", "size_pct": -19.0}]
    fig = history(points, title="T", unit="u", higher_is_better=True, changes=raw, normalised_changes=normalised, judged_on="normalised")
    lines = [(s["x0"], s["line"]["dash"], s["line"]["color"]) for s in fig.layout["shapes"]]
    assert lines == [(3.5, "dash", palette.VERDICT["regressed"]), (2.5, "dot", palette.SERIES["normalised"])]
    notes = [a["text"] for a in fig.layout["annotations"]]
    assert notes == ["change at c3 (-20%)", "÷ host speed: change at c2 (-19%) — the verdict's"]
    plain = history(points, title="T", unit="u", higher_is_better=True, changes=raw)
    assert [a["text"] for a in plain.layout["annotations"]] == ["change at c3 (-20%)"], "nothing normalised: no verdict mark"
