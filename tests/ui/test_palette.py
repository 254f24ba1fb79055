"""One visual language: every colour of the palette has one meaning, and the figures use it."""

from __future__ import annotations

from backend.figures import compare, palette, scaling
from backend.figures.common import MEMORY_SPLIT_COLOURS, SPLIT_COLOURS


def test_no_colour_means_two_things() -> None:
    groups = {
        "time": list(palette.TIME.values()),
        "memory": list(palette.MEMORY.values()),
        "runs": palette.RUNS,
        "ops": palette.OPS,
        "live": list(palette.LIVE_COLOURS.values()),
        "lines": [palette.INK, palette.MUTED],
    }
    owner: dict[str, str] = {}
    for group, colours in groups.items():
        assert len(set(colours)) == len(colours), f"{group} repeats a colour"
        for colour in colours:
            assert colour.lower() not in owner, f"{colour} is both {owner[colour.lower()]} and {group}"
            owner[colour.lower()] = group
    assert set(palette.VERDICT.values()).isdisjoint(owner), "a pass/fail colour means something else too"


def test_the_figures_draw_the_step_split_and_memory_in_the_palettes_colours() -> None:
    assert {k: palette.TIME[k] for k in ("compute", "overlapped comm", "exposed comm", "idle / bubble")} == SPLIT_COLOURS
    assert MEMORY_SPLIT_COLOURS == palette.MEMORY
    assert palette.TIME["exposed comm"] != palette.TIME["idle / bubble"]


def test_each_run_keeps_its_colour_in_compare() -> None:
    docs = [(f"run {i}", {"summary": {"tokens_per_s": 1000.0 * (i + 1)}}) for i in range(3)]
    bars = compare.throughput(docs).data[0]
    assert list(bars["marker"]["color"]) == [palette.run_colour(i) for i in range(3)]


def test_ranks_get_one_colour_each_in_order() -> None:
    colours = palette.rank_colours(4)
    assert len(set(colours)) == 4 and palette.rank_colours(1)


def _point(strategy: str, world: int, tps: float) -> dict:
    return {"strategy": strategy, "world_size": world, "tokens_per_s": tps, "runs": 1}


def test_the_scaling_axis_is_ticked_at_the_world_sizes_and_one_size_has_no_efficiency() -> None:
    from backend.services.leaderboard import with_efficiency

    points = with_efficiency([_point("ddp", 2, 100.0), _point("ddp", 4, 180.0), _point("fsdp", 8, 300.0)])
    fig = scaling.throughput(points)
    assert list(fig.layout["xaxis"]["tickvals"]) == [2, 4, 8] and list(fig.layout["xaxis"]["ticktext"]) == ["2", "4", "8"]
    by = {(p["strategy"], p["world_size"]): p for p in points}
    assert by[("ddp", 2)]["efficiency"] is None and by[("fsdp", 8)]["efficiency"] is None  # each its own baseline
    assert abs(by[("ddp", 4)]["efficiency"] - 0.9) < 1e-9
    names = [t["name"] for t in scaling.efficiency(points).data]
    assert names == ["ddp"]  # fsdp, seen at one world size, has no efficiency to draw
    single_size = with_efficiency([_point("fsdp", 8, 300.0)])
    assert scaling.efficiency(single_size).layout["annotations"][0]["text"].startswith("one world size per strategy")
