"""Communication attribution on synthetic trace events: no torch, no ranks (workers.harness.attribution)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from parallab.core.result import TimelineEvent
from parallab.core.stragglers import match, name_stragglers
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


# One NCCL all-reduce kernel as each release names it (the profiler keeps the signature).
NCCL_NAMINGS = {
    "2.19 on": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "2.7 to 2.18": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "before 2.7": "ncclAllReduceRingLLKernel_sum_f32(ncclColl)",
    "generic": "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
}


@pytest.mark.parametrize("release", sorted(NCCL_NAMINGS))
def test_nccl_kernels_of_every_release_are_communication(release):
    assert attribution.backend_label(NCCL_NAMINGS[release], "kernel") in ("all_reduce", attribution.NCCL_ANY)
    assert attribution.backend_label("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, ncclWork*)", "kernel") == "p2p"
    assert attribution.backend_label("ncclAllGatherRingLLKernel_copy_i8(ncclColl)", "kernel") == "all_gather"
    assert attribution.backend_label("ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*)", "kernel") == "reduce_scatter"


def cuda_rank_trace(rank: int, kernel_name: str, *, late: int, delay_us: float, n: int = 20) -> list[dict]:
    """Rank `rank`'s CUDA trace: `n` world all-reduces 10 ms apart, each NCCL kernel starting when
    the rank arrives and ending when the last rank has (`late` arrives `delay_us` after the others),
    a GEMM before each."""
    events = []
    for i in range(n):
        base = i * 10_000.0 + 37.0 * ((rank * 7 + i) % 5)  # a little jitter, no rank always last
        arrive = base + (delay_us if rank == late else 0.0)
        end = i * 10_000.0 + delay_us + 400.0
        events.append(kernel("ampere_sgemm_128x64_tn", arrive - 300.0, 250.0, stream=7))
        events.append(kernel(kernel_name, arrive, end - arrive, stream=21))
    return events


@pytest.mark.parametrize("release", sorted(NCCL_NAMINGS))
def test_a_straggler_is_named_from_cuda_traces_of_every_nccl_release(release):
    """Each rank's NCCL kernels timed its all-reduces, matched across ranks: the late rank is named
    and the others' wait is its delay."""
    per_rank = {}
    for rank in range(4):
        requests = [CommRequest("all_reduce", 4096, 0, group_size=4, group="0,1,2,3") for _ in range(20)]
        attribute(requests, cuda_rank_trace(rank, NCCL_NAMINGS[release], late=2, delay_us=5000.0))
        per_rank[rank] = attribution.arrivals(requests, offset_us=0.0)
        assert len(per_rank[rank]) == 20, "every all-reduce timed by its kernel, none by the GEMM"
    named = name_stragglers(match(per_rank, world_size=4, steps=2))
    assert [s.rank for s in named] == [2]
    assert named[0].last_fraction == 1.0
    assert named[0].wait_caused_s == pytest.approx(3 * 20 * 5e-3, rel=0.05)


def test_a_straggler_is_missed_when_only_the_current_kernel_names_are_known(monkeypatch):
    """Break the naming on purpose, as a tool that knows only `ncclDevKernel_` does: the older
    releases' kernels time nothing and the late rank goes unnamed — the check above would fail."""
    monkeypatch.setattr(attribution, "NCCL_PREFIXES", ("nccldevkernel_", "nccl"))
    per_rank = {}
    for rank in range(4):
        requests = [CommRequest("all_reduce", 4096, 0, group_size=4, group="0,1,2,3") for _ in range(20)]
        attribute(requests, cuda_rank_trace(rank, NCCL_NAMINGS["2.7 to 2.18"], late=2, delay_us=5000.0))
        per_rank[rank] = attribution.arrivals(requests, offset_us=0.0)
    assert name_stragglers(match(per_rank, world_size=4, steps=2)) == []


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


def test_comm_time_fraction_is_the_union_of_overlapping_spans():
    """Three calls in flight at once ([10,50), [20,60), [55,65)) are 55 µs of communication, not the
    90 µs their durations add to; exposed ≤ total however they lie."""
    calls = [
        CommRequest("all_reduce", 8, 0, start_us=10.0, time_us=40.0),
        CommRequest("all_gather", 8, 0, start_us=20.0, time_us=40.0),
        CommRequest("reduce_scatter", 8, 0, start_us=55.0, time_us=10.0),
    ]
    split = attribution.breakdown([(0.0, 30.0)], attribution.comm_intervals(calls, STEP), STEP)
    assert attribution.comm_time_fraction(split) == pytest.approx(0.55)
    assert sum(c.time_us for c in calls) / 100 == pytest.approx(0.9), "what adding the spans up gave"
    assert split.exposed_comm == pytest.approx(35.0) and split.exposed_comm <= split.exposed_comm + split.overlapped_comm
    assert attribution.comm_time_fraction(attribution.Breakdown(0.0, 0.0, 0.0, 0.0, 0.0)) is None


def test_comm_time_fraction_never_exceeds_one_without_a_cap():
    rng = random.Random(3)
    for _ in range(100):
        calls = [CommRequest("all_reduce", 8, 0, start_us=rng.uniform(-20, 110), time_us=rng.uniform(0, 60)) for _ in range(6)]
        split = attribution.breakdown([(0.0, rng.uniform(0, 100))], attribution.comm_intervals(calls, STEP), STEP)
        fraction = attribution.comm_time_fraction(split)
        assert fraction is not None and 0.0 <= split.exposed_comm / split.step <= fraction <= 1.0 + 1e-12


def test_timeline_is_the_last_profiled_step_and_capped():
    events = chrome_trace(steps=3, events_per_step=200)["traceEvents"]  # #0 skipped, #1 profiled, #2 opened by the last step()
    span = attribution.step_span(events, 1)
    assert span is not None and span["name"] == "ProfilerStep#1"
    requests = [
        CommRequest("all_reduce", 64, 0, start_us=500.0, time_us=10.0),
        CommRequest("all_reduce", 64, 1, start_us=1500.0, time_us=10.0),
    ]
    busy = [(1000.0 + i, 1000.5 + i) for i in range(200)]
    timeline = attribution.timeline(events, requests, span=span, busy=busy, rank=1, max_events=50)
    assert len(timeline) == 50 and all(e.rank == 1 for e in timeline)
    # communication is kept first, and only step #1's: its start is relative to the step
    assert [e for e in timeline if e.op != "compute"] == [TimelineEvent(rank=1, op="all_reduce", start_us=500.0, dur_us=10.0, bytes=64)]
    assert all(0 <= e.start_us <= 1000 for e in timeline)
    assert timeline == sorted(timeline, key=lambda e: e.start_us)


# ---- interval arithmetic ----


def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones():
    assert attribution.union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]
    assert attribution.length([(0, 2), (1, 3), (10, 11)]) == 4


def test_intersect_subtract_and_clip():
    a, b = [(0, 10), (20, 30)], [(5, 25)]
    assert attribution.intersect(a, b) == [(5, 10), (20, 25)]
    assert attribution.subtract(a, b) == [(0, 5), (25, 30)]
    assert attribution.subtract(b, a) == [(10, 20)]
    assert attribution.clip(a, 8, 22) == [(8, 10), (20, 22)]
    assert attribution.length(attribution.intersect(a, b)) + attribution.length(attribution.subtract(a, b)) == attribution.length(a)


def test_interval_identities_on_random_sets():
    rng = random.Random(1)
    for _ in range(200):
        a = [(s, s + rng.uniform(0, 5)) for s in (rng.uniform(0, 50) for _ in range(rng.randint(0, 8)))]
        b = [(s, s + rng.uniform(0, 5)) for s in (rng.uniform(0, 50) for _ in range(rng.randint(0, 8)))]
        both, only_a = attribution.intersect(a, b), attribution.subtract(a, b)
        assert attribution.length(both) + attribution.length(only_a) == pytest.approx(attribution.length(a))
        assert attribution.length(attribution.union(a + b)) == pytest.approx(
            attribution.length(a) + attribution.length(b) - attribution.length(both)
        )


# ---- where a step's time goes ----

STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "tid": 1, "ts": 0.0, "dur": 100.0}


def cpu_op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": dur}


# A CPU step of 100 µs: compute 0–40 (with a nested op and a c10d enqueue 30–32 inside it), the
# schedule's annotation 40–90 (not compute: it wraps a wait), compute 60–70, nothing after 70.
# gloo ran an all-reduce on its worker thread 35–55: 35–40 under compute (minus the enqueue), the rest exposed.
CPU_EVENTS = [
    STEP,
    cpu_op("aten::linear", 0, 40),
    cpu_op("aten::mm", 5, 10),
    cpu_op("c10d::allreduce_", 30, 2),
    cpu_op("Forward 0", 40, 50, cat="user_annotation"),
    cpu_op("aten::add", 60, 10),
    cpu_op("gloo:all_reduce", 35, 20, tid=7, cat="user_annotation"),
    cpu_op("aten::copy_", 36, 5, tid=7),  # gloo's own work on its thread: not the rank's compute
]
ALL_REDUCE = CommRequest("all_reduce", 64, 0, time_us=20.0, start_us=35.0)


def check_cpu_split(split: attribution.Breakdown) -> None:
    """busy = [0,30) ∪ [32,40) ∪ [60,70) = 48; comm [35,55): 5 overlapped, 15 exposed; idle 100 − 48 − 15."""
    assert split == attribution.Breakdown(compute=48.0, exposed_comm=15.0, overlapped_comm=5.0, idle=37.0, step=100.0)


def test_cpu_step_split_is_hta_overlap_on_the_main_thread():
    busy = attribution.busy(CPU_EVENTS, STEP, device="cpu")
    assert busy == [(0, 30), (32, 40), (60, 70)]
    split = attribution.breakdown(busy, attribution.comm_intervals([ALL_REDUCE], STEP), STEP)
    check_cpu_split(split)
    assert split.compute + split.exposed_comm + split.idle == split.step


def _enqueue_counts_as_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attribution, "COMM_EVENT_PREFIXES", ("gloo:",))


def _overlap_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attribution, "intersect", lambda a, b: [])


def _annotations_count(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_busy = attribution.cpu_busy
    relabel = [
        dict(e, cat="cpu_op") if e.get("cat") == "user_annotation" and e.get("tid") == 1 and e is not STEP else e for e in CPU_EVENTS
    ]
    monkeypatch.setattr(attribution, "cpu_busy", lambda events, span: cpu_busy(relabel, span))


@pytest.mark.parametrize(
    "breakage", [_enqueue_counts_as_compute, _overlap_ignored, _annotations_count], ids=["enqueue", "overlap", "annotation"]
)
def test_the_split_check_catches_a_broken_rule(monkeypatch, breakage):
    """Break the overlap rules on purpose: the same check must fail."""
    breakage(monkeypatch)
    busy = attribution.busy(CPU_EVENTS, STEP, device="cpu")
    with pytest.raises(AssertionError):
        check_cpu_split(attribution.breakdown(busy, attribution.comm_intervals([ALL_REDUCE], STEP), STEP))


def kernel(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "tid": stream, "ts": ts, "dur": dur}


def test_cuda_step_split_from_kernels_per_stream():
    """Compute kernels on two streams (merged), NCCL kernels on a third; host-side ops don't count."""
    events = [
        STEP,
        cpu_op("aten::mm", 0, 90),  # the host launching: not device compute
        kernel("ampere_sgemm_128x64_tn", 10, 30, stream=7),
        kernel("elementwise_kernel", 30, 20, stream=13),  # overlaps the gemm: counted once
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "tid": 7, "ts": 60, "dur": 5},
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 30, stream=21),
    ]
    busy = attribution.busy(events, STEP, device="cuda")
    assert busy == [(10, 50), (60, 65)]
    requests = attribute([CommRequest("all_reduce", 4096, 0)], events)
    split = attribution.breakdown(busy, attribution.comm_intervals(requests, STEP), STEP)
    # comm [40,70): [40,50) and [60,65) under compute → 15 overlapped, 15 exposed
    assert split == attribution.Breakdown(compute=45.0, exposed_comm=15.0, overlapped_comm=15.0, idle=40.0, step=100.0)


# A pipeline stage's step of 100 µs on gloo, as the profiler shows it: the main thread runs two
# forwards (0–30, 40–60), sends the first's activations while the second computes (gloo:send
# 30–50 on the main thread, an asynchronous span), then waits in a receive for the next stage's
# gradient (gloo:recv 60–90), then runs a backward 90–100.
PIPELINE_EVENTS = [
    STEP,
    cpu_op("aten::linear", 0, 30),
    cpu_op("c10d::send", 30, 1),
    cpu_op("gloo:send", 30, 20, cat="user_annotation"),
    cpu_op("aten::linear", 40, 20),
    cpu_op("c10d::recv_", 60, 1),
    cpu_op("gloo:recv", 60, 30, cat="user_annotation"),
    cpu_op("aten::mm", 90, 10),
]


def pipeline_requests() -> list[CommRequest]:
    with pipeline_comm():
        issued = record("c10d::send", {"tensors": [512]}, nbytes, step=0) + record("c10d::recv_", {"tensors": [512]}, nbytes, step=0)
    return attribute(issued, PIPELINE_EVENTS)


def pipeline_split(intervals=attribution.comm_intervals) -> attribution.Breakdown:
    busy = attribution.busy(PIPELINE_EVENTS, STEP, device="cpu")
    return attribution.breakdown(busy, intervals(pipeline_requests(), STEP), STEP)


def check_pipeline_split(split: attribution.Breakdown) -> None:
    """busy [0,30) ∪ [40,60) ∪ [90,100) = 60; the send [30,50) is 10 overlapped and 10 exposed; the
    receive [60,90) runs beside nothing: 30 exposed; nothing is idle (100 − 60 − 40). Were the
    P2P left out, the send's 10 exposed µs and the receive's 30 would read as idle, and the step
    as 0 % communication."""
    assert split == attribution.Breakdown(compute=60.0, exposed_comm=40.0, overlapped_comm=10.0, idle=0.0, step=100.0)
    assert attribution.comm_time_fraction(split) == pytest.approx(0.5)


def test_a_pipelines_send_and_recv_are_communication_exposed_where_nothing_overlaps():
    """HTA's overlap: a stage's send and receive are communication like any collective; the send
    that runs beside the next forward is overlapped, the receive that waits is exposed."""
    assert all(r.pipeline and r.start_us is not None for r in pipeline_requests())
    check_pipeline_split(pipeline_split())


def _pipeline_p2p_dropped(requests, span):
    """The rule this module once had: a pipeline's P2P is not communication."""
    return attribution.comm_intervals([r for r in requests if not r.pipeline], span)


def _p2p_dropped(requests, span):
    return attribution.comm_intervals([r for r in requests if r.kind not in attribution.P2P], span)


@pytest.mark.parametrize("intervals", [_pipeline_p2p_dropped, _p2p_dropped], ids=["pipeline-p2p", "all-p2p"])
def test_the_pipeline_check_catches_send_and_recv_dropped(intervals):
    """Drop the send/recv on purpose: the step reads 0 % communication and the same check fails."""
    split = pipeline_split(intervals)
    assert attribution.comm_time_fraction(split) == 0.0
    with pytest.raises(AssertionError):
        check_pipeline_split(split)


def test_a_ring_and_a_pipeline_receive_count_alike():
    """Ring attention's P2P (untagged) and a pipeline's (tagged) are the same communication."""
    recv = CommRequest("recv", 64, 0, pipeline=True, time_us=40.0, start_us=50.0)
    ring_recv = CommRequest("recv", 64, 0, pipeline=False, time_us=40.0, start_us=50.0)
    busy = [(0.0, 50.0)]
    pipeline = attribution.breakdown(busy, attribution.comm_intervals([recv], STEP), STEP)
    ring = attribution.breakdown(busy, attribution.comm_intervals([ring_recv], STEP), STEP)
    assert pipeline == ring
    assert (pipeline.exposed_comm, pipeline.idle) == (40.0, 10.0)


def test_a_receive_from_any_source_is_timed_by_its_gloo_event():
    assert attribution.backend_label("gloo:recvAnySource", "user_annotation") == "recv"
    events = [cpu_op("gloo:recvAnySource", 10, 5, cat="user_annotation")]
    (req,) = attribute(record("c10d::recv_any_source_", {"tensors": [64]}, nbytes, step=0), events)
    assert (req.start_us, req.time_us) == (10.0, 5.0)


def test_on_cuda_a_pipelines_sendrecv_kernel_is_communication():
    """NCCL runs a stage's send and receive as SendRecv kernels: exposed where no compute kernel runs."""
    events = [
        STEP,
        kernel("ampere_sgemm_128x64_tn", 0, 40, stream=7),
        kernel("ncclDevKernel_SendRecv", 30, 30, stream=21),
        kernel("ampere_sgemm_128x64_tn", 70, 20, stream=7),
    ]
    with pipeline_comm():
        issued = record("c10d::send", {"tensors": [512]}, nbytes, step=0)
    requests = attribute(issued, events)
    split = attribution.breakdown(attribution.busy(events, STEP, device="cuda"), attribution.comm_intervals(requests, STEP), STEP)
    assert split == attribution.Breakdown(compute=60.0, exposed_comm=20.0, overlapped_comm=10.0, idle=20.0, step=100.0)


def test_comm_outside_the_step_is_cut_to_it():
    late = CommRequest("all_reduce", 8, 0, time_us=30.0, start_us=90.0)
    assert attribution.comm_intervals([late], STEP) == [(90.0, 100.0)]


# ---- the pipeline's actions ----


def action(kind: str, mb: int | None, ts: float, dur: float, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": cat, "name": attribution.action_name(kind, mb), "tid": 1, "ts": ts, "dur": dur}


def test_a_stages_actions_are_those_that_start_in_the_step():
    """GPipe's first stage with 2 micro-batches: F0 F1, a wait, B0 B1 (the bubble needs every stage's: core.metrics)."""
    events = [
        STEP,
        action("forward", 0, 5, 10),
        action("forward", 1, 15, 10),
        action("loss", None, 20, 2),  # inside F1's time on the last stage: counted once
        action("backward", 0, 55, 15),
        action("backward", 1, 70, 15),
        action("forward", 0, 105, 10),  # the next step's
    ]
    acts = attribution.actions(events, STEP)
    assert [(a.kind, a.microbatch) for a in acts] == [("forward", 0), ("forward", 1), ("loss", None), ("backward", 0), ("backward", 1)]
    assert [(a.start, a.end) for a in acts][-1] == (70.0, 85.0)


def test_on_cuda_actions_are_the_device_time_of_their_kernels():
    events = [STEP, action("forward", 0, 1, 2), action("forward", 0, 10, 30, cat="gpu_user_annotation")]
    assert [(a.start, a.end) for a in attribution.actions(events, STEP, device="cuda")] == [(10.0, 40.0)]
    assert [(a.start, a.end) for a in attribution.actions(events, STEP)] == [(1.0, 3.0)]


def test_action_names_are_checked():
    assert attribution.action_name("backward", 3) == "parallab.pp::backward 3"
    with pytest.raises(ValueError, match="unknown pipeline action"):
        attribution.action_name("recompute", 0)


def test_the_timeline_shows_a_stages_actions():
    events = [STEP, action("forward", 0, 5, 10), action("backward", 0, 55, 15)]
    timeline = attribution.timeline(events, [], span=STEP, busy=[(5.0, 15.0)], rank=0, max_events=10)
    assert [(e.op, e.start_us, e.dur_us) for e in timeline] == [("forward", 5.0, 10.0), ("compute", 5.0, 10.0), ("backward", 55.0, 15.0)]


def test_each_call_is_on_the_wire_by_its_own_groups_size():
    # hybrid on 8 ranks: TP's all-gather over 2 ranks, FSDP's over 4; a call of unknown group counts as the world
    requests = [
        CommRequest("all_gather", 1000, 0, group_size=2),
        CommRequest("all_gather", 4000, 0, group_size=4),
        CommRequest("all_reduce", 800, 0, group_size=4),
        CommRequest("all_reduce", 800, 0),
        CommRequest("send", 64, 0, group_size=8),
    ]
    comm = {op.op: op for op in summarize_comm(requests, steps=1, world_size=8)}
    assert (comm["all_gather"].wire_bytes, comm["all_gather"].group_size) == (1000 // 2 + 4000 * 3 // 4, None)
    assert (comm["all_reduce"].wire_bytes, comm["all_reduce"].group_size) == (800 * 2 * 3 // 4 + 800 * 2 * 7 // 8, None)
    assert (comm["send"].wire_bytes, comm["send"].group_size) == (64, 8)


def test_a_uniform_group_gives_the_op_its_size_and_its_busbw_factor():
    requests = [CommRequest("reduce_scatter", 600, step, time_us=1.0, group_size=2) for step in (0, 1)]
    (op,) = summarize_comm(requests, steps=2, world_size=8)  # a 2-rank sub-group of 8 ranks
    assert (op.group_size, op.wire_bytes) == (2, 300)
    assert op.busbw_gbps == pytest.approx(op.algbw_gbps / 2)  # (n−1)/n of the group, not of the world


def test_record_carries_the_group_size_it_was_given():
    (req,) = record("c10d::allreduce_", {"tensors": [40]}, nbytes, step=0, group_size=2)
    assert (req.kind, req.nbytes, req.group_size) == ("all_reduce", 40, 2)
    assert attribution.group_size_arg({"group_size": 4}) == 4 and attribution.group_size_arg({"group_name": "0"}) is None


def test_arrivals_number_each_groups_collectives_in_issue_order_on_the_wall_clock():
    reqs = [
        attribution.CommRequest("all_reduce", 8, 0, group="0,1", start_us=10.0, time_us=5.0),
        attribution.CommRequest("all_gather", 8, 0, group="0,2", start_us=20.0, time_us=1.0),
        attribution.CommRequest("send", 8, 0, group="0,1", start_us=30.0, time_us=1.0),  # P2P: not a collective
        attribution.CommRequest("all_reduce", 8, 0, group="0,1"),  # the backend's events did not time it
        attribution.CommRequest("all_reduce", 8, 0, group="0,1", start_us=40.0, time_us=2.0),
        attribution.CommRequest("all_reduce", 8, 0, start_us=50.0, time_us=2.0),  # no group known
    ]
    got = [tuple(a) for a in attribution.arrivals(reqs, offset_us=1000.0)]
    assert got == [
        ("0,1", 0, "all_reduce", 1010.0, 1015.0),
        ("0,2", 0, "all_gather", 1020.0, 1021.0),
        ("0,1", 2, "all_reduce", 1040.0, 1042.0),  # keeps its place: the untimed one was 1
    ]


def random_event(rng: random.Random, ts: float, dur: float) -> dict:
    """One of the events a window holds: a main-thread or worker-thread op (compute or comm), an
    annotation, a pipeline action (host or device copy), a kernel (compute or NCCL), a memory instant."""
    kind = rng.randrange(5)
    if kind == 0:
        return cpu_op(rng.choice(["aten::mm", "aten::add", "c10d::allreduce_", "autograd::engine"]), ts, dur, tid=rng.choice([1, 1, 7]))
    if kind == 1:
        return cpu_op("Forward 0", ts, dur, cat="user_annotation")
    if kind == 2:
        cat = rng.choice(["user_annotation", "gpu_user_annotation"])
        return action(rng.choice(["forward", "backward"]), rng.randrange(2), ts, dur, cat=cat)
    if kind == 3:
        return kernel(rng.choice(["ampere_sgemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]), ts, dur, stream=rng.choice([7, 21]))
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "tid": 1, "ts": ts}


def random_window(rng: random.Random, steps: int = 3) -> tuple[list[dict], list[dict]]:
    """(events, step spans): 300 events at random, many straddling a step's boundary, shuffled."""
    spans = [dict(STEP, name=f"ProfilerStep#{i + 1}", ts=100.0 * i) for i in range(steps)]
    events: list[dict] = list(spans)
    for _ in range(300):
        events.append(random_event(rng, rng.uniform(-20, 100 * steps + 20), rng.choice([0.0, rng.uniform(0, 60)])))
    rng.shuffle(events)
    return events, spans


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_each_step_on_its_own_events_answers_as_on_the_whole_trace(device):
    """`within` hands each step the events that overlap it: busy and actions are the same as on every event."""
    rng = random.Random(7)
    for _ in range(20):
        events, spans = random_window(rng)
        for span, own in zip(spans, attribution.within(events, spans), strict=True):
            assert attribution.busy(own, span, device=device) == attribution.busy(events, span, device=device)
            assert attribution.actions(own, span, device=device) == attribution.actions(events, span, device=device)
            assert len(own) < len(events)
