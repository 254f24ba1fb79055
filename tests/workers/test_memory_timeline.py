"""Memory over the profiled step, by category, from real gloo runs of the module family on tiny.

Three jobs shared by every test here, in one 2-rank launch (`harness_jobs`): DDP × 2, the same
with each block keeping a copy of its output (`lab_builds.keeps_a_copy_of_each_activation`, the
mutation), and FSDP × 2. The rules
themselves are checked on synthetic events first (no launch)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from parallab.core.result import MEMORY_TIMELINE_CATEGORIES, MemoryPeak, MemoryPoint, ResultDocument
from tests.workers.module_driver import MODULE_WORKLOAD
from workers.harness import memtimeline

MUTANT = {**MODULE_WORKLOAD, "module": "tests.workers.lab_builds:keeps_a_copy_of_each_activation"}
COPY_BYTES = 4 * 64 * 64 * 4
"""One block's output on one rank: local batch 8/2 × seq 64 × hidden 64 × fp32."""


def _mem(ts: float, nbytes: int, addr: int, total: int) -> dict[str, Any]:
    return {"ph": "i", "name": "[memory]", "ts": ts, "args": {"Bytes": nbytes, "Addr": addr, "Total Allocated": total, "Device Type": 0}}


def _mark(ts: float, name: str, dur: float = 0.0) -> dict[str, Any]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur}


def test_rules_on_synthetic_events() -> None:
    """A kept forward allocation is an activation, one freed in its phase a temporary, one made in a
    collective a comm buffer, the step's final grad a gradient; a free of a start tensor leaves its category."""
    events = [
        _mark(0, memtimeline.PHASE_MARK + "forward blocks.0"),
        _mem(1, 100, 1, 100),  # kept -> activations
        _mem(2, 10, 2, 110),
        _mem(3, -10, 2, 100),  # freed in phase -> temporaries
        _mark(4, "c10d::allreduce_", dur=2),
        _mem(5, 7, 3, 107),  # comm buffer
        _mark(6, memtimeline.PHASE_MARK + "backward blocks.0"),
        _mem(7, -100, 1, 7),
        _mem(8, 40, 4, 47),  # the step's gradient
        _mem(9, -5, 99, 42),  # a start tensor (optimizer) freed
    ]
    known = memtimeline.Known(start={99: ("optimizer", 5), 98: ("params", 50)}, end={4: "grads"})
    points = memtimeline.timeline(events, {"ts": 0, "dur": 10}, known)
    assert [p.phase for p in points][:1] == ["forward blocks.0"] and points[-1].phase == "backward blocks.0"
    assert points[0].categories.get("activations", 0) == 100 and points[2].categories.get("temporaries", 0) == 0
    assert points[3].categories.get("comm_buffers", 0) == 7 and points[3].op == "c10d::allreduce_"
    assert (
        points[-1].categories.get("grads", 0) == 40
        and points[-1].categories.get("optimizer", 0) == 0
        and points[-1].categories.get("params", 0) == 50
    )
    assert all(sum(p.categories.values()) == p.allocated for p in points)
    totals = [e["args"]["Total Allocated"] - 100 for e in events if e["name"] == "[memory]"]
    on_gpu = {**_mem(2.5, 1 << 20, 7, 1 << 20), "args": {**_mem(2.5, 1 << 20, 7, 1 << 20)["args"], "Device Type": 1}}
    assert memtimeline.timeline([*events, on_gpu], {"ts": 0, "dur": 10}, known) == points  # another device's events are not this one's
    assert [p.allocated for p in memtimeline.timeline([*events, on_gpu], {"ts": 0, "dur": 10}, known, device_type=1)] == [(1 << 20) + 55]
    assert [p.allocated - points[0].allocated for p in points] == totals


def test_downsample_keeps_the_peak_and_the_bound() -> None:
    pts = [MemoryPoint(phase="p", t_us=i, allocated=(i * 7919) % 1000, categories={"other": (i * 7919) % 1000}) for i in range(5000)]
    kept = memtimeline.downsample(pts, 100)
    assert 90 <= len(kept) <= 100 and max(p.allocated for p in kept) == max(p.allocated for p in pts)
    assert [p.t_us for p in kept] == sorted(p.t_us for p in kept)
    phased = [MemoryPoint(phase=f"p{i // 50}", t_us=i, allocated=i % 7, categories={"other": i % 7}) for i in range(5000)]
    kept = memtimeline.downsample(phased, 256)
    assert len(kept) <= 256 and {p.t_us for p in kept} >= {50 * k + 49 for k in range(100)}  # every phase's last point


@pytest.fixture(scope="module")
def launched(harness_jobs: Callable[..., list[tuple[ResultDocument, Path]]]) -> dict[str, tuple[ResultDocument, Path]]:
    jobs: dict[str, tuple[str, int, dict[str, Any], dict[str, Any]]] = {
        "ddp": ("ddp", 2, {}, MODULE_WORKLOAD),
        "mutant": ("ddp", 2, {}, MUTANT),
        "fsdp": ("fsdp", 2, {}, MODULE_WORKLOAD),
    }
    return dict(zip(jobs, harness_jobs(list(jobs.values())), strict=True))


@pytest.fixture(scope="module")
def runs(launched: dict[str, tuple[ResultDocument, Path]]) -> dict[str, ResultDocument]:
    return {name: doc for name, (doc, _) in launched.items()}


def _timeline(doc: ResultDocument, rank: int = 0) -> list[MemoryPoint]:
    return next(r for r in doc.ranks if r.rank == rank).memory_timeline


@pytest.mark.slow
def test_categories_sum_to_allocated_at_every_point(runs: dict[str, ResultDocument]) -> None:
    for name, doc in runs.items():
        for rank in doc.ranks:
            points = rank.memory_timeline
            assert len(points) > 20, (name, rank.rank, len(points))
            assert all(sum(p.categories.values()) == p.allocated for p in points)
            assert all(tuple(p.categories) == MEMORY_TIMELINE_CATEGORIES for p in points)  # every category, in order
            assert {p.phase for p in points} >= {"forward lab.blocks.0", "forward lab.blocks.1", "backward lab.blocks.0", "optimizer"}, name


@pytest.mark.slow
def test_allocated_follows_the_profilers_own_running_total(launched: dict[str, tuple[ResultDocument, Path]]) -> None:
    """Each point's allocated bytes move as the trace's "Total Allocated" does (the events' own count)."""
    for name, (doc, run_dir) in launched.items():
        trace = json.loads(gzip.decompress((run_dir / "trace_rank0.json.gz").read_bytes()))["traceEvents"]
        span = max((e for e in trace if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: float(e["ts"]))
        totals = {
            round(float(e["ts"]) - float(span["ts"]), 3): int(e["args"]["Total Allocated"]) for e in trace if e.get("name") == "[memory]"
        }
        points = _timeline(doc)
        first = points[0]
        assert all(p.allocated - first.allocated == totals[round(p.t_us, 3)] - totals[round(first.t_us, 3)] for p in points), name


@pytest.mark.slow
def test_kept_copies_show_as_activations_in_their_blocks_forward(runs: dict[str, ResultDocument]) -> None:
    base, mutant = _timeline(runs["ddp"]), _timeline(runs["mutant"])

    def last(points: list[MemoryPoint], phase: str, key: str) -> int:
        return [p.categories.get(key, 0) for p in points if p.phase == phase][-1]

    for i in range(2):
        phase = f"forward lab.blocks.{i}"
        assert last(mutant, phase, "activations") - last(base, phase, "activations") == (i + 1) * COPY_BYTES, phase
        assert last(mutant, phase, "temporaries") == last(base, phase, "temporaries"), phase
    assert last(mutant, "forward lab", "activations") == last(base, "forward lab", "activations")  # before the first block


@pytest.mark.slow
def test_fsdp_gathers_and_frees_each_block_and_the_peak_difference_is_explained(runs: dict[str, ResultDocument]) -> None:
    fsdp, ddp = _timeline(runs["fsdp"]), _timeline(runs["ddp"])
    for i in range(2):
        comm = [p.categories.get("comm_buffers", 0) for p in fsdp if p.phase == f"forward lab.blocks.{i}"]
        assert max(comm) > comm[-1] >= 0, (i, comm)  # gathered, then freed within the block's forward
    assert max(p.categories.get("comm_buffers", 0) for p in ddp if p.phase.startswith("forward")) == 0
    peak_f, peak_d = memtimeline.peak(fsdp), memtimeline.peak(ddp)
    assert peak_f is not None and peak_d is not None
    measured = peak_f.allocated - peak_d.allocated
    explained = sum(peak_f.categories.get(k, 0) - peak_d.categories.get(k, 0) for k in {*peak_f.categories, *peak_d.categories})
    assert abs(explained - measured) <= 0.05 * abs(measured)
    assert peak_f.categories.get("params", 0) < peak_d.categories["params"]  # FSDP holds half the parameters


@pytest.mark.slow
def test_timeline_size_in_the_document(runs: dict[str, ResultDocument]) -> None:
    for doc in runs.values():
        for rank in doc.ranks:
            size = len(json.dumps([p.model_dump(mode="json") for p in rank.memory_timeline]))
            assert len(rank.memory_timeline) <= memtimeline.DEFAULT_POINTS and size < 200_000


def test_phase_marks_in_process_name_forward_backward_and_recomputation(tmp_path: Path) -> None:
    """One process, no launch: the marks the harness places name each block's forward, its
    backward (last block first) and, under activation checkpointing, its recomputation."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from workers.harness.memwatch import phase_marks

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False) if x.requires_grad else layer(x)
            return x

    net, x = Net(), torch.randn(8, 32, requires_grad=True)
    with torch.profiler.profile(profile_memory=True) as prof, phase_marks(net), torch.profiler.record_function("ProfilerStep#0"):
        net(x).sum().backward()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    span = next(e for e in events if e.get("name") == "ProfilerStep#0")
    marks = [
        e["name"].removeprefix(memtimeline.PHASE_MARK)
        for e in sorted(events, key=lambda e: e["ts"])
        if e.get("name", "").startswith(memtimeline.PHASE_MARK)
    ]
    assert marks[:2] == ["forward layers.0", "forward layers.1"]
    assert marks.index("backward layers.1") < marks.index("recompute layers.1")
    assert "recompute layers.0" in marks
    points = memtimeline.timeline(events, span, memtimeline.Known())
    assert points and all(sum(p.categories.values()) == p.allocated for p in points)


def test_live_at_peak_groups_by_category_module_and_phase_and_adds_up_to_the_peak() -> None:
    """Synthetic events: the peak's live set is the start tensors still alive plus the step's
    allocations not yet freed, grouped; the top `n` and the rest add up to the peak exactly, and a
    freed tensor the harness did not know is counted apart rather than lost."""
    events = [
        _mark(0, memtimeline.PHASE_MARK + "forward layers.0"),
        _mem(1, 100, 1, 100),
        _mem(2, 30, 2, 130),
        _mark(3, memtimeline.PHASE_MARK + "forward layers.1"),
        _mem(3.5, -7, 77, 123),  # alive before the step, not known to the harness
        _mem(4, 100, 3, 223),
        _mark(6, memtimeline.PHASE_MARK + "backward layers.1"),
        _mem(7, -100, 3, 123),
    ]
    known = memtimeline.Known(start={98: ("params", 50), 99: ("params", 20)}, names={98: "layers.0.w", 99: "layers.1.w"})
    peak = memtimeline.live_at_peak(events, {"ts": 0, "dur": 10}, known)
    assert peak is not None and peak.phase == "forward layers.1" and peak.allocated == 70 + 230 - 7 == 293
    rows = {(a.category, a.module, a.phase): (a.bytes, a.count) for a in peak.top}
    assert rows[("activations", "layers.0", "forward layers.0")] == (130, 2)
    assert rows[("activations", "layers.1", "forward layers.1")] == (100, 1)
    assert rows[("params", "layers.0", memtimeline.BEFORE)] == (50, 1)
    assert peak.unaccounted_bytes == -7
    assert sum(a.bytes for a in peak.top) + peak.rest_bytes + peak.unaccounted_bytes == peak.allocated
    two = memtimeline.live_at_peak(events, {"ts": 0, "dur": 10}, known, top=2)
    assert two is not None and [a.bytes for a in two.top] == [130, 100] and (two.rest_bytes, two.rest_count) == (70, 2)
    with pytest.raises(ValueError, match="sum to"):  # the document refuses a table that does not add up
        MemoryPeak.model_validate({**two.model_dump(), "rest_bytes": 69})
    assert memtimeline.live_at_peak([], {"ts": 0, "dur": 10}, known) is None
    # One microsecond holding the free of an address and its reuse, sorted reuse first: the free
    # ends the allocation of its own size, so the new one stays live and the table still adds up.
    reuse = [
        _mark(0, memtimeline.PHASE_MARK + "forward layers.0"),
        _mem(1, 50, 1, 50),
        _mem(2, 100, 1, 150),  # the new allocation at address 1 ...
        _mem(2, -50, 1, 100),  # ... sorted before the old one's free, at the same timestamp
        _mem(3, 10, 2, 110),
    ]
    peak = memtimeline.live_at_peak(reuse, {"ts": 0, "dur": 10}, memtimeline.Known())
    assert peak is not None and peak.allocated == 150 and peak.unaccounted_bytes == 0
    after = memtimeline.timeline(reuse, {"ts": 0, "dur": 10}, memtimeline.Known())[-1]
    assert after.allocated == 110 and after.categories["activations"] == 110


def test_samples_ride_beside_the_points_and_cuda_stacks_are_read_by_address() -> None:
    """What the framework cannot see: each point carries the latest sample mark before it; the CUDA
    snapshot's stacks attach to the uncategorised groups only (the format read on a synthetic snapshot)."""
    assert memtimeline.decode_sample(memtimeline.encode_sample({"rss": 5, "reserved": None, "bogus": 3})) == {"rss": 5}
    events = [
        _mem(1, 10, 1, 10),
        _mark(2, memtimeline.encode_sample({"rss": 1000, "reserved": 64})),
        _mem(3, 10, 2, 20),
        _mark(4, memtimeline.encode_sample({"rss": 2000})),
        _mem(5, 10, 3, 30),
    ]
    points = memtimeline.timeline(events, {"ts": 0, "dur": 10}, memtimeline.Known())
    assert [(p.rss, p.reserved) for p in points] == [(None, None), (1000, 64), (2000, None)]
    snapshot = {
        "segments": [
            {
                "address": 4096,
                "blocks": [
                    {
                        "address": 4096,
                        "size": 512,
                        "state": "active_allocated",
                        "frames": [{"filename": "model.py", "line": 12, "name": "forward"}],
                    },
                    {"address": 8192, "size": 512, "state": "inactive", "frames": [{"filename": "x.py", "line": 1, "name": "f"}]},
                    {
                        "address": 9000,
                        "size": 8,
                        "state": "active_allocated",
                        "history": [{"frames": [{"filename": "y.py", "line": 2, "name": "g"}]}],
                    },
                ],
            }
        ]
    }
    stacks = memtimeline.stacks_by_address(snapshot)
    assert stacks == {4096: ["model.py:12 forward"], 9000: ["y.py:2 g"]}
    known = memtimeline.Known(start={4096: ("other", 512), 9000: ("params", 8)})
    peak = memtimeline.live_at_peak([_mem(1, 10, 1, 10)], {"ts": 0, "dur": 10}, known, stacks=stacks)
    assert peak is not None
    by_category = {a.category: a.stack for a in peak.top}
    assert by_category["other"] == ["model.py:12 forward"] and by_category["params"] is None


@pytest.mark.slow
def test_the_peak_table_adds_up_to_the_peak_and_to_its_categories(runs: dict[str, ResultDocument]) -> None:
    """On CPU the events are exact: the live groups at each rank's peak sum to the peak's allocated
    bytes with nothing unaccounted, and by category to the peak point's categories."""
    for name, doc in runs.items():
        for rank in doc.ranks:
            peak, top = rank.memory_peak, memtimeline.peak(rank.memory_timeline)
            assert peak is not None and top is not None, name
            assert peak.allocated == top.allocated and peak.phase == top.phase and peak.unaccounted_bytes == 0, name
            assert 5 <= len(peak.top) <= memtimeline.TOP and sum(a.bytes for a in peak.top) + peak.rest_bytes == peak.allocated
            # every group (the rest too) by category is the timeline's split at the peak
            assert peak.rest_bytes < 0.1 * peak.allocated, (name, peak.rest_bytes)
            by_category = dict.fromkeys(MEMORY_TIMELINE_CATEGORIES, 0)
            for a in peak.top:
                by_category[a.category] += a.bytes
            assert all(by_category[k] <= top.categories[k] for k in MEMORY_TIMELINE_CATEGORIES), name
            assert sum(top.categories[k] - by_category[k] for k in MEMORY_TIMELINE_CATEGORIES) == peak.rest_bytes


@pytest.mark.slow
def test_the_kept_copies_are_in_the_peak_table_as_activations_of_their_blocks(runs: dict[str, ResultDocument]) -> None:
    base, mutant = (next(r for r in runs[k].ranks if r.rank == 0).memory_peak for k in ("ddp", "mutant"))
    assert base is not None and mutant is not None

    def activations(peak: MemoryPeak, block: int) -> int:
        return sum(a.bytes for a in peak.top if a.category == "activations" and a.phase == f"forward lab.blocks.{block}")

    for i in range(2):
        assert activations(mutant, i) - activations(base, i) == COPY_BYTES, i


@pytest.mark.slow
def test_rss_is_sampled_beside_the_allocated_bytes_on_cpu(runs: dict[str, ResultDocument]) -> None:
    for name, doc in runs.items():
        points = _timeline(doc)
        sampled = [p for p in points if p.rss is not None]
        assert len(sampled) >= len(points) - 5, name  # from the step start's sample on
        assert all((p.rss or 0) > p.allocated for p in sampled) and all(p.reserved is None and p.device_used is None for p in points)


@pytest.mark.slow
def test_the_predicted_curve_lines_up_with_the_measured_phases(runs: dict[str, ResultDocument]) -> None:
    """The planner's curve over each run's own phases: one predicted point per measured phase, the
    forward's per-block rise the model's per-block activations (within 10 %: the planner counts the
    lab model's blocks as its own architecture's, and measures 7.9 % under), FSDP's gathered layer
    only in FSDP, and the gap sentence naming one of the run's phases."""
    from backend.figures import memory as figures
    from parallab.core import memory_curve

    for name, doc in runs.items():
        data = doc.model_dump(mode="json")
        chosen = figures.chosen_rank(data, 0)
        assert chosen is not None
        curve = figures.predicted(data, chosen)
        assert curve is not None, name
        order = figures.phase_order([chosen["memory_timeline"]])
        assert [p.phase for p in curve] == order
        highest = {r["phase"]: r["measured"] for r in memory_curve.gaps(chosen["memory_timeline"], curve)}
        predicted = {p.phase: p for p in curve}
        rise = highest["forward lab.blocks.1"] - highest["forward lab.blocks.0"]
        model = predicted["forward lab.blocks.1"].allocated - predicted["forward lab.blocks.0"].allocated
        if name != "mutant":
            assert abs(rise - model) <= 0.10 * model, (name, rise, model)
        assert (predicted["forward lab.blocks.0"].categories["comm_buffers"] > predicted["optimizer"].categories["comm_buffers"]) == (
            name == "fsdp"
        )
        gaps = figures.prediction_gaps(data, 0)
        assert gaps is not None and gaps["largest"]["phase"] in order and gaps["sentence"].endswith(" in " + gaps["largest"]["phase"])
