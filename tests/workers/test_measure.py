"""StepProfiler on a real 2-rank gloo job: op kinds, counts and bytes exactly, times, trace, memory."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.harness.measure import CommRequest, attribute, summarize_comm

DRIVER = Path(__file__).with_name("measure_driver.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("measure")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(DRIVER), str(out), "4", "2"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"result_rank{r}.json").read_text()) | {"_dir": str(out)} for r in range(2)]


EXPECTED = {  # op -> (count, bytes) per step, nccl-tests' buffer convention
    "all_reduce": (1, 4096),
    "all_gather": (1, 2048),  # gathered output
    "reduce_scatter": (1, 2048),  # full input
    "all_to_all": (1, 1024),
    "send": (1, 512),
    "recv": (1, 512),
}


@pytest.mark.slow
def test_kinds_counts_and_bytes_are_exact(ranks):
    for rank in ranks:
        assert rank["profiled_steps"] == 2
        got = {op["op"]: (op["count"], op["bytes"]) for op in rank["comm"]}
        assert got == EXPECTED  # reduce_scatter is not reported as gloo's all_reduce


@pytest.mark.slow
def test_times_bandwidths_and_fraction(ranks):
    for rank in ranks:
        for op in rank["comm"]:
            assert op["time_s"] > 0, op
            assert op["algbw_gbps"] > 0 and op["busbw_gbps"] > 0
        assert 0 < rank["comm_time_fraction"] <= 1
        assert rank["bubble_fraction"] is None  # P2P outside a pipeline is not a bubble


@pytest.mark.slow
def test_trace_is_gzip_chrome_json_and_timeline_bounded(ranks):
    for r, rank in enumerate(ranks):
        path = Path(rank["_dir"]) / rank["trace_file"]
        assert path.name == f"trace_rank{r}.json.gz"
        doc = json.loads(gzip.decompress(path.read_bytes()))
        names = {e.get("name") for e in doc["traceEvents"]}
        assert "gloo:all_reduce" in names
        ops = [e["op"] for e in rank["timeline"] if e["op"] != "compute"]
        assert sorted(ops) == sorted(EXPECTED)  # one profiled step: each op once
        assert all(e["rank"] == r and e["dur_us"] >= 0 for e in rank["timeline"])
        assert len(rank["timeline"]) <= 5000
        assert not list(Path(rank["_dir"]).glob(".trace_rank*"))  # the raw export is cleaned up


@pytest.mark.slow
def test_peak_allocated_from_profiler_memory_events(ranks):
    assert all(rank["peak_allocated_bytes"] > 0 for rank in ranks)


def test_attribution_matches_in_issue_order_and_gloo_labels():
    reqs = [CommRequest("reduce_scatter", 100, 0), CommRequest("all_reduce", 200, 0), CommRequest("send", 8, 0)]
    events = [
        {"ph": "X", "name": "gloo:all_reduce", "ts": 10.0, "dur": 5.0},
        {"ph": "X", "name": "gloo:all_reduce", "ts": 20.0, "dur": 7.0},
        {"ph": "X", "name": "c10d::send", "ts": 29.0, "dur": 1.0},  # enqueue only: ignored
        {"ph": "X", "name": "gloo:send", "ts": 30.0, "dur": 2.0},
        {"ph": "X", "name": "gloo:barrier", "ts": 40.0, "dur": 9.0},
    ]
    attribute(reqs, events)
    assert [r.time_us for r in reqs] == [5.0, 7.0, 2.0]
    comm = {op["op"]: op for op in summarize_comm(reqs, steps=1, world_size=2)}
    assert comm["reduce_scatter"]["bytes"] == 100 and comm["reduce_scatter"]["time_s"] == pytest.approx(5e-6)


def _doc(steps: int, events_per_step: int) -> dict:
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    for s in range(steps):
        t0 = s * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t0, "dur": 999.0})
        events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{s}_{i}_{'x' * (i % 97)}", "pid": 1, "tid": 1,
                    "ts": t0 + i * 0.1, "dur": 0.05} for i in range(events_per_step)]
    return {"traceEvents": events}


def test_trace_over_the_cap_keeps_the_last_step_or_nothing(tmp_path):
    import torch

    from workers.harness.measure import StepProfiler

    prof = StepProfiler(enabled=False, trace=True, rank=0, world_size=1, out_dir=tmp_path, device=torch.device("cpu"),
                        trace_cap_bytes=1 << 30)
    prof._profiled = 2  # ProfilerStep#0 skipped, #1 and #2 profiled
    doc = _doc(steps=3, events_per_step=3000)
    assert prof._keep_trace(doc) == {"trace_file": "trace_rank0.json.gz", "trace_note": None}
    full = (tmp_path / "trace_rank0.json.gz").stat().st_size
    prof.trace_cap_bytes = full // 2  # one step of three fits
    kept = prof._keep_trace(doc)
    assert kept["trace_file"] == "trace_rank0.json.gz" and "last profiled step" in kept["trace_note"]
    names = {e["name"] for e in json.loads(gzip.decompress((tmp_path / "trace_rank0.json.gz").read_bytes()))["traceEvents"]}
    assert "ProfilerStep#2" in names and "ProfilerStep#0" not in names and "process_name" in names
    prof.trace_cap_bytes = 100
    assert prof._keep_trace(doc)["trace_file"] is None


def test_timeline_is_the_last_step_and_capped(tmp_path):
    import torch

    from workers.harness.measure import StepProfiler

    prof = StepProfiler(enabled=False, trace=True, rank=1, world_size=2, out_dir=tmp_path, device=torch.device("cpu"),
                        max_timeline_events=50)
    prof.skip, prof._profiled = 1, 1  # ProfilerStep#0 is the skipped step, #1 the profiled one
    events = _doc(steps=3, events_per_step=200)["traceEvents"]  # #2: opened by the last step(), empty
    reqs = [CommRequest("all_reduce", 64, 0, start_us=500.0, time_us=10.0), CommRequest("all_reduce", 64, 1, start_us=1500.0, time_us=10.0)]
    timeline = prof._timeline(events, reqs)
    assert len(timeline) == 50 and all(e["rank"] == 1 for e in timeline)
    assert {"rank": 1, "op": "all_reduce", "start_us": 500.0, "dur_us": 10.0, "bytes": 64} in timeline
    assert all(0 <= e["start_us"] <= 1000 for e in timeline)
