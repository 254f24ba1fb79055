"""The Chrome trace read one event at a time (parallab.core.tracestream) against `json.loads` of
the whole file, with chunks small enough to cut numbers, strings and escapes in two."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest

from parallab.core.tracestream import NotATrace, TruncatedTrace, iter_events, read_trace


def trace(n: int = 40) -> dict[str, Any]:
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": 'rank 0 \u00e9\\"q"'}}]
    for i in range(n):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::mm{i}", "ts": 1712345678.125 + i, "dur": 12.5e-3 * i, "tid": 7})
        events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": i, "args": {"Bytes": -(2**40) + i, "ok": True}})
    return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "traceName": "r0.json", "displayTimeUnit": "ms"}


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_every_event_and_key_comes_back_as_json_loads_reads_them(chunk: int) -> None:
    doc = trace()
    text = json.dumps(doc, indent=1 if chunk == 7 else None)
    meta: dict[str, Any] = {}
    events = list(iter_events(io.StringIO(text), meta, chunk_chars=chunk))
    assert events == doc["traceEvents"]
    assert meta == {k: v for k, v in doc.items() if k != "traceEvents"}


@pytest.mark.parametrize("cut", [1, 30, 200, 1000, -40, -2])
def test_a_trace_cut_short_is_named_truncated(cut: int) -> None:
    text = json.dumps(trace())
    with pytest.raises(TruncatedTrace):
        list(iter_events(io.StringIO(text[:cut]), chunk_chars=16))


@pytest.mark.parametrize("text", ["[]", '{"traceName": "x"}', '{"traceEvents": {}}', '{"traceEvents": [1 2]}', '{"traceEvents": []} x'])
def test_what_is_not_a_trace_is_named(text: str) -> None:
    with pytest.raises(NotATrace):
        list(iter_events(io.StringIO(text), chunk_chars=4))


def test_read_trace_reads_plain_and_gzipped_files_keeping_what_it_is_asked(tmp_path: Path) -> None:
    doc = trace()
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(json.dumps(doc))
    packed.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for path in (plain, packed):
        meta, events = read_trace(path, keep=lambda e: e.get("ph") == "X")
        assert events == [e for e in doc["traceEvents"] if e["ph"] == "X"] and meta["traceName"] == "r0.json"
