"""A rank's profiled steps as critical-path segments, from synthetic trace events (workers.harness.critsegments)."""

from __future__ import annotations

from workers.harness.attribution import CommRequest
from workers.harness.critsegments import HARNESS_RANGE, exclusive, step_segments


def op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}


def test_each_instant_goes_to_the_innermost_operator():
    pieces = exclusive([op("aten::linear", 0, 100), op("aten::addmm", 10, 50), op("aten::t", 70, 10)])
    linear, addmm, t = "aten::linear", "aten::addmm", "aten::t"
    assert pieces == [(linear, 0, 10), (addmm, 10, 60), (linear, 60, 70), (t, 70, 80), (linear, 80, 100)]


def test_a_step_is_cut_to_its_work_classed_with_its_messages_keyed_by_rank_pair():
    span = op("ProfilerStep#1", 0, 1000, cat="user_annotation")
    events = [
        span,
        op(HARNESS_RANGE, 0, 200, cat="user_annotation"),  # the harness's census before the step's work
        op("aten::mm", 200, 100),
        op("Optimizer.step#AdamW.step", 700, 200, cat="user_annotation"),
        op("aten::add_", 700, 200),
        op("aten::native_layer_norm", 300, 100),
    ]
    send = CommRequest("send", 64, 0, pipeline=True, start_us=400.0, time_us=50.0, group="0,2")
    coll = CommRequest("all_reduce", 64, 0, start_us=500.0, time_us=100.0, group="0,1")
    recv = CommRequest("recv", 64, 0, pipeline=True, start_us=950.0, time_us=50.0, group="0,2")
    (s,) = step_segments(events, [send, coll, recv], [2, None, 2], [span], rank=0, offset_us=1e6)
    assert s.start_us == 1e6 + 200 and s.end_us == 1e6 + 1000
    rows = list(zip(s.kind, s.label, s.key, s.seq, s.start, s.end, strict=True))
    assert ("compute", "matmul", "", -1, 1e6 + 200, 1e6 + 300) in rows
    assert ("compute", "norms and elementwise", "", -1, 1e6 + 300, 1e6 + 400) in rows
    assert ("compute", "optimizer", "", -1, 1e6 + 700, 1e6 + 900) in rows
    assert ("send", "pp send", "p2p:0->2", 0, 1e6 + 400, 1e6 + 450) in rows
    assert ("coll", "all_reduce", "0,1", 0, 1e6 + 500, 1e6 + 600) in rows
    assert ("recv", "pp recv", "p2p:2->0", 0, 1e6 + 950, 1e6 + 1000) in rows
    assert not any(label.startswith("ProfilerStep") for label in s.label)


def test_a_wrappers_own_time_while_a_collective_is_in_flight_is_waiting_not_compute():
    """FSDP's post-backward hook blocked on its reduce-scatter, on CPU: the hook's own time while the
    collective runs is left to the collective; a kernel (aten::) overlapping it stays compute."""
    span = op("ProfilerStep#1", 0, 1000, cat="user_annotation")
    events = [
        span,
        op("RegisterPostBackwardFunctionBackward", 100, 600),
        op("aten::mm", 150, 50),
        op("aten::add", 400, 100),
    ]
    coll = CommRequest("reduce_scatter", 64, 0, start_us=200.0, time_us=400.0, group="0,1")
    (s,) = step_segments(events, [coll], [None], [span], rank=0, offset_us=0.0)
    compute = [(label, a, b) for kind, label, a, b in zip(s.kind, s.label, s.start, s.end, strict=True) if kind == "compute"]
    hook = "norms and elementwise"
    assert compute == [(hook, 100, 150), ("matmul", 150, 200), (hook, 400, 500), (hook, 600, 700)]
    assert ("coll", "reduce_scatter", 200, 600) in [(k, lab, a, b) for k, lab, a, b in zip(s.kind, s.label, s.start, s.end, strict=True)]
