"""Communication attribution on synthetic trace events: no torch, no ranks (workers.harness.attribution)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from parallab.core.result import TimelineEvent
from tests.workers.traces import chrome_trace
from workers.harness import attribution
from workers.harness.attribution import CommRequest, attribute, pipeline_comm, record, requests_of, summarize_comm

REPO = Path(__file__).resolve().parents[2]


def test_the_module_needs_no_torch():
    probe = "import sys, workers.harness.attribution; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]"
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def nbytes(buffer: object) -> int:
    """Buffers are given as their byte sizes here."""
    assert isinstance(buffer, int)
    return buffer


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("c10d::allreduce_", {"tensors": [4096], "reduce_op": "sum"}, [("all_reduce", 4096)]),
        # all_gather: the gathered output, whether named or input × group size
        ("c10d::_allgather_base_", {"output_tensor": 2048, "input_tensor": 1024}, [("all_gather", 2048)]),
        ("_c10d_functional::all_gather_into_tensor", {"input": 1024, "group_size": 4, "group_name": "0"}, [("all_gather", 4096)]),
        ("c10d::allgather_coalesced_", {"output_lists": [[100, 100], [50]], "input_list": [75]}, [("all_gather", 250)]),
        # reduce_scatter and all_to_all: the full input
        ("c10d::_reduce_scatter_base_", {"output_tensor": 1024, "input_tensor": 2048}, [("reduce_scatter", 2048)]),
        ("_c10d_functional::reduce_scatter_tensor", {"input": 2048, "group_size": 2}, [("reduce_scatter", 2048)]),
        ("c10d::alltoall_base_", {"output": 1024, "input": 1024}, [("all_to_all", 1024)]),
        # P2P: each message of a batch on its own
        ("_c10d_functional::batch_p2p_ops", {"op_list": ["isend", "irecv"], "tensors": [512, 256]}, [("send", 512), ("recv", 256)]),
        ("c10d::send", {"tensors": [64]}, [("send", 64)]),
    ],
)
def test_requests_follow_nccl_tests_buffer_convention(name, args, expected):
    assert attribution.is_comm_op(name)
    assert requests_of(name, args, nbytes) == expected


def test_other_ops_are_not_communication():
    assert not attribution.is_comm_op("aten::mm")
    assert not attribution.is_comm_op("c10d::barrier")


# gloo: a reduce-scatter runs as an all-reduce labelled `gloo:all_reduce`; c10d:: events time the enqueue only
EVENTS = [
    {"ph": "X", "name": "gloo:all_reduce", "ts": 10.0, "dur": 5.0},
    {"ph": "X", "name": "gloo:all_reduce", "ts": 20.0, "dur": 7.0},
    {"ph": "X", "name": "c10d::send", "ts": 29.0, "dur": 1.0},
    {"ph": "X", "name": "gloo:send", "ts": 30.0, "dur": 2.0},
    {"ph": "X", "name": "gloo:barrier", "ts": 40.0, "dur": 9.0},
    {"ph": "i", "name": "gloo:all_reduce", "ts": 41.0},  # not a complete event
]


def issued() -> list[CommRequest]:
    """What the strategy asked for, in issue order: a reduce-scatter, an all-reduce, a send."""
    return [CommRequest("reduce_scatter", 100, 0), CommRequest("all_reduce", 200, 0), CommRequest("send", 8, 0)]


def check_attributed(requests: list[CommRequest]) -> None:
    """Each request got its own backend event: the reduce-scatter the first gloo all-reduce."""
    assert [(r.time_us, r.start_us) for r in requests] == [(5.0, 10.0), (7.0, 20.0), (2.0, 30.0)]


def test_requests_take_their_backend_events_in_issue_order():
    requests = attribute(issued(), EVENTS)
    check_attributed(requests)
    comm = {op.op: op for op in summarize_comm(requests, steps=1, world_size=2)}
    assert comm["reduce_scatter"].bytes == 100 and comm["reduce_scatter"].time_s == pytest.approx(5e-6)
    assert set(comm) == {"reduce_scatter", "all_reduce", "send"}  # kinds as asked, not as gloo labels them


def test_the_order_of_events_in_the_file_does_not_matter():
    shuffled = list(EVENTS)
    random.Random(0).shuffle(shuffled)
    check_attributed(attribute(issued(), shuffled))


def _labels_taken_literally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attribution, "BACKEND_LABELS", {})


def _latest_event_first(monkeypatch: pytest.MonkeyPatch) -> None:
    ordered = attribution.backend_events
    monkeypatch.setattr(attribution, "backend_events", lambda events: ordered(events)[::-1])


@pytest.mark.parametrize("breakage", [_labels_taken_literally, _latest_event_first], ids=["gloo-label", "issue-order"])
def test_the_check_catches_a_broken_matching(monkeypatch, breakage):
    """Break the matching on purpose: the same check must fail, so it can catch a regression."""
    breakage(monkeypatch)
    requests = attribute(issued(), EVENTS)
    with pytest.raises(AssertionError):
        check_attributed(requests)


def test_backend_labels_of_gloo_and_nccl():
    assert attribution.backend_label("gloo:all_to_all", "") == "all_to_all"
    assert attribution.backend_label("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel") == "all_reduce"
    assert attribution.backend_label("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel") == "reduce_scatter"
    assert attribution.backend_label("ncclDevKernel_SendRecv", "kernel") == "p2p"
    assert attribution.backend_label("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cpu_op") is None  # a kernel only
    assert attribution.backend_label("c10d::allreduce_", "cpu_op") is None  # the enqueue, not the op


def test_nccl_p2p_kernels_time_sends_and_all_to_all():
    events = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "ts": float(t), "dur": 3.0} for t in (1, 2)]
    requests = attribute([CommRequest("all_to_all", 64, 0), CommRequest("recv", 32, 0)], events)
    assert [r.start_us for r in requests] == [1.0, 2.0]


def test_summary_is_per_step_with_nccl_tests_bandwidths():
    requests = [CommRequest("all_reduce", 4000, step, time_us=2.0) for step in (0, 0, 1, 1)]
    (op,) = summarize_comm(requests, steps=2, world_size=4)
    assert (op.op, op.count, op.bytes) == ("all_reduce", 2, 8000)
    assert op.time_s == pytest.approx(4e-6)
    assert op.algbw_gbps == pytest.approx(8000 / 4e-6 / 1e9)
    assert op.busbw_gbps == pytest.approx(op.algbw_gbps * 2 * 3 / 4)


def test_only_p2p_under_the_pipeline_tag_is_the_pipelines():
    p2p = {"op_list": ["isend", "irecv"], "tensors": [8, 8]}
    assert not attribution.in_pipeline()
    with pipeline_comm():
        inside = record(attribution.BATCH_P2P, p2p, nbytes, step=0)
        collective = record("c10d::allreduce_", {"tensors": [8]}, nbytes, step=0)
    outside = record(attribution.BATCH_P2P, p2p, nbytes, step=0)
    assert [r.pipeline for r in inside] == [True, True]
    assert [r.pipeline for r in collective + outside] == [False, False, False]
    with pytest.raises(RuntimeError), pipeline_comm():
        raise RuntimeError("a failing schedule step")
    assert not attribution.in_pipeline(), "the tag ends with its block, however it ends"


def test_window_fractions_report_a_bubble_only_for_a_pipeline():
    ring = [CommRequest("send", 8, 0, time_us=1e5), CommRequest("recv", 8, 0, time_us=3e5)]
    comm = summarize_comm(ring, steps=1, world_size=2)
    assert attribution.window_fractions(comm, ring, steps=1, window_s=1.0) == (pytest.approx(0.4), None)
    pipeline = [CommRequest(r.kind, r.nbytes, r.step, pipeline=True, time_us=r.time_us) for r in ring]
    assert attribution.window_fractions(comm, pipeline, steps=1, window_s=1.0) == (pytest.approx(0.4), pytest.approx(0.3))
    assert attribution.window_fractions(comm, pipeline, steps=1, window_s=0.1) == (1.0, 1.0)  # capped
    assert attribution.window_fractions(comm, pipeline, steps=0, window_s=1.0) == (None, None)


def test_peak_total_allocated_reads_cpu_memory_events():
    events = [
        {"ph": "i", "name": "[memory]", "args": {"Total Allocated": 100, "Device Type": 0}},
        {"ph": "i", "name": "[memory]", "args": {"Total Allocated": 300, "Device Type": 0}},
        {"ph": "i", "name": "[memory]", "args": {"Total Allocated": 900, "Device Type": 1}},  # a CUDA event
    ]
    assert attribution.peak_total_allocated(events) == 300
    assert attribution.peak_total_allocated([]) is None


def test_timeline_is_the_last_profiled_step_and_capped():
    events = chrome_trace(steps=3, events_per_step=200)["traceEvents"]  # #0 skipped, #1 profiled, #2 opened by the last step()
    span = attribution.step_span(events, 1)
    assert span is not None and span["name"] == "ProfilerStep#1"
    requests = [
        CommRequest("all_reduce", 64, 0, start_us=500.0, time_us=10.0),
        CommRequest("all_reduce", 64, 1, start_us=1500.0, time_us=10.0),
    ]
    timeline = attribution.timeline(events, requests, span=span, rank=1, max_events=50)
    assert len(timeline) == 50 and all(e.rank == 1 for e in timeline)
    # communication is kept first, and only step #1's: its start is relative to the step
    assert [e for e in timeline if e.op != "compute"] == [TimelineEvent(rank=1, op="all_reduce", start_us=500.0, dur_us=10.0, bytes=64)]
    assert all(0 <= e.start_us <= 1000 for e in timeline)
    assert timeline == sorted(timeline, key=lambda e: e.start_us)
