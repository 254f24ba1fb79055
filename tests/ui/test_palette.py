"""One visual language: every colour of the palette has one meaning, and the figures use it."""

from __future__ import annotations

from backend.figures import compare, palette, scaling
from backend.figures.common import MEMORY_SPLIT_COLOURS, SPLIT_COLOURS


def test_no_colour_means_two_things() -> None:
    groups = {
        "time": list(palette.TIME.values()),
        "memory": [*palette.MEMORY.values(), palette.COMM_BUFFERS],
        "runs": palette.RUNS,
        "ops": palette.OPS,
        "live": list(palette.LIVE_COLOURS.values()),
        "strategies": [*palette.STRATEGIES.values(), *palette.OTHER_STRATEGIES],
        "bytes": list(palette.BYTES.values()),
        "roles": list(palette.ROLES.values()),
        "series": list(palette.SERIES.values()),
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


# ---- every built figure's traces stay within their colour groups ----

NEUTRAL = {"#ffffff"}
"""White: the hatching over a bar's own colour (a pattern's foreground), no meaning of its own."""


def _groups() -> dict[str, set[str]]:
    return {
        "time": {c.lower() for c in palette.TIME.values()},
        "memory": {c.lower() for c in [*palette.MEMORY.values(), palette.COMM_BUFFERS]},
        "runs": {c.lower() for c in palette.RUNS},
        "ranks": {c.lower() for n in range(1, 17) for c in palette.rank_colours(n)},
        "strategies": {c.lower() for c in [*palette.STRATEGIES.values(), *palette.OTHER_STRATEGIES]},
        "bytes": {c.lower() for c in palette.BYTES.values()},
        "roles": {c.lower() for c in palette.ROLES.values()},
        "series": {c.lower() for c in [*palette.SERIES.values(), palette.BAND_FILL]},
        "ops": {c.lower() for c in palette.OPS},
        "live": {c.lower() for c in palette.LIVE_COLOURS.values()},
        "verdict": {c.lower() for c in palette.VERDICT.values()},
        "lines": {palette.INK.lower(), palette.MUTED.lower()},
    }


def _colours(node: object) -> list[str]:
    """Every colour a trace sets (marker, line, fill, pattern, marker outline), lists expanded."""
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("color", "fillcolor", "fgcolor", "bgcolor"):
                out += [v for v in (value if isinstance(value, list | tuple) else [value]) if isinstance(v, str)]
            elif key != "hoverlabel":
                out += _colours(value)
    elif isinstance(node, list | tuple):
        for item in node:
            out += _colours(item)
    return out


def _outside(fig, allowed: set[str]) -> list[tuple[str, str]]:
    """(trace, colour) of every colour outside the `allowed` groups; a trace with no colour at all
    would take the template's colourway (the runs'), which only run figures may."""
    groups = _groups()
    ok = set().union(*(groups[g] for g in allowed)) | NEUTRAL
    bad = []
    for trace in fig.data:
        found = _colours({k: v for k, v in trace.items() if k in ("marker", "line", "fillcolor")})
        if not found and "runs" not in allowed:
            bad.append((trace.get("name"), "colourway (no colour set)"))
        bad += [(trace.get("name"), c) for c in found if c.lower() not in ok]
    return bad


def _documents() -> dict[str, dict]:
    from tests.ui.factories import make_document, with_memory_timeline, with_timeline

    docs = {
        key: make_document(strategy=s, world_size=n, tokens_per_s=tps, name=f"{s} ×{n}")
        for key, s, n, tps in (
            ("ddp", "ddp", 2, 16_000.0),
            ("fsdp", "fsdp", 4, 25_000.0),
            ("pp", "pp", 4, 15_000.0),
            ("moe", "moe", 2, 12_000.0),
        )
    }
    docs["ddp"] = with_memory_timeline(with_timeline(docs["ddp"], events_per_rank=20))
    docs["pp"] = docs["pp"].model_copy(update={"critical_path": _critical_path()})
    return {k: d.model_dump(mode="json") for k, d in docs.items()}


def _critical_path():
    """Two stages: stage 1 waits for its input (bubble), receives it, computes, all-reduces."""
    from parallab.core.critpath import COLL, COMPUTE, RECV, SEND, StepSegments, analyse

    s0, s2 = StepSegments(start_us=0, end_us=990), StepSegments(start_us=0, end_us=1000)
    s0.add(COMPUTE, "matmul", "", -1, 0, 500)
    s0.add(SEND, "pp send", "p2p:0->2", 0, 500, 520)
    s2.add(RECV, "pp recv", "p2p:0->2", 0, 0, 520)
    s2.add(COMPUTE, "attention", "", -1, 520, 900)
    s2.add(COLL, "all_reduce", "2,3", 0, 900, 1000)
    s3 = StepSegments(start_us=0, end_us=1000)
    s3.add(COMPUTE, "norms and elementwise", "", -1, 0, 950)
    s3.add(COLL, "all_reduce", "2,3", 0, 950, 1000)
    return analyse({0: [s0], 2: [s2], 3: [s3]}, world_size=4, mesh=[("pp", 2), ("dp_shard", 2)])


RUN_FIGURES = {
    "memory": {"memory", "lines"},
    "steps": {"time"},
    "comm": {"ranks", "lines"},
    "timeline": {"ops"},
    "loss": {"runs", "lines"},
    "volume": {"bytes"},
    "moe": {"ranks", "time"},
    "bubble": {"time", "lines"},
    "memory_timeline": {"memory", "lines"},
    "critical_path": {"ops", "time"},
}
COMPARE_FIGURES = {
    "throughput": {"runs", "lines"},
    "memory": {"memory"},
    "comm": {"runs"},
    "steps": {"time"},
    "exposure": {"time"},
    "gradients": {"verdict", "lines"},
    "loss": {"runs", "lines"},
    "memory_timeline": {"runs", "lines"},
}


def test_every_run_figure_draws_in_its_own_groups_only() -> None:
    from backend.figures.run import run_figures

    seen: set[str] = set()
    for name, doc in _documents().items():
        for key, fig in run_figures(doc).items():
            if fig is None:
                continue
            seen.add(key)
            assert key in RUN_FIGURES, f"a new run figure {key}: give it its groups here"
            assert _outside(fig, RUN_FIGURES[key]) == [], (name, key, _outside(fig, RUN_FIGURES[key]))
    assert {"moe", "volume", "timeline", "bubble", "memory_timeline", "critical_path"} <= seen, seen
    moe = run_figures(_documents()["moe"])["moe"]
    assert palette.TIME["imbalance"] in _colours([t.get("line") for t in moe.data]), "the imbalance colour draws the MoE mean line"


def test_every_compare_figure_draws_in_its_own_groups_only() -> None:
    from backend.figures.compare import compare_figures

    docs = _documents()
    figures = compare_figures([(d["name"], d) for d in docs.values()])
    for key, fig in figures.items():
        assert key in COMPARE_FIGURES, f"a new compare figure {key}: give it its groups here"
        assert _outside(fig, COMPARE_FIGURES[key]) == [], (key, _outside(fig, COMPARE_FIGURES[key]))


def test_scaling_sweep_series_and_live_figures_draw_in_their_own_groups() -> None:
    from backend.figures import live, series, sweeps
    from backend.services.leaderboard import with_efficiency
    from parallab.core.strategies import TRAINING_STRATEGIES

    assert set(TRAINING_STRATEGIES) <= set(palette.STRATEGIES), "every strategy has its own colour"
    points = with_efficiency([_point("ddp", 2, 100.0), _point("ddp", 4, 180.0), _point("fsdp", 2, 90.0), _point("fsdp", 4, 170.0)])
    for fig in (scaling.throughput(points), scaling.efficiency(points)):
        assert _outside(fig, {"strategies", "lines"}) == []
    # a strategy keeps its colour whichever others are drawn beside it
    alone = [t for t in scaling.throughput(with_efficiency([_point("fsdp", 2, 90.0)])).data if t["name"] == "fsdp"]
    beside = [t for t in scaling.throughput(points).data if t["name"] == "fsdp"]
    assert alone[0]["line"]["color"] == beside[0]["line"]["color"] == palette.strategy_colour("fsdp")

    sweep_points = [
        {"label": f"c{i}", "role": role, "predicted_tokens_per_s": 100.0 * (i + 1), "measured_tokens_per_s": 90.0 * (i + 1),
         "predicted_memory_bytes": 2**20 * (i + 1), "measured_memory_bytes": 2**20 * (i + 2), "status": "succeeded"}
        for i, role in enumerate(("top", "top", "control"))
    ]  # fmt: skip
    for fig in sweeps.sweep_figures(sweep_points, spearman=1.0).values():
        assert _outside(fig, {"roles", "lines"}) == []

    history = [
        {"label": "a", "value": 100.0, "lower": None, "upper": None, "verdict": "no_baseline", "dismissed": False},
        {"label": "b", "value": 80.0, "lower": 90.0, "upper": 110.0, "verdict": "regressed", "dismissed": False},
        {"label": "c", "value": 120.0, "lower": 90.0, "upper": 110.0, "verdict": "improved", "dismissed": False},
    ]
    assert _outside(series.history(history, title="Throughput", unit="tokens/s", higher_is_better=True), {"series", "verdict"}) == []

    steps = [
        {"phase": "train", "step": i, "loss": 5.0 - i / 10, "tokens_per_s": 1000.0, "memory_bytes": 2**24, "t": float(i)} for i in range(5)
    ]
    assert _outside(live.live_figure(steps), {"live"}) == []


def test_a_colour_outside_its_group_is_caught() -> None:
    from backend.figures.common import figure

    fig = figure("t", x="x", y="y")
    fig.add_bar(name="compute?", x=[1], y=[1], marker_color=palette.run_colour(0))
    fig.add_scatter(name="no colour", x=[1], y=[1])
    assert _outside(fig, {"time"}) == [("compute?", palette.run_colour(0)), ("no colour", "colourway (no colour set)")]
