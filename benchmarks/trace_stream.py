"""Reading the ranks' Chrome traces whole (`json.loads` of the file) against streamed
(`parallab.core.tracestream`): wall time and peak RSS, each mode in a fresh process.

Synthetic input: `--ranks` ranks' profiler traces (plain JSON, as torch's profiler writes them),
each `--steps` profiled steps of `--collectives` collectives, each collective preceded by
`--compute` cpu_op events on the main thread and followed by its gloo op event and two [memory]
instant events, inside `ProfilerStep#N` spans; written once under `--dir`. Each mode then reads
every rank's trace in turn, as a worker would read them one after another, and makes the same
pass over each rank's events (the profiled steps' spans, the main thread's ops in each, the gloo
ops), dropping them before the next rank. `stream-kept` keeps only the events that pass reads
(the X events of cpu_op and the step spans): memory bounded by the events kept.

    python -m benchmarks.trace_stream --ranks 64 --collectives 1000 --steps 3 --dir /tmp/traces

Prints the files' size, and per mode the wall time (all ranks), the peak RSS of the process
(`VmHWM`, the interpreter and imports included: `--mode none` reads nothing, for the base).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from parallab.core.tracestream import read_trace


def rank_trace(rank: int, collectives: int, compute: int, steps: int) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "main"}},
    ]
    t = 1_000_000.0
    slot = 3000.0
    for step in range(steps):
        start = t
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step + 1}",
                "pid": rank,
                "tid": 1,
                "ts": start,
                "dur": collectives * slot,
                "args": {"External id": step},
            }
        )
        for i in range(collectives):
            base = start + i * slot
            width = 500.0 / compute
            for k in range(compute):
                events.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": ("aten::mm", "aten::add", "aten::gelu")[k % 3],
                        "pid": rank,
                        "tid": 1,
                        "ts": base + k * width,
                        "dur": width,
                        "args": {"External id": i * 10 + k, "Sequence number": i},
                    }
                )
            events.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "gloo:all_reduce",
                    "pid": rank,
                    "tid": 1,
                    "ts": base + 500.0,
                    "dur": 2400.0,
                    "args": {"Process Group Name": str(i % 2), "In msg nelems": 4096, "dtype": "Float"},
                }
            )
            for sign in (1, -1):
                events.append(
                    {
                        "ph": "i",
                        "cat": "cpu_instant_event",
                        "s": "t",
                        "name": "[memory]",
                        "pid": rank,
                        "tid": 1,
                        "ts": base + 1.0,
                        "args": {
                            "Addr": 140000000 + i,
                            "Bytes": sign * 16384,
                            "Total Allocated": 1 << 24,
                            "Device Type": 0,
                            "Device Id": -1,
                        },
                    }
                )
        t = start + collectives * slot
    return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "traceName": f"rank{rank}.json", "displayTimeUnit": "ms"}


def write(dir_: Path, ranks: int, collectives: int, compute: int, steps: int) -> list[Path]:
    dir_.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(ranks):
        path = dir_ / f"rank{rank}.pt.trace.json"
        if not path.exists():
            path.write_text(json.dumps(rank_trace(rank, collectives, compute, steps)))
        paths.append(path)
    return paths


def read_by_the_pass(event: dict[str, Any]) -> bool:
    return event.get("ph") == "X" and (event.get("cat") == "cpu_op" or str(event.get("name", "")).startswith("ProfilerStep#"))


def one_pass(events: list[dict[str, Any]]) -> int:
    """The analysis' first pass: the step spans, the main thread's ops inside each, the gloo ops."""
    spans = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    n = 0
    for span in spans:
        lo, hi = span["ts"], span["ts"] + span["dur"]
        n += sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and lo <= e["ts"] < hi)
    return n + sum(1 for e in events if str(e.get("name", "")).startswith("gloo:"))


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read(mode: str, paths: list[Path]) -> None:
    began = time.perf_counter()
    seen = 0
    for path in paths:
        if mode == "whole":
            events = json.loads(path.read_text())["traceEvents"]
        elif mode == "stream":
            _, events = read_trace(path)
        elif mode == "stream-kept":
            _, events = read_trace(path, keep=read_by_the_pass)
        else:
            continue
        seen += one_pass(events)
        del events
    took = time.perf_counter() - began
    rss = peak_rss_mib()
    print(json.dumps({"mode": mode, "seconds": round(took, 2), "peak_rss_mib": round(rss, 1), "ops_seen": seen}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--collectives", type=int, default=1000, help="Per rank per step.")
    parser.add_argument("--compute", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument(
        "--mode", choices=("whole", "stream", "stream-kept", "none"), default=None, help="Read in this process (else each mode in a child)."
    )
    args = parser.parse_args(argv)
    paths = write(args.dir, args.ranks, args.collectives, args.compute, args.steps)
    if args.mode is not None:
        read(args.mode, paths)
        return
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} rank traces, {size / 2**20:.1f} MiB in all, {size / len(paths) / 2**20:.1f} MiB each")
    base = [sys.executable, "-m", "benchmarks.trace_stream", "--dir", str(args.dir), "--ranks", str(args.ranks)]
    base += ["--collectives", str(args.collectives), "--compute", str(args.compute), "--steps", str(args.steps)]
    for mode in ("none", "whole", "stream", "stream-kept"):
        subprocess.run([*base, "--mode", mode], check=True)


if __name__ == "__main__":
    main()
