"""Memory over the profiled step, by category, from real gloo runs of the module family on tiny.

Three launches shared by every test here: DDP × 2, the same with each block keeping a copy of its
output (`lab_builds.keeps_a_copy_of_each_activation`, the mutation), and FSDP × 2. The rules
themselves are checked on synthetic events first (no launch)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from parallab.core.result import MEMORY_TIMELINE_CATEGORIES, MemoryPoint, ResultDocument
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
def launched(harness_job: Callable[..., tuple[ResultDocument, Path]]) -> dict[str, tuple[ResultDocument, Path]]:
    return {
        "ddp": harness_job("ddp", 2, workload=MODULE_WORKLOAD),
        "mutant": harness_job("ddp", 2, workload=MUTANT),
        "fsdp": harness_job("fsdp", 2, workload=MODULE_WORKLOAD),
    }


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

    from workers.harness.measure import phase_marks

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
