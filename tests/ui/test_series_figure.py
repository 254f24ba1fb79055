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
