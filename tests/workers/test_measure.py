"""StepProfiler on a real 2-rank gloo job: op kinds, counts and bytes exactly, times, the step-time
split, trace, memory at the peak.

The attribution rules themselves are tested without torch in test_attribution.py.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parallab.core.rundir import RunDir
from tests.workers.traces import chrome_trace

DRIVER = Path(__file__).with_name("measure_driver.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("measure")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DRIVER), str(out), "2"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [
        json.loads((out / f"result_rank{r}.json").read_text())
        | {"_dir": str(out), "_params": int((out / f"params_rank{r}.txt").read_text())}
        for r in range(2)
    ]


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
        assert rank["pipeline_actions_us"] is None  # no pipeline actions, nothing for the bubble


@pytest.mark.slow
def test_the_step_split_adds_up_and_exposed_is_part_of_the_comm(ranks):
    for rank in ranks:
        split = rank["step_time_breakdown"]
        assert split["compute_s"] > 0 and split["step_s"] > 0
        assert split["compute_s"] + split["exposed_comm_s"] + split["idle_s"] == pytest.approx(split["step_s"], rel=1e-9)
        assert rank["exposed_comm_time_s"] == split["exposed_comm_s"] > 0  # blocking collectives: exposed
        comm_s = sum(op["time_s"] for op in rank["comm"])
        assert split["exposed_comm_s"] + split["overlapped_comm_s"] <= comm_s * (1 + 1e-9)  # overlaps counted once


@pytest.mark.slow
def test_trace_is_gzip_chrome_json_and_timeline_bounded(ranks):
    for r, rank in enumerate(ranks):
        path = Path(rank["_dir"]) / rank["trace_file"]
        assert path == RunDir(Path(rank["_dir"])).trace(r)
        doc = json.loads(gzip.decompress(path.read_bytes()))
        names = {e.get("name") for e in doc["traceEvents"]}
        assert "gloo:all_reduce" in names
        ops = [e["op"] for e in rank["timeline"] if e["op"] != "compute"]
        assert sorted(ops) == sorted(EXPECTED)  # one profiled step: each op once
        assert all(e["rank"] == r and e["dur_us"] >= 0 for e in rank["timeline"])
        assert len(rank["timeline"]) <= 5000
        assert not RunDir(Path(rank["_dir"])).raw_trace(r).exists()  # the raw export is cleaned up


@pytest.mark.slow
def test_memory_at_the_peak_is_split_and_counts_the_parameters(ranks):
    for rank in ranks:
        split = rank["memory_breakdown"]
        assert set(split) == {"params", "grads", "optimizer", "activations", "temporaries", "other"}
        assert split["params"] == rank["_params"]  # the layer's parameters, held before the step began
        assert split["optimizer"] >= 2 * rank["_params"]  # AdamW's two moments
        assert rank["peak_allocated_bytes"] == sum(split.values())


def test_trace_over_the_cap_keeps_the_last_step_or_nothing(tmp_path):
    import torch

    from workers.harness.measure import StepProfiler

    prof = StepProfiler(rank=0, world_size=1, out_dir=tmp_path, device=torch.device("cpu"), trace_cap_bytes=1 << 30)
    prof._profiled = 2  # ProfilerStep#0 skipped, #1 and #2 profiled
    doc = chrome_trace(steps=3, events_per_step=3000)
    path = RunDir(tmp_path).trace(0)
    assert prof._keep_trace(doc) == (path.name, None)
    full = path.stat().st_size
    prof.trace_cap_bytes = full // 2  # one step of three fits
    name, note = prof._keep_trace(doc)
    assert name == path.name and "last profiled step" in note
    names = {e["name"] for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]}
    assert "ProfilerStep#2" in names and "ProfilerStep#0" not in names and "process_name" in names
    prof.trace_cap_bytes = 100
    assert prof._keep_trace(doc)[0] is None


def test_every_op_in_the_table_exists_with_its_buffer_argument():
    """The attribution table names ops and arguments as torch's schemas do (a rename would lose bytes silently)."""
    import torch
    import torch.distributed

    from workers.harness.attribution import BATCH_P2P, C10D_OPS

    for name, (_, arg) in {**C10D_OPS, BATCH_P2P: ("p2p", "tensors")}.items():
        namespace, op = name.split("::")
        schema = getattr(getattr(torch.ops, namespace), op).default._schema
        assert schema.name == name
        args = {a.name for a in schema.arguments}
        assert arg in args, (name, args)
        if name.startswith("_c10d_functional") and "all_gather" in name:
            assert "group_size" in args


def test_the_raw_trace_is_streamed_kept_as_written_and_a_truncated_one_skips_the_analyses(tmp_path):
    """The profiler's file is read (whole under `WHOLE_READ_BYTES`, else one event at a time); the
    kept trace is that file gzipped as it was written; a file cut short is named in the trace
    note, its analyses skipped, no crash."""
    import torch

    from workers.harness.measure import StepProfiler

    def profiler(text: str) -> StepProfiler:
        prof = StepProfiler(rank=0, world_size=1, out_dir=tmp_path, device=torch.device("cpu"), trace_cap_bytes=1 << 30)
        prof._profiled = 2
        prof._raw_trace = RunDir(tmp_path).create().raw_trace(0)
        prof._raw_trace.write_text(text)
        return prof

    text = json.dumps(chrome_trace(steps=3, events_per_step=300))
    whole = profiler(text)._compute()
    assert whole.trace_file == RunDir(tmp_path).trace(0).name and whole.trace_note is None
    assert gzip.decompress(RunDir(tmp_path).trace(0).read_bytes()).decode() == text
    assert whole.step_time_breakdown is not None

    RunDir(tmp_path).trace(0).unlink()
    cut = profiler(text[: len(text) // 2])._compute()
    assert cut.trace_file is None and cut.step_time_breakdown is None
    assert cut.trace_note is not None and cut.trace_note.startswith("the profiler's trace could not be read (the trace ends")
    assert not RunDir(tmp_path).trace(0).exists() and not RunDir(tmp_path).raw_trace(0).exists()


def test_a_raw_trace_read_whole_or_streamed_gives_the_same_document(tmp_path, monkeypatch):
    """A trace under the size bound is decoded in one call, a larger one streamed: the same
    document either way (non-object elements dropped, as the stream drops them); a file cut
    short is named by the stream whichever way it was tried first."""
    from parallab.core import tracestream

    doc = chrome_trace(steps=2, events_per_step=50)
    doc["traceEvents"].insert(3, 7)  # not an event: neither way keeps it
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(doc))
    whole = tracestream.read_document(path)
    monkeypatch.setattr(tracestream, "WHOLE_READ_BYTES", 0)
    streamed = tracestream.read_document(path)
    assert whole == streamed
    assert 7 not in whole["traceEvents"] and len(whole["traceEvents"]) == len(doc["traceEvents"]) - 1

    monkeypatch.setattr(tracestream, "WHOLE_READ_BYTES", 1 << 30)
    path.write_text(json.dumps(doc)[:-40])
    with pytest.raises(tracestream.TruncatedTrace):
        tracestream.read_document(path)
